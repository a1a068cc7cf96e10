"""The model a run trains: a MODULE_SPEC's ordered layers, fitted to the dataset, in the run's dtype."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional

from pipeplan.core.errors import ProfileError, TrainConfigError
from pipeplan.core.model_source import USER_DATA
from pipeplan.models.model_spec import LossFn, ModelSpec, SampleFn
from pipeplan.models.specs import resolve_module_spec, takes_option
from pipeplan.models.traced.graph import GraphNet, LayerGraph, run_layers
from pipeplan.models.zoo.datasets import DATASETS, Dataset, digits, pysource, sample_dataset

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class Model:
    """Ordered layers (identical on every process), their names, the loss and the data (`dataset.name` resolved).

    `graph` (None: a chain) holds a branching model's edges and per-sample output shapes (models.traced.graph).
    """

    layers: tuple[nn.Module, ...]
    layer_names: tuple[str, ...]
    loss_fn: LossFn
    dataset: Dataset
    spec: ModelSpec
    graph: LayerGraph | None = None

    @property
    def layer_inputs(self) -> tuple[tuple[int, ...], ...] | None:
        """Per layer, the layers whose outputs it reads (None: a chain)."""
        return None if self.graph is None else self.graph.inputs

    def reference(self) -> nn.Module:
        """The whole model as one module over these layer objects (unpipelined)."""
        return nn.Sequential(*self.layers) if self.graph is None else GraphNet(self.layers, self.graph.inputs)

    def batch(self, samples: int) -> torch.Tensor:
        """The first `samples` inputs of the dataset (cycled when it holds fewer): what a profile measures on."""
        inputs = self.dataset.inputs
        return inputs[torch.arange(samples) % len(inputs)]

    def targets(self, samples: int) -> torch.Tensor:
        """The targets of `batch(samples)`: what the loss of a profile's last layer is measured on."""
        targets = self.dataset.targets
        return targets[torch.arange(samples) % len(targets)]

    def chain_spec(self) -> ModelSpec:
        """The layers as a ModelSpec whose sample inputs, targets and loss are this model's (what a profile measures)."""
        return ModelSpec(
            self.spec.name,
            self.layers,
            self.layer_names,
            sample_input=self.batch,
            sample_target=self.targets,
            loss_fn=self.loss_fn,
            layer_inputs=self.layer_inputs,
        )


def resolve_dataset(module: str, dataset: str) -> str:
    """`auto` is `digits` for a MODULE_SPEC that takes an `in_features` option (mlp), `pysource` for `charlm`, else
    `sample`; others as given.

    Raises:
        TrainConfigError: an unknown dataset.
        ProfileError: the MODULE_SPEC cannot be resolved.
    """
    if dataset == USER_DATA:
        raise TrainConfigError(
            f"dataset {USER_DATA!r} is your own samples, which a profile does not record: name them with --data "
            "MODULE:FACTORY (data= in the API)"
        )
    if dataset not in (*DATASETS, "auto"):
        raise TrainConfigError(f"--dataset must be one of auto, {', '.join(DATASETS)}; got {dataset!r}")
    if dataset != "auto":
        return dataset
    if module == "charlm":
        return "pysource"
    return "digits" if takes_option(module, "in_features") else "sample"


def build_model(
    module: str,
    options: dict[str, object],
    dataset: str,
    dtype: str = "float32",
    seed: int = 0,
    sample_size: int = 1024,
    *,
    data: str | None = None,
    loss: str | None = None,
    eval_fraction: float = 0.0,
) -> Model:
    """Resolve the MODULE_SPEC and the dataset into a Model.

    `dataset` "auto" is resolved by resolve_dataset. `pipeplan profile` and
    `pipeplan train` both build their model here, so the same MODULE_SPEC,
    options and dataset give the same layers in both.
    With `dataset="digits"` the spec gets `in_features=64` (it must take that
    option, as `mlp` does) and a linear head to the 10 classes is appended as
    the last layer, named `head`; the loss is cross-entropy. With
    `dataset="sample"` the spec's own sample inputs, targets and loss are used.
    `seed` seeds the spec (when it takes a `seed` option) and the head.
    `data` (`--data MODULE:FACTORY`, models.user_data) replaces the dataset with the user's samples (`dataset` must
    then be auto), `eval_fraction` of them held out; `loss` (`--loss MODULE:FN`) replaces the spec's loss. Either is
    checked on a batch of the data before it is returned (models.user_data.check_fit).

    Raises:
        TrainConfigError: unknown dataset or dtype, a spec that does not fit the data, or the user's data or loss
            refused (one line naming --data or --loss).
        ProfileError: the MODULE_SPEC cannot be resolved.
    """
    if dtype not in DTYPES:
        raise TrainConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch_dtype = DTYPES[dtype]
    opts = dict(options)
    if data is not None:
        if dataset not in ("auto", USER_DATA):
            raise TrainConfigError(f"give --data or --dataset, not both (got --dataset {dataset} and --data {data})")
        dataset = "user"
    else:
        dataset = resolve_dataset(module, dataset)
    if dataset == "user":
        from pipeplan.models.user_data import input_name_of, read_data

        given = read_data(data, seed, eval_fraction)
        spec = _resolve(module, opts, seed, torch_dtype, given.first_inputs)
        samples = given.dataset(input_name_of(spec.layers))
        layers, names, loss_fn, inputs = spec.layers, spec.layer_names, spec.loss_fn, spec.layer_inputs  # type: ignore[assignment]
    elif dataset == "digits":
        samples = digits()
        opts.setdefault("in_features", samples.features)
        spec = _resolve(module, opts, seed, torch_dtype)
        out_width = _output_width(spec, samples.inputs[:2])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 7919)
            head = nn.Linear(out_width, 10)
        layers = (*spec.layers, head)
        names = (*spec.layer_names, "head")
        inputs = None if spec.layer_inputs is None else (*spec.layer_inputs, (len(spec.layers) - 1,))
        loss_fn: LossFn = functional.cross_entropy
    elif dataset == "pysource":
        spec = _resolve(module, opts, seed, torch_dtype)
        if spec.loss_fn is None or not takes_option(module, "seq_len"):
            raise TrainConfigError(
                f"--dataset pysource needs a character model with a seq_len option (such as charlm), got {module!r}"
            )
        seq_len = int(spec.sample_input(1).shape[1])
        samples = pysource(seq_len)
        layers, names, loss_fn, inputs = spec.layers, spec.layer_names, spec.loss_fn, spec.layer_inputs
    elif dataset == "sample":
        spec = _resolve(module, opts, seed, torch_dtype)
        if spec.loss_fn is None and loss is None:
            raise TrainConfigError(
                f"MODULE_SPEC {module!r} defines no loss; give your samples and loss with --data MODULE:FACTORY --loss "
                "MODULE:FN, or use --dataset digits (a factory that takes in_features)"
            )
        samples = sample_dataset(spec.sample_input, spec.sample_target, sample_size)
        layers, names, loss_fn, inputs = spec.layers, spec.layer_names, spec.loss_fn, spec.layer_inputs  # type: ignore[assignment]
    else:  # resolve_dataset leaves only the three
        raise AssertionError(dataset)
    if loss is not None:
        from pipeplan.models.user_data import load_loss

        loss_fn = load_loss(loss)
    if loss_fn is None:
        raise TrainConfigError(f"MODULE_SPEC {module!r} defines no loss: give --loss MODULE:FN, a function (output, target)")
    for layer in layers:
        layer.to(torch_dtype)

    def cast(tensor: torch.Tensor | None) -> torch.Tensor | None:
        return tensor.to(torch_dtype) if tensor is not None and tensor.is_floating_point() else tensor

    samples = Dataset(
        samples.name,
        cast(samples.inputs),
        cast(samples.targets),
        samples.classes,
        cast(samples.test_inputs),
        cast(samples.test_targets),
    )  # type: ignore[arg-type]
    graph = None if inputs is None else LayerGraph.measure(layers, inputs, names, samples.inputs[:2])
    model = Model(tuple(layers), tuple(names), loss_fn, samples, spec, graph)
    if data is not None or loss is not None:
        from pipeplan.models.user_data import check_fit

        given = " with ".join(f"{flag} {value}" for flag, value in (("--data", data), ("--loss", loss)) if value)
        check_fit(model.reference(), loss_fn, samples.inputs, samples.targets, given)
    return model


def _resolve(
    module: str, options: dict[str, object], seed: int, dtype: torch.dtype, fallback_input: SampleFn | None = None
) -> ModelSpec:
    """_resolve_float32 in dtype (a captured model is captured again in it: models.model_spec.ModelSpec.cast)."""
    spec = _resolve_float32(module, options, seed, fallback_input)
    return spec if spec.recapture is None else spec.cast(dtype)


def _resolve_float32(module: str, options: dict[str, object], seed: int, fallback_input: SampleFn | None = None) -> ModelSpec:
    """resolve_module_spec with `seed` added when the factory takes it; a factory that takes none (a user's
    `build()`) runs with torch's generator seeded from `seed` inside fork_rng (a module it returns without a sample
    input of its own is given `fallback_input`), as the built-ins draw their weights,
    so every process of a job builds the same initial model (before, each drew its own) and the caller's random
    state is left as it was."""
    try:
        try:
            return resolve_module_spec(module, fallback_input, **{"seed": seed, **options})
        except ProfileError as exc:
            if "no option 'seed'" not in str(exc):
                raise
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return resolve_module_spec(module, fallback_input, **options)
    except ProfileError as exc:
        if "no option 'in_features'" in str(exc):
            raise TrainConfigError(
                f"--dataset digits needs a MODULE_SPEC with an in_features option (such as mlp), got {module!r}; give "
                "your own samples with --data MODULE:FACTORY"
            ) from None
        raise


def _output_width(spec: ModelSpec, batch: torch.Tensor) -> int:
    """Width of the model's output for a real batch (must be (batch, width)); on the meta device, shapes only."""
    params = [p for layer in spec.layers for p in layer.parameters()]
    with torch.no_grad():
        x = run_layers(spec.layers, spec.layer_inputs, batch.to(params[0].device) if params else batch)[-1]
    if x.dim() != 2:
        raise TrainConfigError(f"--dataset digits needs a model whose output is (batch, width), got shape {tuple(x.shape)}")
    return int(x.shape[1])
