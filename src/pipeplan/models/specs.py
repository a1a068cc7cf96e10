"""MODULE_SPEC resolution: a name or `package.module:factory` becomes a ModelSpec (ordered blocks + sample data).

A ModelSpec is what the profiler measures and what the runtime splits into
stages: `layers` composed in order are the model (`layers[i+1]` takes
`layers[i]`'s output, one tensor each), `sample_input(b)` makes a batch of b
samples for `layers[0]`, and `loss_fn(output, sample_target(b))` a scalar loss.

A factory named by `package.module:factory` is called with the options as
keyword arguments and may return:
  - a ModelSpec (used as is);
  - an `nn.Sequential` (its children are the layers);
  - a module with a `pipeline_layers()` method returning the ordered layers
    (modules, or (name, module) pairs) whose composition is the model;
  - a module whose `blocks` or `layers` ModuleList holds all its parameters;
  - any other module that torch.fx traces: a graph, one layer per node that
    computes (models.traced.graph), e.g. one with branches and skip connections;
  - any other module that torch.export captures (Hugging Face transformers
    models, which fx cannot trace, go straight there): a graph, one layer per
    module of its hierarchy (models.traced.capture, models.traced.capture_spec).
The sample input then comes from, in order: the returned module's
`sample_input(batch_size)` method, a `sample_input(batch_size)` function beside
the factory in its Python module, a transformers model's config (with its
own sample target and loss, models.zoo.stock), or the first layer when it is an
`nn.Linear` (a standard normal batch of `in_features`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable

import torch
from torch import nn

from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import MODEL_BYTES
from pipeplan.models.model_spec import ModelSpec, SampleFn
from pipeplan.models.user_code import call_factory, import_user_module, may_look_here, missing_module


def resolve_module_spec(spec: str, fallback_input: SampleFn | None = None, **options: object) -> ModelSpec:
    """Build the ModelSpec a MODULE_SPEC names: a built-in name or `package.module:factory`.

    Args:
        spec: `mlp`, `transformer`, `gpt2-small`, `gpt2-medium`, `gpt2-large`,
            `gpt2-xl`, `bert-base`, `bert-large`, or `package.module:factory`.
        fallback_input: a factory's nn.Module that gives no sample_input of its own (nor does its Python module)
            is given this one (`--data`'s first samples, models.user_data).
        **options: keyword arguments for the factory; strings (from the CLI)
            are converted to the type of the factory parameter's default.

    Returns:
        The ModelSpec, with the layers on the CPU in float32 (as the factory made them).

    Raises:
        ProfileError: unknown spec, import failure, unknown option, a factory that raises or returns no model
            (models.user_code.call_factory), or a factory result that is not a chain of blocks.
    """
    from pipeplan.models.zoo.builtin import BUILTIN_SPECS

    if not isinstance(spec, str) or not spec.strip():
        raise ProfileError(f"MODULE_SPEC must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec in BUILTIN_SPECS:
        factory = BUILTIN_SPECS[spec]
        coerced = coerce_options(spec, factory, options)
        _check_weights(spec, factory, coerced)
        return factory(**coerced)
    if ":" not in spec:
        raise ProfileError(
            f"MODULE_SPEC {spec!r} is neither a built-in ({', '.join(BUILTIN_SPECS)}) nor of the form package.module:factory"
        )
    factory, pymodule = _import_factory(spec)
    result = call_factory(spec, factory, coerce_options(spec, factory, options))
    if isinstance(result, ModelSpec):
        return result
    fallback = getattr(pymodule, "sample_input", None)
    return spec_from_module(result, name=spec, sample_input=fallback if callable(fallback) else fallback_input)


def takes_option(spec: str, option: str) -> bool:
    """Whether the factory a MODULE_SPEC names takes keyword `option`.

    Raises:
        ProfileError: the spec is neither a built-in nor an importable `package.module:factory`.
    """
    factory = factory_of(spec)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return option in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def factory_of(spec: str) -> Callable[..., object]:
    """The factory a MODULE_SPEC names (a built-in's, or an imported `package.module:factory`), not called.

    Raises:
        ProfileError: the spec is neither a built-in nor an importable `package.module:factory`.
    """
    from pipeplan.models.zoo.builtin import BUILTIN_SPECS

    if not isinstance(spec, str) or not spec.strip():
        raise ProfileError(f"MODULE_SPEC must be a non-empty string, got {spec!r}")
    name = spec.strip()
    if name in BUILTIN_SPECS:
        factory = BUILTIN_SPECS[name]
    elif ":" in name:
        factory, _ = _import_factory(name)
    else:
        raise ProfileError(
            f"MODULE_SPEC {spec!r} is neither a built-in ({', '.join(BUILTIN_SPECS)}) nor of the form package.module:factory"
        )
    return factory


def spec_from_module(module: nn.Module, name: str = "model", sample_input: SampleFn | None = None) -> ModelSpec:
    """Turn a module into a ModelSpec: its blocks, or its traced graph (see the module docstring), and a sample-input
    function.

    Raises:
        ProfileError: when the module exposes no chain of blocks and does not trace, or gives no way to make an input.
    """
    from pipeplan.models.zoo.stock import hf_defaults

    defaults = hf_defaults(module)
    if callable(getattr(module, "sample_input", None)):
        sample_input = module.sample_input
    if sample_input is None and defaults is not None:
        sample_input = defaults.sample_input
    inputs = None
    recapture = None
    try:
        named = layers_of(module, name)
    except ProfileError as not_chain:
        from pipeplan.models.traced.capture_spec import capture

        layers, names, inputs, recapture = capture(module, name, sample_input, str(not_chain))
        named = list(zip(names, layers, strict=True))
    if sample_input is None:
        sample_input = _infer_sample_input(named[0][1], name)
    target = module.sample_target if callable(getattr(module, "sample_target", None)) else None
    loss = module.loss_fn if callable(getattr(module, "loss_fn", None)) else None
    if defaults is not None and target is None and loss is None:
        target, loss = defaults.sample_target, defaults.loss_fn
    return ModelSpec(
        name=name,
        layers=tuple(layer for _, layer in named),
        layer_names=tuple(n for n, _ in named),
        sample_input=sample_input,
        sample_target=target,
        loss_fn=loss,
        layer_inputs=inputs,
        recapture=recapture,
    )


def layers_of(module: nn.Module, name: str = "model") -> list[tuple[str, nn.Module]]:
    """The ordered (name, block) pairs whose composition is module.

    Raises:
        ProfileError: when module is not an nn.Sequential, has no `pipeline_layers()`,
            and no `blocks`/`layers` ModuleList holding all its parameters.
    """
    if isinstance(module, nn.Sequential):
        pairs = list(module.named_children())
    elif callable(getattr(module, "pipeline_layers", None)):
        pairs = [item if isinstance(item, tuple) else ("", item) for item in module.pipeline_layers()]
    else:
        pairs = []
        for attr in ("blocks", "layers"):
            blocks = getattr(module, attr, None)
            if isinstance(blocks, nn.ModuleList) and _holds_all_parameters(blocks, module):
                pairs = [(f"{attr}{i}", block) for i, block in enumerate(blocks)]
                break
        if not pairs:
            raise ProfileError(
                f"model {name!r} ({type(module).__name__}) is not a chain of blocks: return an nn.Sequential, "
                "give it a pipeline_layers() method, or a `blocks`/`layers` ModuleList holding all its parameters"
            )
    if not pairs:
        raise ProfileError(f"model {name!r} ({type(module).__name__}) has no layers")
    return [(_layer_name(n, i, layer), layer) for i, (n, layer) in enumerate(pairs)]


def coerce_options(spec: str, factory: Callable[..., object], options: dict[str, object]) -> dict[str, object]:
    """Check option names against factory's parameters and convert string values to each default's type.

    Raises:
        ProfileError: naming an unknown option or a value that does not convert.
    """
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return dict(options)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    known = [n for n, p in params.items() if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    out: dict[str, object] = {}
    for key, value in options.items():
        if key not in known and not takes_any:
            raise ProfileError(f"MODULE_SPEC {spec!r} has no option {key!r}; options: {', '.join(known) or 'none'}")
        default = params[key].default if key in params else inspect.Parameter.empty
        out[key] = _convert(spec, key, value, default)
    return out


def _convert(spec: str, key: str, value: object, default: object) -> object:
    """Convert a string option to the type of default (or to int/float when it parses as one)."""
    if not isinstance(value, str):
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise ProfileError(f"MODULE_SPEC {spec!r} option {key!r} must be a {type(default).__name__}, got {value!r}") from None
    if isinstance(default, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _check_weights(spec: str, factory: Callable[..., ModelSpec], options: dict[str, object]) -> None:
    """Refuse a built-in whose options make weights larger than core.limits.MODEL_BYTES, counted on the meta device
    (shapes only: nothing is allocated) before the model is built for real."""
    if torch.empty(0).device.type == "meta":
        return  # already building on the meta device (a projection): nothing to allocate
    with torch.device("meta"):
        counted = factory(**options)
    weights = sum(p.numel() * p.element_size() for layer in counted.layers for p in layer.parameters())
    if not MODEL_BYTES.allows(weights):
        given = ", ".join(f"{key}={value}" for key, value in sorted(options.items())) or "its defaults"
        raise ProfileError(MODEL_BYTES.message(f"MODULE_SPEC {spec!r} with {given}: weights", weights))


def _import_factory(spec: str) -> tuple[Callable[..., object], object]:
    """Import `package.module:attr.path` and return the callable and its Python module."""
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise ProfileError(f"MODULE_SPEC {spec!r} must be of the form package.module:factory")
    pymodule = import_user_module(module_name, spec)
    obj: object = pymodule
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ProfileError(f"MODULE_SPEC {spec!r}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ProfileError(f"MODULE_SPEC {spec!r}: {attr_path!r} is not callable")
    return obj, pymodule


def module_origin(spec: str) -> str | None:
    """The file the module of a `package.module:factory` spec is imported from (its top-level package's), found as
    the import will find it (the working folder last, see models.user_code.import_user_module) but without running it; None for a
    built-in name.

    The local launcher calls this before it starts its workers: a module found only in the working folder puts that
    folder (last) on this process's path, which the workers are given as theirs, so they import the same file.

    Raises:
        ProfileError: no such module.
    """
    from pipeplan.models.zoo.builtin import BUILTIN_SPECS

    name = spec.strip()
    if name in BUILTIN_SPECS or ":" not in name:
        return None
    top = name.partition(":")[0].partition(".")[0]
    found = importlib.util.find_spec(top) if top else None
    if found is None and may_look_here():
        sys.path.append(os.getcwd())
        found = importlib.util.find_spec(top)
    if found is None:
        raise ProfileError(missing_module(spec, top))
    return found.origin


def _holds_all_parameters(blocks: nn.ModuleList, module: nn.Module) -> bool:
    """True when every parameter of module lives inside blocks (so the blocks are the whole model)."""
    inside = {id(p) for p in blocks.parameters()}
    return all(id(p) in inside for p in module.parameters())


def _layer_name(name: str, index: int, layer: nn.Module) -> str:
    """A profile name for a layer: its attribute name unless that is only its position."""
    if name and not name.isdigit():
        return name
    return f"{index}-{type(layer).__name__.lower()}"


def _infer_sample_input(first: nn.Module, name: str) -> SampleFn:
    """A sample-input function for a chain whose first layer is an nn.Linear, else a ProfileError."""
    if isinstance(first, nn.Linear):
        features = first.in_features

        def sample_input(batch_size: int) -> torch.Tensor:
            gen = torch.Generator().manual_seed(0)
            return torch.randn(batch_size, features, generator=gen)

        return sample_input
    raise ProfileError(
        f"model {name!r}: cannot tell what input its first layer ({type(first).__name__}) takes; "
        "give the module a sample_input(batch_size) method or put a sample_input(batch_size) function beside the factory"
    )
