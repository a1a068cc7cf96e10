"""torchvision's presence never breaks the built-ins: a torchvision whose C++ operators are missing (a CUDA build
beside a CPU torch) imports once nms and qnms are defined; one that cannot import at all is marked absent, and
transformers and the built-in gpt2-small still work. With a real torchvision (skipped where none imports, as in CI),
its stock classifiers build through a user's factory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SRC = str(Path(__file__).resolve().parents[1] / "src")
NEEDS_OPS = """
import torch
torch.library.register_fake("torchvision::nms")(lambda dets, scores, iou_threshold: dets.new_empty(0, dtype=torch.long))
__version__ = "0.28.0"
"""
"""A stand-in for a CUDA torchvision beside a CPU torch: its import fails as the real one's does, at its first fake
kernel, unless torchvision::nms is defined."""
BROKEN = "raise OSError('libcudart.so.13: cannot open shared object file')\n"
"""A torchvision that cannot be imported whatever is defined."""
METADATA = "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n"


def _fake_torchvision(root: Path, init: str) -> Path:
    """A torchvision package (with its distribution's metadata, so transformers counts it as installed) in `root`."""
    (root / "torchvision").mkdir(parents=True)
    (root / "torchvision" / "__init__.py").write_text(textwrap.dedent(init))
    (root / "torchvision-0.28.0.dist-info").mkdir()
    (root / "torchvision-0.28.0.dist-info" / "METADATA").write_text(METADATA)
    return root


def _python(code: str, site: Path) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with `site` on its path after pipeplan's source."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((SRC, str(site))), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.mark.slow
def test_a_torchvision_missing_its_operators_imports_once_they_are_defined(tmp_path: Path) -> None:
    """Plain `import torchvision` fails (the operator does not exist); after prepare_torchvision it imports, with
    nms and qnms defined, and a second call changes nothing."""
    site = _fake_torchvision(tmp_path, NEEDS_OPS)
    plain = _python("import torchvision", site)
    assert plain.returncode != 0 and "torchvision::nms" in plain.stderr
    done = _python(
        """
        import torch
        from pipeplan.models.zoo.vision_compat import prepare_torchvision, unavailable_reason
        assert prepare_torchvision() is None and prepare_torchvision() is None and unavailable_reason() is None
        import torchvision
        print(torchvision.__version__, hasattr(torch.ops.torchvision, "nms"), hasattr(torch.ops.torchvision, "qnms"))
        """,
        site,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.28.0", "True", "True"]


@pytest.mark.slow
def test_a_torchvision_that_cannot_import_is_absent_and_gpt2_small_still_builds(tmp_path: Path) -> None:
    """A torchvision that raises on import: without pipeplan's preparation transformers' GPT-2 fails with it; through
    the built-in gpt2-small (which prepares first) torchvision is marked absent, the reason kept, and the model
    builds and runs."""
    site = _fake_torchvision(tmp_path, BROKEN)
    raw = _python("import transformers; from transformers import GPT2Config, GPT2Model; GPT2Model(GPT2Config(n_layer=1))", site)
    assert raw.returncode != 0 and "libcudart" in raw.stderr
    done = _python(
        """
        import importlib.util
        from pipeplan.models.specs import resolve_module_spec
        from pipeplan.models.zoo.vision_compat import unavailable_reason
        spec = resolve_module_spec("gpt2-small", layers=1, seq_len=8)
        x = spec.sample_input(2)
        for layer in spec.layers:
            x = layer(x)
        print(tuple(x.shape), importlib.util.find_spec("torchvision"), unavailable_reason())
        """,
        site,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(2, 8, 50257) None OSError: libcudart.so.13: cannot open shared object file"


@pytest.mark.slow
def test_a_user_module_importing_a_torchvision_that_cannot_import_says_why(tmp_path: Path) -> None:
    """A user's module that imports such a torchvision: one line naming the module and torchvision's reason."""
    site = _fake_torchvision(tmp_path, BROKEN)
    (tmp_path / "vision_user_h32.py").write_text("import torchvision\n")
    done = _python(
        """
        from pipeplan.core.errors import ProfileError
        from pipeplan.models.specs import resolve_module_spec
        try:
            resolve_module_spec("vision_user_h32:build")
        except ProfileError as exc:
            print(exc)
        """,
        site,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "MODULE_SPEC 'vision_user_h32:build': cannot import module 'vision_user_h32' (torchvision is installed but "
        "cannot be imported beside this torch: OSError: libcudart.so.13: cannot open shared object file)"
    )


def test_no_torchvision_installed_is_not_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torchvision is not installed nothing is imported or marked, and no reason is given."""
    import importlib.util

    from pipeplan.models.zoo import vision_compat

    monkeypatch.setattr(vision_compat, "_state", {})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    assert vision_compat.prepare_torchvision() is None
    assert "torchvision" not in sys.modules


# ---- a real torchvision (skipped where none imports: CI installs none)

CLASSIFIERS = """
import torch
import torchvision


def resnet18():
    return torchvision.models.resnet18(num_classes=10)


def mobilenet_v3_small():
    return torchvision.models.mobilenet_v3_small(num_classes=10)


def efficientnet_b0():
    return torchvision.models.efficientnet_b0(num_classes=10)


def vit_b_16():
    return torchvision.models.vit_b_16(image_size=32, num_classes=10)


def sample_input(batch_size):
    return torch.randn(batch_size, 3, 32, 32, generator=torch.Generator().manual_seed(0))
"""


@pytest.fixture(scope="module")
def torchvision() -> object:
    """The installed torchvision, made importable by prepare_torchvision; the tests skip where it cannot import."""
    from pipeplan.models.zoo.vision_compat import prepare_torchvision

    prepare_torchvision()
    return pytest.importorskip("torchvision")


def test_the_built_in_gpt2_small_profiles_beside_torchvision(torchvision: object) -> None:
    """profile_model("gpt2-small", one block) with torchvision importable: a profile of embed, block and head."""
    from pipeplan.api import profile_model

    profile = profile_model("gpt2-small", 1, options={"layers": 1, "seq_len": 8}, runs=1, warmup=0)
    assert profile.layers[0].name == "embed" and profile.num_layers == 3


@pytest.mark.parametrize("factory", ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_b_16"])
def test_stock_torchvision_classifiers_build_through_a_user_factory(
    torchvision: object, factory: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each unmodified classifier passes the launcher's check (check_factory) and its factory's call, and maps a
    batch of two 32x32 images to ten logits."""
    import torch

    from pipeplan.models.specs import factory_of
    from pipeplan.models.user_code import call_factory, check_factory

    (tmp_path / "tv_models_h32.py").write_text(CLASSIFIERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        spec = f"tv_models_h32:{factory}"
        check_factory(spec, {})
        model = call_factory(spec, factory_of(spec), {})
        assert isinstance(model, torch.nn.Module)
        with torch.no_grad():
            out = model.eval()(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
        assert tuple(out.shape) == (2, 10)
    finally:
        sys.modules.pop("tv_models_h32", None)
