"""Values between processes travel as JSON with a size cap (runtime/transport/exchange.py), never as pickle."""

from __future__ import annotations

import json
import math
import pickle
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")

from pipeplan.runtime.rank_errors import RuntimeFault
from pipeplan.runtime.transport.exchange import LIMIT_BYTES, check_sizes, decode, encode

pytestmark = pytest.mark.torch

SRC = Path(__file__).resolve().parents[1] / "src" / "pipeplan"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _no_pickle(*args: object, **kwargs: object) -> Any:
    raise AssertionError("a peer's bytes reached pickle")


@given(json_values)
def test_a_json_value_reads_back_as_itself(value: object) -> None:
    assert decode(encode(value), 0) == value


def test_infinities_and_nan_travel_as_timings_may_hold_them() -> None:
    back = decode(encode([math.inf, -math.inf, math.nan, 1.5]), 0)
    assert back[:2] == [math.inf, -math.inf] and math.isnan(back[2]) and back[3] == 1.5


def test_what_json_cannot_hold_is_refused_at_the_sender() -> None:
    with pytest.raises(TypeError):
        encode({(0, 1): 2})
    with pytest.raises(TypeError):
        encode(object())


@pytest.mark.parametrize("data", [pickle.dumps({"a": 1}), b"\xff\xfe", b'{"a": ', b""])
def test_bytes_that_are_not_json_are_refused_naming_the_sender_and_never_unpickled(
    data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pickle, "loads", _no_pickle)
    with pytest.raises(RuntimeFault, match=rf"^process 3 sent {len(data):,} bytes that are not JSON"):
        decode(data, 3)


def test_a_value_over_the_limit_is_refused_naming_its_process() -> None:
    check_sizes([0, 10, LIMIT_BYTES], LIMIT_BYTES)
    with pytest.raises(RuntimeFault, match=r"^process 1 sent a 11-byte value, over the 10-byte limit"):
        check_sizes([3, 11, 12], 10)
    with pytest.raises(RuntimeFault, match=r"^process 0 sent a -1-byte value"):
        check_sizes([-1, 0], 10)


def test_no_pickle_based_collective_is_left_in_pipeplan() -> None:
    """Every exchange between processes goes through exchange.py: no `*_object` collective in the source."""
    pattern = re.compile(r"\b(all_gather_object|gather_object|broadcast_object_list|scatter_object_list)\b")
    found = [f"{path.relative_to(SRC)}:{n}" for path in SRC.rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]  # fmt: skip
    assert found == []


def test_a_profiled_layer_crosses_as_json_and_reads_back_equal() -> None:
    """prediction's layers cross as dicts of JSON values; tuples (optimizer times, a curve) come back as tuples."""
    from pipeplan.core.layer_profile import LayerCurve, LayerProfile
    from pipeplan.runtime.measurement.prediction import _layer_from, _layer_json

    plain = LayerProfile("fc", 1.25, 2.5, 4096.0, 512.0, bwd_input_ms=1.0, bwd_weight_ms=1.5)
    curved = LayerProfile(
        "fc2", 1.0, 2.0, 64.0, 8.0, optimizer_ms=(("adam", 0.125),),
        curve=LayerCurve((1.0, 2.0), (2.0, 4.0), (64.0, 128.0), (64.0, 128.0)),
    )  # fmt: skip
    for layer in (plain, curved):
        assert _layer_from(json.loads(json.dumps(_layer_json(layer)))) == layer


def _worker(out: str) -> None:
    """Two processes: all_gather_json and gather_json of values, then a value over a small limit from process 1."""
    import torch.distributed as dist

    from pipeplan.runtime.transport.exchange import all_gather_json, gather_json

    pickle.loads = _no_pickle  # type: ignore[assignment]  # nothing here may unpickle
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    seen: dict[str, Any] = {}
    seen["all"] = all_gather_json({"rank": rank, "ms": [0.5 * rank, math.inf], "name": "é" * (rank + 1)})
    seen["to1"] = gather_json([rank, None], dst=1)
    try:
        all_gather_json("x" * (100 if rank == 1 else 1), limit_bytes=50)
    except RuntimeFault as exc:
        seen["refused"] = str(exc)
    seen["after"] = all_gather_json(rank)  # the group still works after a refusal
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1])


@pytest.mark.slow
def test_two_processes_exchange_json_and_refuse_an_oversized_value_alike(tmp_path: Path) -> None:
    from pipeplan.runtime.training.launch import launch_local, run_file

    assert launch_local(2, run_file(__file__), [str(tmp_path)], timeout_s=120) == 0
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    values = [{"rank": 0, "ms": [0.0, math.inf], "name": "é"}, {"rank": 1, "ms": [0.5, math.inf], "name": "éé"}]
    refused = "process 1 sent a 102-byte value, over the 50-byte limit of an exchange between processes; "
    for rank, seen in enumerate(ranks):
        assert seen["all"] == values
        assert seen["to1"] == (None if rank == 0 else [[0, None], [1, None]])
        assert seen["refused"].startswith(refused)
        assert seen["after"] == [0, 1]
