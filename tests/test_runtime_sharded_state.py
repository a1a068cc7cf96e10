"""Optimizer state sharded over a stage's data-parallel group (runtime.execution.sharded_state, a plan's zero 1) over
4 gloo processes in float64: the losses, clipped global norms, final state_dict and gathered optimizer state equal a
plain one-process torch loop's to 1e-9, for SGD with momentum and Adam, on one stage of 4 replicas, on a stage of 3
replicas beside an unreplicated one, and on 2 replicas of a tensor-parallel (tp 2) stage; each process holds only its
slice of the state; `train --plan` with zero 1 trains as the plain loop; what stays refused is one line."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from plain_loops import charlm_losses  # noqa: E402
from runtime_cli import run_train  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 1e-9
STEPS, BATCH, MAX_NORM, LR = 3, 8, 0.3, 0.05
OPTIMIZERS = {"sgd_momentum": ("SGD", {"lr": LR, "momentum": 0.9}), "adam": ("Adam", {"lr": LR})}
CASES = {
    "dp4": ("mlp", [[0, 4, [0, 1, 2, 3], 1]]),
    "dp3_then_1": ("mlp", [[0, 2, [0, 1, 2], 1], [3, 4, [3], 1]]),
    "dp2_of_tp2": ("charlm", [[0, 3, [0, 1, 2, 3], 2]]),
}
"""Each case's model and its plan's stages: (first layer, last layer, devices, tp); every plan has zero 1."""

MODEL = """
import torch
from torch import nn
from pipeplan.models.zoo.charlm import charlm, next_char_cross_entropy

def build(kind):
    torch.manual_seed(11)
    if kind == "charlm":
        spec = charlm(d_model=16, heads=4, layers=2, seq_len=8, dropout=0.0, seed=5)
        return torch.nn.Sequential(*spec.layers).double(), next_char_cross_entropy
    layers = [nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3)]
    return nn.Sequential(*layers).double(), nn.functional.cross_entropy

def batches(kind):
    generator = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        if kind == "charlm":
            yield (torch.randint(0, 96, (BATCH, 8), generator=generator),
                   torch.randint(0, 96, (BATCH, 8), generator=generator))
        else:
            yield (torch.randn(BATCH, 6, generator=generator, dtype=torch.float64),
                   torch.randint(0, 3, (BATCH,), generator=generator))
"""

SCRIPT = """
import json, sys
import torch
import pipeplan
from pipeplan.core.plan import Plan, Stage

out = {}
for case, (kind, stages) in json.loads(sys.argv[1]).items():
    for name, (cls, options) in OPTIMIZERS.items():
        for zero in (0, 1):
            model, loss_fn = build(kind)
            plan = Plan(tuple(Stage(a, b, tuple(d), tp) for a, b, d, tp in stages), 1, 2, BATCH // 2, "1f1b", zero=zero)
            pipe = pipeplan.distribute(model, plan, loss_fn)
            optimizer = pipe.optimizer(getattr(torch.optim, cls), **options)
            log = []
            for inputs, targets in batches(kind):
                optimizer.zero_grad()
                loss = pipe.step(inputs, targets)
                norm = pipe.clip_grad_norm_(MAX_NORM)
                optimizer.step()
                log.append([loss, norm])
            state = pipe.state_dict()
            whole = optimizer.state_dict()  # gathered: a collective
            local = lambda t: t.to_local() if hasattr(t, "to_local") else t
            held = {key: sum(local(s[key]).numel() for s in optimizer.state.values())
                    for key in ("exp_avg", "exp_avg_sq", "momentum_buffer")
                    if any(key in s for s in optimizer.state.values())}
            names = {id(p): n for n, p in model.named_parameters()}
            params = optimizer.param_groups[0]["params"]
            mine = {names[id(p)]: {k: v for k, v in whole["state"][i].items() if k != "step"}
                    for i, p in enumerate(params) if id(p) in names}
            if zero and pipe.rank in (0, 3):
                torch.save({"state": state, "optimizer": mine}, f"{case}-{name}-{pipe.rank}.pt")
            out[f"{case}/{name}/{zero}"] = {"log": log, "held": held, "sharded": type(optimizer).__name__,
                                            "trained": sum(local(p).numel() for p in pipe.parameters())}
json.dump(out, open(f"rank-{pipe.rank}.json", "w"))
"""

CONSTANTS = f"STEPS, BATCH, MAX_NORM, LR = {STEPS}, {BATCH}, {MAX_NORM}, {LR}\nOPTIMIZERS = {OPTIMIZERS!r}\n"


def _plain(kind: str, name: str) -> tuple[nn.Module, list[list[float]], dict[str, dict[str, torch.Tensor]]]:
    """The same training as a plain torch loop over the whole model in this process: the model, its losses and
    norms, and each parameter's optimizer state (by name)."""
    space: dict[str, object] = {}
    exec(CONSTANTS + MODEL, space)  # the test's own model code, shared with the workers
    model, loss_fn = space["build"](kind)  # type: ignore[operator]
    cls, options = OPTIMIZERS[name]
    optimizer = getattr(torch.optim, cls)(model.parameters(), **options)
    log = []
    for inputs, targets in space["batches"](kind):  # type: ignore[operator]
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        log.append([float(loss.detach()), float(norm)])
    state = {n: {k: v for k, v in optimizer.state[p].items() if k != "step"} for n, p in model.named_parameters()}
    return model, log, state


@pytest.mark.slow
def test_sharded_optimizer_state_trains_as_the_plain_loop_and_holds_one_slice_per_process(tmp_path: Path) -> None:
    """zero 1 on 4 processes (4 replicas; 3 replicas and 1; 2 replicas of tp 2), SGD with momentum and Adam: the
    losses and clipped norms of 3 steps, the final state_dict and the gathered optimizer state equal the plain loop's
    to 1e-9, and each replicated process holds ceil(n / d) or fewer elements of each state tensor (n its trained
    elements, d its stage's replicas), d of them adding up to n; zero 0 holds n."""
    from pipeplan.runtime.training.launch import launch_local

    script = tmp_path / "script.py"
    script.write_text(CONSTANTS + MODEL + SCRIPT)
    code = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    assert launch_local(4, code, [json.dumps(CASES)], cwd=str(tmp_path), timeout_s=900) == 0
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    replicas = {"dp4": [4, 4, 4, 4], "dp3_then_1": [3, 3, 3, 1], "dp2_of_tp2": [2, 2, 2, 2]}
    for case, (kind, _) in CASES.items():
        for name in OPTIMIZERS:
            model, want, want_state = _plain(kind, name)
            assert any(norm > MAX_NORM for _, norm in want)  # the clipping acts
            keys = ("exp_avg", "exp_avg_sq") if name == "adam" else ("momentum_buffer",)
            for zero in (0, 1):
                for r, rank in enumerate(ranks):
                    got = rank[f"{case}/{name}/{zero}"]
                    for (loss, norm), (want_loss, want_norm) in zip(got["log"], want, strict=True):
                        assert abs(loss - want_loss) <= TOLERANCE and abs(norm - want_norm) <= TOLERANCE, (case, got, want)
                    d, n = replicas[case][r], got["trained"]
                    assert got["sharded"] == ("ShardedOptimizer" if zero and d > 1 else type_name(name))
                    assert set(got["held"]) == set(keys)
                    for key in keys:
                        assert got["held"][key] == (n if not zero or d == 1 else _slice(n, d, r % d)), (case, r, got)
            for r in (0, 3):
                saved = torch.load(tmp_path / f"{case}-{name}-{r}.pt")
                assert list(saved["state"]) == list(model.state_dict())
                for key, value in model.state_dict().items():
                    assert torch.allclose(saved["state"][key], value, rtol=0, atol=TOLERANCE), (case, name, key)
                if case != "dp2_of_tp2":  # a tensor-parallel weight's state is its local shard's
                    assert saved["optimizer"]
                    for param, entries in saved["optimizer"].items():
                        for key, value in entries.items():
                            assert torch.allclose(value, want_state[param][key], rtol=0, atol=TOLERANCE), (case, param)


ZERO2 = """
import json, sys
import torch
import pipeplan
from pipeplan.core.plan import Plan, Stage

out = {}
for case, (kind, stages) in json.loads(sys.argv[1]).items():
    model, loss_fn = build(kind)
    plan = Plan(tuple(Stage(a, b, tuple(d), tp) for a, b, d, tp in stages), 1, 2, BATCH // 2, "1f1b", zero=2)
    pipe = pipeplan.distribute(model, plan, loss_fn)
    optimizer = pipe.optimizer(torch.optim.Adam, lr=LR)
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t
    losses, whole_grads = [], []
    for inputs, targets in batches(kind):
        optimizer.zero_grad()
        losses.append(pipe.step(inputs, targets))
        whole_grads.append(sum(local(p.grad).numel() for p in pipe.parameters() if p.grad is not None))
        optimizer.step()
    left = sum(local(p.grad).numel() for p in pipe.parameters() if p.grad is not None)
    held = {key: sum(local(s[key]).numel() for s in optimizer.state.values()) for key in ("exp_avg", "exp_avg_sq")}
    out[case] = {"losses": losses, "whole_grads": whole_grads, "left": left, "held": held,
                 "grad_held": getattr(optimizer, "grad_held", None),
                 "trained": sum(local(p).numel() for p in pipe.parameters())}
json.dump(out, open(f"zero2-{pipe.rank}.json", "w"))
"""


def _plain_losses(kind: str) -> list[float]:
    """The plain one-process torch loop's losses with Adam and no clipping (the test's own model code)."""
    space: dict[str, object] = {}
    exec(CONSTANTS + MODEL, space)
    model, loss_fn = space["build"](kind)  # type: ignore[operator]
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for inputs, targets in space["batches"](kind):  # type: ignore[operator]
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.slow
def test_sharded_gradients_train_as_the_plain_loop_and_hold_one_slice_per_process(tmp_path: Path) -> None:
    """zero 2 through pipeplan.distribute on 4 gloo processes (3 replicas and 1; 2 replicas of tp 2), Adam, float64:
    the 3 losses equal the plain loop's to 1e-12 relative; after the pipeline's step each process holds its whole
    (unsummed) gradient, after the optimizer's step none; at the update a replicated process held ceil(n / d) or
    fewer gradient elements and as many of each Adam moment (its slice: the model's (1/d) x gradients + state); an
    unreplicated one n of each."""
    from pipeplan.runtime.training.launch import launch_local

    cases = {k: CASES[k] for k in ("dp3_then_1", "dp2_of_tp2")}
    script = tmp_path / "zero2.py"
    script.write_text(CONSTANTS + MODEL + ZERO2)
    code = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    assert launch_local(4, code, [json.dumps(cases)], cwd=str(tmp_path), timeout_s=900) == 0
    ranks = [json.loads((tmp_path / f"zero2-{r}.json").read_text()) for r in range(4)]
    replicas = {"dp3_then_1": [3, 3, 3, 1], "dp2_of_tp2": [2, 2, 2, 2]}
    for case, (kind, _) in cases.items():
        want = _plain_losses(kind)
        for r, rank in enumerate(ranks):
            got, d = rank[case], replicas[case][r]
            assert all(abs(a - b) <= 1e-12 * abs(b) for a, b in zip(got["losses"], want, strict=True)), (case, got, want)
            n = got["trained"]
            assert got["whole_grads"] == [n] * STEPS and got["left"] == (0 if d > 1 else n), (case, r, got)
            mine = n if d == 1 else _slice(n, d, r % d)
            assert got["held"] == {"exp_avg": mine, "exp_avg_sq": mine}, (case, r, got)
            assert got["grad_held"] == (mine if d > 1 else None), (case, r, got)


def type_name(name: str) -> str:
    """The torch optimizer class of OPTIMIZERS' `name`."""
    return OPTIMIZERS[name][0]


def _slice(total: int, size: int, index: int) -> int:
    """Elements of slice `index` of `total` cut into `size` slices of ceil(total / size)."""
    chunk = math.ceil(total / size)
    return max(0, min(total, (index + 1) * chunk) - min(total, index * chunk))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=5), st.integers(1, 8))
def test_slices_cover_every_element_once(sizes: list[int], d: int) -> None:
    """A bucket's d slices of parameters of any sizes: in order, each at most ceil(n / d) long, their pieces
    together [0, n) once (n the parameters' elements)."""
    from pipeplan.runtime.execution.sharded_state import bucket

    params = [torch.zeros(n, dtype=torch.float64) for n in sizes]
    total = sum(sizes)
    cuts = [bucket(params, i, d) for i in range(d)]
    assert cuts[0].lo == 0 and cuts[-1].hi == total
    assert all(a.hi == b.lo for a, b in itertools.pairwise(cuts))
    assert all(c.hi - c.lo <= math.ceil(total / d) and c.shard.numel() == c.hi - c.lo for c in cuts)
    covered = []
    for c in cuts:
        for p, at, start, n in c.pieces():
            first = sum(sizes[: next(i for i, q in enumerate(params) if q is p)])
            assert c.lo + start == first + at
            covered.extend(range(first + at, first + at + n))
    assert covered == list(range(total))


def test_an_optimizer_whose_state_does_not_shard_by_element_is_refused_in_one_line() -> None:
    """LBFGS (its state is whole-vector: its history) under zero 1: one PlanError naming it and the way out; SGD,
    Adam and AdamW pass."""
    from pipeplan.core.errors import PlanError
    from pipeplan.runtime.execution.sharded_state import check_elementwise

    for kind in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        check_elementwise(kind)
    message = (r"^plan zero 1 shards optimizer state by element: LBFGS is not one of torch.optim.SGD, "
               r"torch.optim.Adam, torch.optim.AdamW; use one of them, or a plan with zero 0$")  # fmt: skip
    with pytest.raises(PlanError, match=message):
        check_elementwise(torch.optim.LBFGS)


OPTIONS = {"d_model": 16, "heads": 4, "layers": 2, "seq_len": 8}
"""charlm's options in train's runs (its own dataset: pysource)."""


def _plan_file(tmp_path: Path, zero: int, tp: int = 1) -> str:
    """charlm's 4 layers, zero `zero`: tp 1: embedding and block 0 on 2 replicas, the rest on one (3 processes);
    tp 2: every layer on 2 replicas of a TP group of 2 (4 processes)."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.plan_json import write_plan

    stages = (Stage(0, 1, (0, 1)), Stage(2, 3, (2,))) if tp == 1 else (Stage(0, 3, (0, 1, 2, 3), tp=tp),)
    plan = Plan(stages, 1, 4, 2, "1f1b", zero=zero)
    path = tmp_path / f"plan-{zero}-{tp}.json"
    write_plan(plan, path, "charlm", "local")
    return str(path)


def _train_args(plan: str, *extra: str, local: int = 3) -> list[str]:
    """train's flags for charlm (OPTIONS) in float64 with Adam, 3 steps, on `local` local processes."""
    opts = [x for key, value in OPTIONS.items() for x in ("--opt", f"{key}={value}")]
    return ["--local", str(local), "--plan", plan, "--module", "charlm", *opts, "--dtype", "float64", "--optimizer", "adam",
            "--lr", str(LR), "--steps", "3", "--no-predict", *extra]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("zero", "tp"), [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_train_runs_a_sharded_plan_as_the_plain_loop(tmp_path: Path, zero: int, tp: int) -> None:
    """`train --plan` with zero 1 and zero 2 (Adam, float64): a stage of 2 replicas beside one of 1 on `--local 3`,
    and 2 replicas of a tp 2 stage on `--local 4`: its 3 losses equal a plain torch loop's on the same batches to
    1e-12 relative (zero 2: the gradients reduce-scattered in the optimizer's step instead of all-reduced)."""
    done = run_train([*_train_args(_plan_file(tmp_path, zero, tp), local=3 if tp == 1 else 4), "--json"], timeout=600)
    assert done.returncode == 0, done.stderr
    losses = json.loads(done.stdout)["losses"]
    want = charlm_losses(OPTIONS, lambda params: torch.optim.Adam(params, lr=LR))
    assert len(losses) == 3 and all(abs(a - b) <= 1e-12 * abs(b) for a, b in zip(losses, want, strict=True)), (losses, want)


@pytest.mark.slow
def test_a_checkpoint_of_a_zero_1_run_resumes_as_the_run_goes_on(tmp_path: Path) -> None:
    """`train --plan` with zero 1 (Adam, 2 replicas of stage 0): 2 steps checkpointed, then resumed to 4, give the
    last 2 losses of 4 steps run straight (to 1e-12): each process's checkpoint holds its stages' optimizer state
    gathered whole (shaped as the parameters), and loads its slice back."""
    plan = _plan_file(tmp_path, 1)
    straight = run_train([*_train_args(plan), "--steps", "4", "--json"], timeout=600)
    assert straight.returncode == 0, straight.stderr
    folder = str(tmp_path / "ckpt")
    first = run_train([*_train_args(plan), "--steps", "2", "--checkpoint-dir", folder, "--checkpoint-every", "2"], timeout=600)
    assert first.returncode == 0, first.stderr
    from pipeplan.runtime.state.checkpoint import rank_file

    saved = torch.load(rank_file(tmp_path / "ckpt", 2, 0), weights_only=False)
    stage = saved["stages"][0]
    assert [tuple(s["exp_avg"].shape) for _, s in sorted(saved["optimizer"]["state"].items())] == [
        tuple(t.shape) for t in stage.values()
    ]
    resumed = run_train([*_train_args(plan), "--steps", "4", "--checkpoint-dir", folder, "--resume", "--json"], timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    want, got = json.loads(straight.stdout)["losses"], json.loads(resumed.stdout)["losses"]
    assert len(got) == 2 and all(abs(a - b) <= 1e-12 for a, b in zip(got, want[2:], strict=True)), (got, want)


def test_what_the_runtime_does_not_run_of_sharding_is_refused_in_one_line() -> None:
    """zero 1 on an asynchronous schedule: one PlanError from the runtime's plan check, naming the field and the way
    out; pipeplan.distribute raises it before joining any process group; zero 1 and 2 on 1f1b pass."""
    import pipeplan
    from pipeplan.core.errors import PlanError
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.runtime.options import check_tensor_parallel_plan

    stages = (Stage(0, 2, (0, 1)), Stage(3, 4, (2,)))
    with pytest.raises(PlanError, match=r"^plan zero 1 and schedule 'pipemare': the runtime shards optimizer state on "
                       r"a synchronous schedule; give the plan 1f1b, gpipe or kfkb, or zero 0$"):  # fmt: skip
        check_tensor_parallel_plan(Plan(stages, 1, 2, 2, "pipemare", zero=1), PlanError)
    check_tensor_parallel_plan(Plan(stages, 1, 2, 2, "1f1b", zero=1), PlanError)
    check_tensor_parallel_plan(Plan(stages, 1, 2, 2, "1f1b", zero=2), PlanError)
    model = nn.Sequential(nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3))
    with pytest.raises(PlanError, match=r"^plan zero 2 and schedule 'pipemare'"):
        check_tensor_parallel_plan(Plan(stages, 1, 2, 2, "pipemare", zero=2), PlanError)
    with pytest.raises(PlanError, match=r"^plan schedule 'pipemare' steps inside its schedule"):  # distribute's first check
        pipeplan.distribute(model, Plan(stages, 1, 2, 2, "pipemare", zero=2), nn.functional.cross_entropy)


def test_a_sharded_optimizer_refuses_a_second_parameter_group() -> None:
    """add_param_group after construction (its slices are cut then): one PlanError; the one group holds every
    parameter, with the inner optimizer's settings; its state is its slice's (empty before a step)."""
    from pipeplan.core.errors import PlanError
    from pipeplan.runtime.execution.sharded_state import ShardedOptimizer

    params = [nn.Parameter(torch.zeros(5, dtype=torch.float64)), nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    optimizer = ShardedOptimizer(lambda ps: torch.optim.Adam(ps, lr=0.25), params, None, 1, 2)
    assert [len(g["params"]) for g in optimizer.param_groups] == [2] and optimizer.param_groups[0]["lr"] == 0.25
    assert [(b.lo, b.hi, b.shard.numel()) for b in optimizer.buckets] == [(4, 8, 0)] and not optimizer.state
    assert optimizer.grad_held == 0 and not optimizer.reduce  # no step yet; zero 1
    with pytest.raises(PlanError, match=r"^a sharded optimizer holds one parameter group"):
        optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(2, dtype=torch.float64))]})
