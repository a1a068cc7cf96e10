"""torchvision beside this torch: made importable where it can be, kept out of the way where it cannot.

Note:
    A torchvision wheel built for CUDA fails to load its C++ operators beside a CPU torch, and its import then stops
    at `operator torchvision::nms does not exist` (its Python code registers fake kernels for two operators,
    `torchvision::nms` and `torchvision::qnms`, that only its C++ library defines). transformers imports
    torchvision whenever it is installed, so that one failure broke every Hugging Face model, the built-in
    `gpt2-small` among them. `prepare_torchvision` runs before pipeplan imports transformers or a user's model: it
    imports torchvision as it is; when that fails, it defines the two operators' schemas with torch.library (only
    those not already defined) and imports it again, so its models (ResNet, MobileNet, EfficientNet, ViT, ...)
    work; when that fails too, it marks torchvision as absent (None in sys.modules, which find_spec reports as
    not installed), so that transformers goes on without it and the built-ins and text models still work. Only
    the Python models of torchvision are usable then: its detection operators (nms) have no kernel here.
"""

from __future__ import annotations

import importlib.util
import sys

import torch

SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
"""The operators torchvision's Python code needs defined before it imports (their schemas, as its C++ declares)."""

_state: dict[str, str | None] = {}
"""After the first call: "reason" -> why torchvision cannot be imported here (None: it imports, or is absent)."""


def prepare_torchvision() -> str | None:
    """Make `import torchvision` work here, once per process (see the module note); return None when it imports
    or is not installed, else the reason it cannot be imported (torchvision is then marked absent)."""
    if "reason" in _state:
        return _state["reason"]
    _state["reason"] = None
    if sys.modules.get("torchvision") is not None or _absent():
        return None
    try:
        importlib.import_module("torchvision")
        return None
    except Exception as first:  # a CUDA build beside a CPU torch: its operators are missing
        _forget_torchvision()
        defined = _define_missing_schemas()
        try:
            importlib.import_module("torchvision")
            return None
        except Exception as second:
            _forget_torchvision()
            failed = second if defined else first
            reason = f"{type(failed).__name__}: {str(failed).strip().splitlines()[0] if str(failed).strip() else ''}"
            sys.modules["torchvision"] = None  # type: ignore[assignment]  # find_spec: not installed
            _state["reason"] = reason
            return reason


def unavailable_reason() -> str | None:
    """Why torchvision cannot be imported here (prepare_torchvision's finding), None when it can or was not tried."""
    return _state.get("reason")


def _absent() -> bool:
    """Whether torchvision is not installed (or already marked absent)."""
    try:
        return importlib.util.find_spec("torchvision") is None
    except (ImportError, ValueError):
        return True


def _define_missing_schemas() -> bool:
    """Define each of SCHEMAS' operators that torch does not know yet; whether any was defined."""
    defined = False
    for name, schema in SCHEMAS.items():
        if not _has_operator(name):
            torch.library.define(f"torchvision::{name}", schema)
            defined = True
    return defined


def _has_operator(name: str) -> bool:
    """Whether torch knows the operator torchvision::`name`."""
    try:
        return hasattr(torch.ops.torchvision, name)
    except RuntimeError:
        return False


def _forget_torchvision() -> None:
    """Drop a failed import's torchvision modules, so that the next import starts afresh."""
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
