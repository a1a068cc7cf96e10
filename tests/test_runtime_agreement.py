"""Ranks that agree: the first field on which ranks differ is named with both values, by one rank, before any work."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep  # noqa: E402
from pipeplan.core.plan import Plan, Stage  # noqa: E402
from pipeplan.io.plan_json import write_plan  # noqa: E402
from pipeplan.models.build import build_model  # noqa: E402
from pipeplan.models.zoo.datasets import Dataset  # noqa: E402
from pipeplan.runtime.execution.job import ScheduleLayout  # noqa: E402
from pipeplan.runtime.options import AsyncSettings  # noqa: E402
from pipeplan.runtime.training.agreement import (  # noqa: E402
    LOCAL_FIELDS,
    Disagreement,
    Record,
    config_fields,
    data_digest,
    first_disagreement,
    model_digest,
    verdict,
)
from pipeplan.runtime.training.train_config import TrainConfig  # noqa: E402
from pipeplan.runtime.transport.network import NetworkSettings  # noqa: E402
from runtime_cli import run_train  # noqa: E402

_CUDA = torch.cuda.is_available()
"""A config with --backend nccl can be made only where torch sees a CUDA device (TrainConfig refuses it elsewhere)."""

pytestmark = pytest.mark.torch

LAYOUT = ScheduleLayout("1f1b", 2, 4, 64)
BASE = TrainConfig(layout=LAYOUT, checkpoint_dir="ck", checkpoint_every=1, asynchronous=AsyncSettings(),
                   network=NetworkSettings(gb_per_s=1.0))  # fmt: skip
PLAN = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 4, 3, "1f1b")
WORDS = st.text("abcdefgh-_/.", min_size=1, max_size=12)
OPTIONS = st.dictionaries(WORDS, st.integers(0, 99), min_size=1, max_size=3).map(lambda d: tuple(sorted(d.items())))

# Per field (or a field's field), other values and the flag a message must name: the test's own table.
CHANGES: dict[tuple[str, ...], tuple[st.SearchStrategy[Any], str]] = {
    ("module",): (WORDS, "--module"),
    ("module_options",): (OPTIONS, "--opt"),
    ("dataset",): (WORDS, "--dataset"),
    ("dtype",): (st.just("float64"), "--dtype"),
    ("precision",): (st.just("bf16"), "--precision"),
    ("data",): (WORDS, "--data"),
    ("loss",): (WORDS, "--loss"),
    ("eval_fraction",): (st.floats(0.01, 0.99), "--eval-fraction"),
    ("steps",): (st.integers(1, 10**6), "--steps"),
    ("lr",): (st.floats(0, 10), "--lr"),
    ("lr_schedule",): (st.just("cosine"), "--lr-schedule"),
    ("optimizer",): (st.sampled_from(["sgd", "sgd_momentum"]), "--optimizer"),
    ("seed",): (st.integers(0, 2**32 - 1), "--seed"),
    ("epochs",): (st.integers(1, 100), "--epochs"),
    ("plan",): (st.integers(1, 64).map(lambda m: dataclasses.replace(PLAN, microbatches=m)), "--plan"),
    ("schedule",): (st.sampled_from(["gpipe", "1f1b"]).map(lambda name: _schedule(name)), "--plan"),
    ("layout", "name"): (st.sampled_from(["gpipe", "interleaved-1f1b", "zb-h1", "plan.csv"]), "--schedule"),
    ("layout", "stages"): (st.integers(1, 64), "--stages"),
    ("layout", "microbatches"): (st.integers(1, 64), "--microbatches"),
    ("layout", "global_batch"): (st.integers(1, 4096), "--batch-size"),
    ("layout", "k"): (st.integers(1, 8), "--k"),
    ("layout", "chunks"): (st.integers(1, 8), "--chunks"),
    ("layout", "replicas"): (st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple), "--replicas"),
    ("layout", "file_schedule"): (st.sampled_from(["gpipe", "1f1b"]).map(lambda name: _schedule(name)), "--schedule"),
    ("layout", "minibatches"): (st.integers(1, 99), "the pipemare run's minibatches (--steps)"),
    ("layout", "sync_minibatches"): (st.integers(1, 99), "the pipemare run's synchronous minibatches (--sync-warmup)"),
    ("asynchronous", "lr_reschedule"): (st.integers(1, 99), "--lr-reschedule"),
    ("asynchronous", "discrepancy_decay"): (st.floats(0, 0.99), "--discrepancy-decay"),
    ("asynchronous", "sync_warmup"): (st.integers(1, 10), "--sync-warmup"),
    ("asynchronous", "weight_prediction"): (st.just(True), "--weight-prediction"),
    ("network", "trace"): (WORDS, "--bandwidth-trace"),
    ("network", "trace_steps"): (
        st.floats(0.01, 1.0).map(lambda f: BandwidthTrace((TraceStep(0.0, None, f),))),
        "--bandwidth-trace",
    ),
    ("network", "gb_per_s"): (st.floats(0.001, 100), "--emulate-gb-per-s"),
    ("network", "cluster"): (WORDS, "the emulated links' cluster"),
    ("network", "cluster_value"): (
        st.sampled_from(["v100-8x1", "a100-8x2"]).map(lambda n: _cluster(n)),
        "the emulated links' cluster",
    ),
    ("profile",): (WORDS, "--profile"),
    ("cluster",): (WORDS, "--cluster"),
    ("profile_value",): (st.sampled_from(["pipedream/alexnet", "dapple/vgg-19"]).map(lambda n: _profile(n)), "--profile"),
    ("cluster_value",): (st.sampled_from(["v100-8x1", "a100-8x2"]).map(lambda n: _cluster(n)), "--cluster"),
    ("batch_scaling",): (st.sampled_from(["linear", "floor", "measured"]), "--batch-scaling"),
    ("backend",): (st.sampled_from(["gloo", "nccl"] if _CUDA else ["gloo"]), "--backend"),
    ("checkpoint_dir",): (WORDS, "--checkpoint-dir"),
    ("checkpoint_every",): (st.integers(2, 99), "--checkpoint-every"),
    ("keep_last",): (st.integers(1, 99), "--keep-last"),
    ("resume",): (st.just(True), "--resume"),
    ("timeline",): (st.just(True), "--timeline or --png"),
    ("predict",): (st.just(True), "--predict"),
    ("evaluate",): (st.just(True), "--eval"),
    ("adaptive",): (st.just(True), "--adaptive"),
    ("memory_budget_bytes",): (st.floats(1.0, 1e12), "--memory-budget"),
    ("allreduce_bucket_bytes",): (st.floats(1.0, 1e12), "--allreduce-bucket-mb"),
    ("lookahead",): (st.integers(0, 1) | st.integers(3, 9), "the lookahead"),
}
LOCAL_CHANGES: dict[str, Any] = {"plan_path": "elsewhere/plan.json", "threads": 7, "timeout_s": 9.0, "save_grads": "g",
                                 "warmup_steps": 0}  # fmt: skip


def _schedule(name: str) -> Any:
    from pipeplan.schedules import make_schedule

    return make_schedule(name, 2, 4)


def _profile(name: str) -> Any:
    from pipeplan.presets.resolve import load_profile

    return load_profile(name)


def _cluster(name: str) -> Any:
    from pipeplan.presets.resolve import load_cluster

    return load_cluster(name)


def _changed(path: tuple[str, ...], value: Any) -> tuple[TrainConfig, TrainConfig]:
    """(a base config, the same with the field at `path` set to `value`); a plan's fields change a plan's config."""
    base = dataclasses.replace(BASE, layout=None, plan=PLAN) if path[0] in ("plan", "schedule") else BASE
    if len(path) == 1:
        return base, dataclasses.replace(base, **{path[0]: value})
    inner = dataclasses.replace(getattr(base, path[0]), **{path[1]: value})
    return base, dataclasses.replace(base, **{path[0]: inner})


def test_every_field_of_a_train_config_is_compared_or_said_to_be_local() -> None:
    """TrainConfig's fields are exactly the compared ones (this test's table) and the local ones (LOCAL_FIELDS)."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert {path[0] for path in CHANGES} | set(LOCAL_FIELDS) == names
    assert not {path[0] for path in CHANGES} & set(LOCAL_FIELDS)
    assert set(LOCAL_CHANGES) == set(LOCAL_FIELDS)


@given(data=st.data())
def test_any_single_differing_field_of_a_config_is_named_with_both_values(data: st.DataObject) -> None:
    """One field changed (any compared field, any value) differs in exactly one position: its flag, both values."""
    path = data.draw(st.sampled_from(sorted(CHANGES)))
    strategy, flag = CHANGES[path]
    value = data.draw(strategy)
    base, changed = _changed(path, value)
    assume(changed != base)
    ours, theirs = config_fields(base), config_fields(changed)
    assert [a[0] for a in ours] == [b[0] for b in theirs]
    assert [a[0] for a, b in zip(ours, theirs, strict=True) if a != b] == [flag]
    found = first_disagreement([ours, theirs])
    assert found is not None
    assert (found.what, found.first, found.other) == (flag, 0, 1)
    assert found.ours == dict(ours)[flag] and found.theirs == dict(theirs)[flag] and found.ours != found.theirs
    assert found.message().startswith(f"rank 1 disagrees with rank 0 on {flag}: rank 0 has ")


def test_a_local_field_may_differ() -> None:
    """Threads, timeout, the plan's path, the gradients' folder and the report's warm-up steps are each rank's own."""
    for name, value in LOCAL_CHANGES.items():
        assert config_fields(dataclasses.replace(BASE, **{name: value})) == config_fields(BASE), name


def test_a_flag_message_names_the_flag_and_both_values() -> None:
    """The example of the issue: another --seed on rank 1."""
    found = first_disagreement([config_fields(BASE), config_fields(dataclasses.replace(BASE, seed=3))])
    assert found is not None
    assert found.message() == (
        "rank 1 disagrees with rank 0 on --seed: rank 0 has 0, rank 1 has 3; start every rank with the same options, "
        "files and pipeplan"
    )


FIELDS = st.lists(st.tuples(WORDS, WORDS), min_size=1, max_size=8, unique_by=lambda f: f[0])


@given(base=FIELDS, ranks=st.integers(2, 6), data=st.data())
def test_the_first_field_differing_anywhere_is_named_with_the_lowest_rank_differing_there(
    base: list[tuple[str, str]], ranks: int, data: st.DataObject
) -> None:
    """Ranks equal to rank 0 but for changed values at chosen positions: the earliest position, its lowest rank."""
    changes = data.draw(st.lists(st.tuples(st.integers(1, ranks - 1), st.integers(0, len(base) - 1), WORDS), max_size=6))
    per_rank = [list(base) for _ in range(ranks)]
    for rank, i, value in changes:
        per_rank[rank][i] = (base[i][0], value)
    differing = sorted((i, rank) for rank in range(1, ranks) for i in range(len(base)) if per_rank[rank][i] != base[i])
    found = first_disagreement(per_rank)
    if not differing:
        assert found is None
        return
    i, rank = differing[0]
    assert found == Disagreement(base[i][0], 0, base[i][1], rank, per_rank[rank][i][1])


def test_a_rank_with_other_or_fewer_fields_differs_where_they_part() -> None:
    """Another pipeplan's fields: a missing one is shown as (none), another name with its value."""
    ours = [("a", "1"), ("b", "2")]
    assert first_disagreement([ours, [("a", "1")]]) == Disagreement("b", 0, "2", 1, "(none)")
    assert first_disagreement([ours, [("a", "1"), ("c", "2")]]) == Disagreement("b", 0, "2", 1, "c = 2")
    assert first_disagreement([[("a", "1")], ours]) == Disagreement("field 1", 0, "(none)", 1, "b = 2")
    assert first_disagreement([ours]) is None and first_disagreement([]) is None


def test_the_options_come_before_a_build_failure_which_comes_before_the_digests() -> None:
    """A verdict names differing options first, then the lowest rank's build failure (said by it), then the digests."""
    same, other = (("--seed", "0"),), (("--seed", "3"),)
    built, built_other = (("the model", "x"),), (("the model", "y"),)
    assert verdict([Record(same, None, built), Record(same, None, built)]) is None
    assert verdict([Record(same, None, built), Record(other, "boom", ())])[0] == 0  # type: ignore[index]
    assert verdict([Record(same, None, built), Record(same, "boom", ()), Record(same, "bang", ())]) == (1, "boom")
    found = verdict([Record(same, None, built), Record(same, None, built_other)])
    assert found is not None and found[0] == 0 and "on the model: rank 0 has x, rank 1 has y" in found[1]


def test_a_long_value_is_shown_by_its_start_and_a_digest() -> None:
    """Values beyond 80 characters are cut, with a digest of the whole so that two long values still read apart."""
    line = Disagreement("--opt", 0, "a" * 100, 1, "a" * 99 + "b").message()
    assert line.count("a" * 60 + "... (sha256 ") == 2 and len(line) < 300


def test_the_model_digest_follows_the_initial_values_exactly() -> None:
    """The same seed gives the same digest; another seed, dtype or width another."""

    def mlp(hidden: int = 8, dtype: str = "float32", seed: int = 0) -> tuple[Any, ...]:
        return build_model("mlp", {"hidden": hidden, "blocks": 3}, "digits", dtype, seed).layers

    digest = model_digest(mlp())
    assert digest == model_digest(mlp())
    values = sum(p.numel() for layer in mlp() for p in layer.parameters())
    assert digest.startswith(f"4 layers, 8 tensors, {values:,} values (sha256 ")  # 3 blocks and the head: weight, bias
    for other in (mlp(seed=1), mlp(dtype="float64"), mlp(hidden=9)):
        assert model_digest(other) != digest
    layers = mlp()
    with torch.no_grad():
        next(layers[-1].parameters()).view(-1)[-1] += 1e-3  # one value of the head
    assert model_digest(layers) != digest


def test_the_data_digest_follows_the_first_samples_and_the_sizes() -> None:
    """One changed input value among the first samples, or one sample more, changes the digest."""
    inputs, targets = torch.arange(600.0).reshape(300, 2), torch.arange(300) % 3
    digest = data_digest(Dataset("d", inputs, targets))
    assert digest == data_digest(Dataset("d", inputs.clone(), targets.clone()))
    changed = inputs.clone()
    changed[255, 1] += 0.5
    assert data_digest(Dataset("d", changed, targets)) != digest
    assert data_digest(Dataset("d", inputs[:299], targets[:299])) != digest
    assert data_digest(Dataset("e", inputs, targets)) != digest


# ---- ranks started by hand, as torchrun starts them (one process each, RANK and WORLD_SIZE in the environment)

TINY = ["--opt", "hidden=8", "--opt", "blocks=3", "--steps", "1", "--no-predict", "-q", "--timeout", "3000"]
BOUND_S = 240
"""Far below the job's --timeout: a rank that waits for a peer fails the test instead of timing out in gloo."""
MODULE = '''"""A model whose initial weights follow a constant of this file."""
import torch
from torch import nn

SEED = {seed}


def build(in_features: int = 64, hidden: int = 8) -> nn.Sequential:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
'''


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_ranks(
    args: list[list[str]], folders: list[Path], paths: list[str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """`pipeplan train ARGS[r]` as rank r of 2 in folder r (PYTHONPATH gains paths[r]), as torchrun would start them."""
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        python_path = os.pathsep.join(p for p in ((paths or ["", ""])[rank], os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1", PYTHONPATH=python_path)  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-m", "pipeplan", "train", *args[rank]], cwd=folders[rank], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def snapshot(folders: list[Path]) -> list[list[str]]:
    """Every path under the folders, sorted (to show that a refused job wrote nothing)."""
    return [sorted(str(p.relative_to(f)) for p in f.rglob("*")) for f in folders]


def assert_refused_once(done: list[subprocess.CompletedProcess[str]], line: str) -> None:
    """Both ranks exit 2; rank 0 prints exactly `line` (as `error: TrainConfigError: ...`), rank 1 nothing."""
    assert [d.returncode for d in done] == [2, 2], [d.stderr for d in done]
    assert done[0].stderr.splitlines() == [f"error: TrainConfigError: {line}"], done[0].stderr
    assert done[1].stderr == "" and done[0].stdout == "" and done[1].stdout == ""


def _folders(tmp_path: Path) -> list[Path]:
    folders = [tmp_path / "node0", tmp_path / "node1"]
    for folder in folders:
        folder.mkdir()
    return folders


WAY_OUT = "; start every rank with the same options, files and pipeplan"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ours", "theirs", "named"),
    [
        (["--seed", "0"], ["--seed", "3"], "--seed: rank 0 has 0, rank 1 has 3"),
        (["--steps", "1"], ["--steps", "2"], "--steps: rank 0 has 1, rank 1 has 2"),
        (["-m", "4"], ["-m", "2"], "--microbatches: rank 0 has 4, rank 1 has 2"),
        (["--lr", "0.05"], ["--lr", "0.1"], "--lr: rank 0 has 0.05, rank 1 has 0.1"),
        (
            ["--opt", "seed=1"],
            ["--opt", "seed=2"],
            "--opt: rank 0 has blocks=3, hidden=8, seed=1, rank 1 has blocks=3, hidden=8, seed=2",
        ),
        (["--optimizer", "adam"], ["--optimizer", "sgd"], "--optimizer: rank 0 has adam, rank 1 has sgd"),
    ],
)
def test_ranks_started_with_one_differing_flag_stop_with_one_line_naming_it(
    tmp_path: Path, ours: list[str], theirs: list[str], named: str
) -> None:
    """Rank 1 given another value of one flag: rank 0 names the flag and both values, both exit 2, nothing is written."""
    folders = _folders(tmp_path)
    common = ["--schedule", "1f1b", *TINY]
    done = two_ranks([[*common, *ours], [*common, *theirs]], folders)
    assert_refused_once(done, f"rank 1 disagrees with rank 0 on {named}{WAY_OUT}")
    assert snapshot(folders) == [[], []]


@pytest.mark.slow
def test_ranks_given_plans_that_differ_in_content_stop_naming_the_plan(tmp_path: Path) -> None:
    """Each rank's plan.json (same name, own folder) splits the batch into other microbatches: --plan is named."""
    folders = _folders(tmp_path)
    write_plan(PLAN, folders[0] / "plan.json", "mlp", "local")
    write_plan(dataclasses.replace(PLAN, microbatches=2, microbatch_size=6), folders[1] / "plan.json", "mlp", "local")
    before = snapshot(folders)
    done = two_ranks([["--plan", "plan.json", *TINY]] * 2, folders)
    assert [d.returncode for d in done] == [2, 2]
    *notes, line = done[0].stderr.splitlines()  # the plan's profile is not a file here: a note says no step is predicted
    assert all(note.startswith("note: ") for note in notes)
    assert line.startswith(
        "error: TrainConfigError: rank 1 disagrees with rank 0 on --plan: rank 0 has 1f1b, 2 stages, 4 microbatches, "
        "global batch 12 (sha256 "
    )
    assert ", rank 1 has 1f1b, 2 stages, 2 microbatches, global batch 12 (sha256 " in line
    assert "error" not in done[1].stderr
    assert snapshot(folders) == before


@pytest.mark.slow
def test_ranks_whose_model_files_differ_stop_naming_the_models_initial_parameters(tmp_path: Path) -> None:
    """Same flags, but each rank imports its own copy of the model's file, whose weights differ: the model is named."""
    folders = _folders(tmp_path)
    code = [tmp_path / "code0", tmp_path / "code1"]
    for seed, folder in enumerate(code):
        folder.mkdir()
        (folder / "agreemod.py").write_text(MODULE.format(seed=seed))
    args = ["--schedule", "1f1b", "--module", "agreemod:build", "--dataset", "digits", "--steps", "1", "--no-predict", "-q"]
    done = two_ranks([args, args], folders, [str(c) for c in code])
    assert [d.returncode for d in done] == [2, 2], [d.stderr for d in done]
    (line,) = done[0].stderr.splitlines()
    assert line.startswith(
        "error: TrainConfigError: rank 1 disagrees with rank 0 on the model's initial parameters (--module agreemod:build): "
        "rank 0 has 4 layers, 6 tensors, 682 values (sha256 "  # its three layers and the head; 64x8+8 + 8x8+8 + 8x10+10
    )
    assert done[1].stderr == ""
    assert snapshot(folders) == [[], []]


@pytest.mark.slow
def test_ranks_that_would_resume_different_checkpoints_stop_naming_the_checkpoint(tmp_path: Path) -> None:
    """--resume --checkpoint-dir ck on two machines, one holding a checkpoint after step 1 and one none."""
    folders = _folders(tmp_path)
    made = run_train(["--local", "2", "--schedule", "1f1b", *TINY, "--checkpoint-dir", str(folders[0] / "ck"),
                      "--checkpoint-every", "1"])  # fmt: skip
    assert made.returncode == 0, made.stderr
    before = snapshot(folders)
    args = ["--schedule", "1f1b", *TINY[:4], "--steps", "2", *TINY[6:], "--checkpoint-dir", "ck", "--resume"]
    done = two_ranks([args, args], folders)
    assert [d.returncode for d in done] == [2, 2], [d.stderr for d in done]
    assert done[0].stderr.splitlines()[-1] == (
        "error: TrainConfigError: rank 1 disagrees with rank 0 on the checkpoint to resume (--checkpoint-dir, --resume): "
        f"rank 0 has step 1, rank 1 has none (no complete checkpoint){WAY_OUT}"
    )
    assert "error" not in done[1].stderr
    assert snapshot(folders) == before


@pytest.mark.slow
def test_ranks_that_agree_train_as_before(tmp_path: Path) -> None:
    """The same flags on both ranks: the job trains its step and exits 0 on both, rank 0 printing the result."""
    folders = _folders(tmp_path)
    args = ["--schedule", "1f1b", *TINY, "--json"]
    done = two_ranks([args, args], folders)
    assert [d.returncode for d in done] == [0, 0], [d.stderr for d in done]
    assert '"losses"' in done[0].stdout and done[1].stdout == ""


def test_a_record_travels_as_json_and_one_that_does_not_read_back_differs() -> None:
    """A record reads back as itself; bytes that are not a record (cut, not JSON, wrong shapes) read as `unreadable`."""
    import json

    from pipeplan.runtime.training.agreement import _record

    mine = Record(config_fields(BASE), None, (("the data", "d: 1 samples"),))
    data = json.dumps(dataclasses.asdict(mine)).encode()
    assert _record(data) == mine
    for bad in (data[:-1], b"\x80abc", b"[]", b'{"config": 1, "built": [], "failure": null}',
                b'{"config": [["a"]], "built": [], "failure": null}', b'{"config": [], "built": [], "failure": 3}'):  # fmt: skip
        found = _record(bad)
        assert found.config == (("the agreement record", f"unreadable ({len(bad):,} bytes)"),)
        assert verdict([mine, found]) is not None


def test_agree_on_one_rank_returns_the_model_or_raises_the_builds_own_error() -> None:
    """One process agrees with itself: the model it built comes back; a failed build is raised as it was."""
    import torch.distributed as dist

    from pipeplan.runtime.training.agreement import agree

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        model = build_model("mlp", {"hidden": 8, "blocks": 3}, "digits", "float32", 0)
        assert agree(BASE, lambda: model, 0, 1) is model
        boom = ValueError("the user's factory failed")

        def fail() -> Any:
            raise boom

        with pytest.raises(ValueError) as caught:
            agree(BASE, fail, 0, 1)
        assert caught.value is boom
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_model_no_rank_can_build_is_refused_by_each_process_before_the_group_forms(tmp_path: Path) -> None:
    """The same bad --opt on both ranks: each process refuses it as its first check, before it joins the group (no
    peer to defer to yet, so each says its one line; `--local` says it once, in the launcher), and exits 2."""
    folders = _folders(tmp_path)
    args = ["--schedule", "1f1b", *TINY, "--opt", "bogus=1"]
    done = two_ranks([args, args], folders)
    assert [d.returncode for d in done] == [2, 2], [d.stderr for d in done]
    line = "error: ProfileError: MODULE_SPEC 'mlp' has no option 'bogus'; options: hidden, blocks, in_features, seed"
    assert done[0].stderr.splitlines() == [line] and done[1].stderr.splitlines() == [line]
    assert snapshot(folders) == [[], []]


@pytest.mark.slow
def test_two_torchrun_nodes_started_with_another_seed_stop_with_one_line(tmp_path: Path) -> None:
    """Under torchrun itself (two agents, one node each): one `error:` line in all, naming --seed; the workers exit 2."""
    port = str(free_port())
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", port]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    agents = []
    for rank, seed in ((0, "0"), (1, "3")):
        argv = [*torchrun, "--node-rank", str(rank), "-m", "pipeplan", "train", "--schedule", "1f1b", *TINY, "--seed", seed]
        agents.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        done = [agent.communicate(timeout=BOUND_S) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    errors = [line for _, err in done for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: TrainConfigError: rank 1 disagrees with rank 0 on --seed: rank 0 has 0, rank 1 has 3{WAY_OUT}"]
    assert all(agent.returncode != 0 for agent in agents)
    assert all("exitcode  : 2" in err for _, err in done)  # torchrun's own report of its worker
    assert list(tmp_path.iterdir()) == []


def test_sharing_names_each_tied_parameter_and_its_layers() -> None:
    """A model whose head's weight is its embedding's: named with layers 0 and 2; the same weights untied: none."""
    from pipeplan.runtime.training.agreement import sharing

    embed, head = torch.nn.Embedding(4, 3), torch.nn.Linear(3, 4, bias=False)
    untied = sharing([embed, torch.nn.Linear(3, 3), head], ["embed", "mid", "head"])
    head.weight = embed.weight
    assert sharing([embed, torch.nn.Linear(3, 3), head], ["embed", "mid", "head"]) == "embed.weight in layers [0, 2]"
    assert untied == "none"
