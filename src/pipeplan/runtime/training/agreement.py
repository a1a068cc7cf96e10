"""Ranks that agree: before any training work, every process shows its peers what it will run, and a difference
stops the job with one line.

Every rank of a job is started with its own command line (torchrun starts one per node) and reads its own files.
A rank given another `--seed` trained on other samples' labels and exited 0; another `--steps` or `-m` ended in a
transport timeout. So, right after joining the process group, each rank sends one record to all (`exchange`: JSON
of about 1.3 KB): the options that must agree (`config_fields`), whether it could build the model, and digests of
what it built (`built_fields`: the layers' initial values, the data, the checkpoint it resumes). `verdict` compares
the records, a pure function: the first field on which any rank differs from rank 0 is named with both values, by
rank 0 alone; the other ranks stop without a word (`PeerRefused`), all with exit 2. With two ranks on a shared
2-core machine the check took 5 ms for a 754-parameter MLP and 0.5 s for 50.7 million parameters (hashing 200 MB).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pipeplan.core.errors import PipeplanError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.profile import ModelProfile
from pipeplan.models.build import Model
from pipeplan.models.parameter_sharing import shared_parameters
from pipeplan.models.zoo.datasets import Dataset
from pipeplan.runtime.execution.job import ScheduleLayout
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.training.train_config import TrainConfig
from pipeplan.runtime.transport.exchange import all_gather_json
from pipeplan.runtime.transport.network import NetworkSettings

Field = tuple[str, str]
"""(what, value): what a rank's field is called in a message (its flag), and its value as shown."""

LOCAL_FIELDS = {
    "plan_path": "the plan's content is compared (--plan), wherever each rank's copy lies",
    "threads": "each process's own CPU threads; the results do not depend on them",
    "timeout_s": "how long each process waits for a peer",
    "save_grads": "each process writes its own file into its own folder",
    "warmup_steps": "only process 0's report uses it",
}
"""TrainConfig fields that may differ between ranks, and why; every other field is compared (config_fields), a file
(--profile, --cluster, a schedule or bandwidth trace) by its content (as the launcher read it: TrainConfig.loaded),
as the paths may differ between machines."""
DATA_SAMPLES = 256
"""The first samples of the training split whose bytes the data's digest covers (with the sizes of both splits)."""
SHOWN_CHARS = 80
RECORD_BYTES = 1 << 20
"""The most bytes of one rank's record that are read (a record is about 1.3 KB)."""


@dataclass(frozen=True, slots=True)
class Record:
    """What one rank sends: its options, the first line of its build failure (if any), digests of what it built."""

    config: tuple[Field, ...]
    failure: str | None = None
    built: tuple[Field, ...] = ()


@dataclass(frozen=True, slots=True)
class Disagreement:
    """Rank `other` has `theirs` where rank `first` has `ours`, on field `what`."""

    what: str
    first: int
    ours: str
    other: int
    theirs: str

    def message(self) -> str:
        """The one line: the field, both ranks and values, and the way out."""
        return (
            f"rank {self.other} disagrees with rank {self.first} on {self.what}: rank {self.first} has {_shown(self.ours)}, "
            f"rank {self.other} has {_shown(self.theirs)}; start every rank with the same options, files and pipeplan"
        )


class PeerRefused(TrainConfigError):
    """This rank stops because another rank refused the job and says why: the job prints one line, not one a rank."""

    silent = True


def first_disagreement(per_rank: Sequence[Sequence[Field]]) -> Disagreement | None:
    """The first field (in rank 0's order) on which some rank differs from rank 0, with the lowest such rank.

    A rank with fewer fields, or another name at a position (another pipeplan), differs there: its value is shown as
    `(none)` or as `name = value`.
    """
    if not per_rank:
        return None
    ours = per_rank[0]
    for i in range(max(len(fields) for fields in per_rank)):
        what, value = ours[i] if i < len(ours) else ("field " + str(i), "(none)")
        for other, fields in enumerate(per_rank[1:], start=1):
            theirs = fields[i] if i < len(fields) else None
            if theirs == (what, value):
                continue
            shown = "(none)" if theirs is None else theirs[1] if theirs[0] == what else f"{theirs[0]} = {theirs[1]}"
            return Disagreement(what, 0, value, other, shown)
    return None


def verdict(records: Sequence[Record]) -> tuple[int, str] | None:
    """(the rank that reports, its one line) when the job must stop, None when every rank agrees.

    The options come first: a rank that could not build the model because of its own options is named by the option.
    Then a build failure, reported by the lowest failing rank in its own words; then the digests of what was built.
    """
    differs = first_disagreement([r.config for r in records])
    if differs is not None:
        return 0, differs.message()
    failed = next((rank for rank, r in enumerate(records) if r.failure is not None), None)
    if failed is not None:
        return failed, records[failed].failure  # type: ignore[return-value]
    differs = first_disagreement([r.built for r in records])
    return (0, differs.message()) if differs is not None else None


def agree(config: TrainConfig, build: Callable[[], Model], rank: int, world: int) -> Model:
    """Build this rank's model and check, with one exchange, that every rank runs the same job; return the model.

    Raises:
        TrainConfigError: this rank reports a disagreement (the others raise PeerRefused).
        Exception: the build failed here, and this is the lowest rank it failed on (re-raised as it was; the others
            raise PeerRefused).
    """
    model: Model | None = None
    failure: Exception | None = None
    try:
        model = build()
    except Exception as exc:  # a user's model may raise anything: said once, by the lowest rank it failed on
        failure = exc
    built = () if model is None else built_fields(config, model)
    first_line = None if failure is None else (str(failure).splitlines() or [type(failure).__name__])[0]
    found = verdict(exchange(Record(config_fields(config), first_line, built), world))
    if found is None:
        assert model is not None  # every rank built it, or the verdict names the failure
        return model
    reporter, line = found
    if reporter != rank:
        raise PeerRefused(f"rank {reporter} refused the job and says why")
    if failure is not None and line == first_line:
        raise failure
    raise TrainConfigError(line)


def exchange(mine: Record, world: int) -> list[Record]:
    """Every rank's record, rank 0 first, through `all_gather_json` (JSON, never pickle; at most RECORD_BYTES each).

    Note:
        A record that is JSON but does not read back as one is a value that differs (`_record_of`).
    """
    del world  # the group's size: all_gather_json asks the group
    return [_record_of(obj) for obj in all_gather_json(dataclasses.asdict(mine), RECORD_BYTES)]


def _record(data: bytes) -> Record:
    """A peer's record from its JSON bytes; one that does not read as a record differs from every real one."""
    try:
        return _record_of(json.loads(data), len(data))
    except ValueError:
        return _unreadable(len(data))


def _record_of(obj: object, size: int | None = None) -> Record:
    """A peer's record from its JSON value; one that does not read as a record differs from every real one."""
    if not isinstance(obj, dict):
        return _unreadable(len(json.dumps(obj).encode()) if size is None else size)
    try:
        fields = {key: [tuple(pair) for pair in obj[key]] for key in ("config", "built")}
        failure = obj["failure"]
        if all(len(pair) == 2 and all(isinstance(v, str) for v in pair) for pair in fields["config"] + fields["built"]) and (
            failure is None or isinstance(failure, str)
        ):
            return Record(tuple(fields["config"]), failure, tuple(fields["built"]))  # type: ignore[arg-type]
    except (ValueError, TypeError, KeyError):
        pass
    return _unreadable(len(json.dumps(obj).encode()) if size is None else size)


def _unreadable(size: int) -> Record:
    return Record((("the agreement record", f"unreadable ({size:,} bytes)"),))


def config_fields(config: TrainConfig) -> tuple[Field, ...]:
    """Every option of `config` that all ranks must share, as (flag, value) in the order a message names the first."""
    fields: list[Field] = [("the pipeplan version", _version())]
    fields += [("--module", config.module), ("--opt", _options(config.module_options)), ("--dataset", config.dataset),
               ("--dtype", config.dtype), ("--precision", config.precision), ("--seed", str(config.seed)),
               ("--steps", str(config.steps)),
               ("--epochs", str(config.epochs)), ("--lr", repr(config.lr)), ("--lr-schedule", config.lr_schedule),
               ("--optimizer", config.optimizer), ("--data", str(config.data)), ("--loss", str(config.loss)),
               ("--eval-fraction", repr(config.eval_fraction))]  # fmt: skip
    if config.plan is not None:
        p = config.plan  # frozen values of tuples: their repr is canonical (the pipeplan version is compared first)
        summary = f"{p.schedule}, {len(p.stages)} stages, {p.microbatches} microbatches, global batch {p.global_batch}"
        fields.append(("--plan", f"{summary} (sha256 {_sha(repr(p) + repr(config.schedule))})"))
    else:
        fields.append(("--plan", "none"))
    layout = config.layout
    fields.append(("--schedule", "none" if layout is None else _schedule_file(layout)))  # a file by its content
    for what, name in (("--stages", "stages"), ("--microbatches", "microbatches"),
                       ("--batch-size", "global_batch"), ("--k", "k"), ("--chunks", "chunks"), ("--replicas", "replicas"),
                       ("the pipemare run's minibatches (--steps)", "minibatches"),
                       ("the pipemare run's synchronous minibatches (--sync-warmup)", "sync_minibatches")):  # fmt: skip
        fields.append((what, "none" if layout is None else str(getattr(layout, name))))
    fields += [(f"--{key.replace('_', '-')}", str(value)) for key, value in _settings(config.asynchronous).items()]
    network = config.network
    fields += [("--bandwidth-trace", _trace(network)),
               ("--emulate-gb-per-s", "none" if network is None else repr(network.gb_per_s)),
               ("the emulated links' cluster", "none" if network is None else _links_cluster(network)),
               ("--profile", _content(config.profile, config.profile_value)),
               ("--cluster", _content(config.cluster, config.cluster_value)),
               ("--batch-scaling", config.batch_scaling), ("--backend", str(config.backend or "default")),
               ("--checkpoint-dir", str(config.checkpoint_dir)), ("--checkpoint-every", str(config.checkpoint_every)),
               ("--keep-last", str(config.keep_last)), ("--resume", str(config.resume)),
               ("--timeline or --png", str(config.timeline)), ("--predict", str(config.predict)),
               ("--eval", str(config.evaluate)),
               ("--adaptive", str(config.adaptive)), ("--memory-budget", repr(config.memory_budget_bytes)),
               ("--allreduce-bucket-mb", repr(config.allreduce_bucket_bytes)),
               ("the lookahead", str(config.lookahead))]  # fmt: skip
    return tuple(fields)


def built_fields(config: TrainConfig, model: Model) -> tuple[Field, ...]:
    """Digests of what this rank built and reads: the layers' initial parameters, the data, the checkpoint it resumes."""
    return (
        (f"the model's initial parameters (--module {config.module})", model_digest(model.layers)),
        (f"the model's shared parameters (--module {config.module})", sharing(model.layers, model.layer_names)),
        (f"the data ({'--data' if config.data else '--dataset'} {model.dataset.name})", data_digest(model.dataset)),
        ("the checkpoint to resume (--checkpoint-dir, --resume)", checkpoint_digest(config)),
    )


def model_digest(layers: Sequence[nn.Module]) -> str:
    """Every parameter's and buffer's name, shape, dtype and bytes, hashed (exact: a sum would depend on threads)."""
    digest = hashlib.sha256()
    tensors = values = 0
    for i, layer in enumerate(layers):
        for name, tensor in [*layer.named_parameters(), *layer.named_buffers()]:
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{i}.{name} {tuple(tensor.shape)} {tensor.dtype};".encode())
            digest.update(flat.view(torch.uint8).numpy().data)
            tensors, values = tensors + 1, values + flat.numel()
    return f"{len(layers)} layers, {tensors} tensors, {values:,} values (sha256 {digest.hexdigest()[:12]})"


def sharing(layers: Sequence[nn.Module], names: Sequence[str]) -> str:
    """Every parameter several layers hold (tied weights) and its layers: a rank whose model ties otherwise would
    train another model, and its peers' exchange of the tied gradients would not match."""
    found = shared_parameters(layers, names)
    return "; ".join(f"{s.name} in layers {list(s.layers)}" for s in found) or "none"


def data_digest(data: Dataset) -> str:
    """The data's name, the sizes of its splits and the bytes of its first DATA_SAMPLES samples, hashed."""
    digest = hashlib.sha256()
    held_out = 0 if data.test_inputs is None else len(data.test_inputs)
    for tensor in (data.inputs, data.targets):
        head = tensor[:DATA_SAMPLES].detach().cpu().contiguous()
        digest.update(f"{tuple(tensor.shape)} {tensor.dtype};".encode())
        digest.update(head.reshape(-1).view(torch.uint8).numpy().data)
    return f"{data.name}: {len(data):,} samples, {held_out:,} held out (sha256 {digest.hexdigest()[:12]})"


def checkpoint_digest(config: TrainConfig) -> str:
    """The step this rank would resume from (its checkpoint index), or why none."""
    if not config.resume or config.checkpoint_dir is None:
        return "none (no --resume)"
    from pipeplan.runtime.state.manifest import read_manifest

    root = Path(config.checkpoint_dir)
    try:
        manifest = read_manifest(root) if root.is_dir() else None
        step = None if manifest is None else manifest.step
    except PipeplanError as exc:
        return f"an unreadable index ({str(exc)[:60]})"
    return "none (no complete checkpoint)" if step is None else f"step {step}"


def _version() -> str:
    """The installed pipeplan's version (package metadata: `import pipeplan` would import the API above this layer)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pipeplan")
    except PackageNotFoundError:
        return "unknown"


def _options(options: tuple[tuple[str, object], ...]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(options, key=lambda kv: kv[0])) or "none"


def _settings(settings: object) -> dict[str, object]:
    """PipeMare's switches by flag name (all None without --schedule pipemare)."""
    from pipeplan.runtime.options import AsyncSettings

    names = [f.name for f in dataclasses.fields(AsyncSettings)]
    return {name: None if settings is None else getattr(settings, name) for name in names}


def _trace(network: NetworkSettings | None) -> str:
    """The bandwidth trace by content: its steps as read (NetworkSettings.loaded), else its file's bytes."""
    if network is None or (network.trace is None and network.trace_steps is None):
        return "none"
    if network.trace_steps is None:
        return _file(str(network.trace))
    from pipeplan.io.bandwidth_trace_json import bandwidth_trace_to_json

    return f"a trace with sha256 {_sha(json.dumps(bandwidth_trace_to_json(network.trace_steps)))}"


def _schedule_file(layout: ScheduleLayout) -> str:
    """A --schedule by content: the file's schedule as the launcher read it (ScheduleLayout.loaded), else `_file`."""
    if layout.file_schedule is None:
        return _file(layout.name)
    from pipeplan.io.schedule_io import schedule_to_json

    return f"a schedule with sha256 {_sha(json.dumps(schedule_to_json(layout.file_schedule)))}"


def _links_cluster(network: NetworkSettings) -> str:
    """The emulated links' cluster by content: as the launcher read it (NetworkSettings.loaded), else `_file`."""
    if network.cluster_value is None:
        return "none" if network.cluster is None else _file(network.cluster)
    return _content(network.cluster, network.cluster_value)


def _content(name: str | None, value: ModelProfile | Cluster | None) -> str:
    """A profile or cluster by content: its value as the launcher read it (TrainConfig.loaded), else `_file`."""
    if value is None:
        return "none" if name is None else _file(name)
    from pipeplan.io.cluster_json import cluster_to_json
    from pipeplan.io.profile_json import profile_to_json

    obj = profile_to_json(value) if isinstance(value, ModelProfile) else cluster_to_json(value)
    return f"content with sha256 {_sha(json.dumps(obj, sort_keys=True))}"


def _file(name: str) -> str:
    """A file named by an option, by content (paths may differ between machines); a built-in name as itself."""
    path = Path(name)
    if not path.is_file():
        return name
    from pipeplan.io.files import read_input_bytes

    try:
        return f"a file with sha256 {_sha(read_input_bytes(path, name, TrainConfigError))}"
    except PipeplanError as exc:
        return f"an unreadable file ({str(exc)[:60]})"


def _sha(content: str | bytes) -> str:
    return hashlib.sha256(content.encode() if isinstance(content, str) else content).hexdigest()[:12]


def _shown(value: str) -> str:
    """A value as a message shows it: whole up to SHOWN_CHARS, else its start and a digest of the whole."""
    return value if len(value) <= SHOWN_CHARS else f"{value[:60]}... (sha256 {_sha(value)})"
