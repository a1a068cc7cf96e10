"""The layers table of `pipeplan show profile` (viz.inventory): the plain lines written for a deep profile are
exactly what rich prints for the same table, and rich prints whatever they cannot hold."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from pipeplan.core.profile import LayerProfile, ModelProfile, SharedGroup
from pipeplan.viz import inventory
from pipeplan.viz.inventory import _layer_rows, plain_layer_lines, print_profile_layers, profile_layers_table

NAMES = st.text(alphabet="ab:_ (),=.-日é", min_size=1, max_size=70).filter(lambda s: s.strip() == s and s != "")
VALUES = st.floats(0, 1e9) | st.sampled_from([0.0, 1.0, 999.9995, 1023.0, 1024.0])


def profile(layers: list[tuple[str, float, float, float]]) -> ModelProfile:
    """A chain of layers (name, fwd ms, activation bytes, parameter bytes)."""
    return ModelProfile("p", 1, tuple(LayerProfile(n, f, 2 * f, a, q) for n, f, a, q in layers))


def rich_lines(p: ModelProfile, width: int) -> list[str]:
    """What rich prints for the table on an uncoloured console `width` columns wide."""
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(profile_layers_table(p))
    return console.file.getvalue().split("\n")[:-1]  # type: ignore[attr-defined]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(NAMES, VALUES, VALUES, VALUES), min_size=1, max_size=25), st.integers(60, 200))
def test_plain_lines_are_riches_lines_whenever_they_fit(layers: list[tuple[str, float, float, float]], width: int) -> None:
    """For any layers and console width: the plain lines equal rich's, or are None because rich must squeeze."""
    p = profile(layers)
    lines = plain_layer_lines(_layer_rows(p), width)
    if lines is not None:
        assert lines == rich_lines(p, width)
    else:
        assert max(len(line) for line in rich_lines(p, 10_000)) > width


@pytest.mark.parametrize("name", ["[bold]x", "tab\there"])
def test_markup_or_control_characters_are_left_to_rich(name: str) -> None:
    """A name rich would read as markup, or one with a control character, is not written as plain text."""
    assert plain_layer_lines(_layer_rows(profile([(name, 1.0, 1.0, 1.0)])), 200) is None


def test_a_deep_profile_prints_the_same_text_as_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    """print_profile_layers above PLAIN_LAYER_ROWS on a file: the text rich prints for the whole table."""
    monkeypatch.setattr(inventory, "PLAIN_LAYER_ROWS", 10)
    p = profile([(f"layer{i}", 0.5 * i, 1000.0 * i, 3.0 * i) for i in range(40)])
    console = Console(width=120, file=io.StringIO(), color_system=None)
    print_profile_layers(console, p)
    assert console.file.getvalue().split("\n")[:-1] == rich_lines(p, 120)  # type: ignore[attr-defined]


def test_the_summary_counts_a_shared_parameter_once_and_lists_it() -> None:
    """Two layers of 3 MiB holding one 2 MiB weight: parameters 4 MiB, and a row naming the weight and its layers."""
    mib = float(1 << 20)
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 8.0, 3 * mib) for i in range(2))
    table = inventory.profile_summary(ModelProfile("tied", 4, layers, shared_params=(SharedGroup("l0.w", (0, 1), 2 * mib),)))
    out = io.StringIO()
    Console(file=out, width=100).print(table)
    text = out.getvalue()
    assert "parameters" in text and "4 MiB" in text
    assert "shared l0.w" in text and "2 MiB, layers 0, 1" in text
