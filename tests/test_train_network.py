"""api.train.training (the network part): the emulated network train checks before any process starts, priced by its
largest message and its replicated stages' all-reduces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeplan.api.train.train_network import largest_message_bytes, network_for_train, stage_allreduces
from pipeplan.io.plan_json import plan_from_json
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.sim.cost.model import CostModel
from test_bad_input import ADAPT_PLAN


def test_the_largest_message_is_the_widest_cut_at_the_microbatch_size() -> None:
    """bert-48 split after layer 26 at microbatch size 2: the profile's cut bytes there; None without a profile."""
    plan = plan_from_json(ADAPT_PLAN)[0]
    model = CostModel.build(load_profile("dapple/bert-48"), load_cluster("v100-8x2-25g"))
    assert largest_message_bytes(plan, "dapple/bert-48", "v100-8x2-25g", "auto") == model.layers.cut_bytes(26, 2)
    assert largest_message_bytes(plan, None, "v100-8x2-25g", "auto") is None
    assert largest_message_bytes(None, "dapple/bert-48", "v100-8x2-25g", "auto") is None


def test_network_for_train_prices_the_message_against_the_timeout() -> None:
    """10 MB over 0.004 GB/s takes 2.5 s: --timeout 3 passes, 2 is refused naming both; unknown bytes are not priced."""
    assert network_for_train(None, 0.004, None, [0, 1], 2, 3.0, 10e6) is not None
    with pytest.raises(TrainConfigError, match=r"takes 2.5 s at 4,000,000 bytes/s, longer than --timeout 2 s"):
        network_for_train(None, 0.004, None, [0, 1], 2, 2.0, 10e6)
    assert network_for_train(None, 0.004, None, [0, 1], 2, 2.0, None) is not None


REPLICATED_PLAN = {**ADAPT_PLAN, "stages": [{"first_layer": 0, "last_layer": 26, "devices": [7, 9]},
                                            {"first_layer": 27, "last_layer": 52, "devices": [8]}]}  # fmt: skip


def test_each_replicated_stage_is_priced_by_its_profile_s_parameter_bytes() -> None:
    """bert-48 with layers 0-26 on devices 7 and 9: that stage's all-reduce moves the sum of those layers' parameter
    bytes over ring [7, 9]; the stage on one device has none; nothing without a profile."""
    plan = plan_from_json(REPLICATED_PLAN)[0]
    profile = load_profile("dapple/bert-48")
    expected = sum(layer.param_bytes for layer in profile.layers[:27])
    ((stage, devices, nbytes),) = stage_allreduces(plan, "dapple/bert-48", "v100-8x2-25g", "auto")
    assert (stage, devices, nbytes) == (0, (7, 9), pytest.approx(expected, rel=1e-12))
    assert stage_allreduces(plan, None, "v100-8x2-25g", "auto") == []


def test_network_for_train_prices_each_all_reduce_on_its_ring_at_the_lowest_factor(tmp_path: Path) -> None:
    """10 MB over a 2-device ring at 0.004 GB/s is 2(n-1)/n x 10 MB / 4 MB/s = 2.5 s: --timeout 3 passes, 2 is refused
    naming the stage, bytes, devices and time; a trace halving link 1->0 makes it 5 s (refused at --timeout 4)."""
    ring = [(0, (0, 1), 10e6)]
    assert network_for_train(None, 0.004, None, [0, 1, 2], 3, 3.0, None, ring) is not None
    refused = (r"^stage 0's data-parallel all-reduce of 10,000,000 bytes over devices \[0, 1\] takes 2.5 s on its "
               r"emulated ring \(--emulate-gb-per-s 0.004\), longer than --timeout 2 s")  # fmt: skip
    with pytest.raises(TrainConfigError, match=refused):
        network_for_train(None, 0.004, None, [0, 1, 2], 3, 2.0, None, ring)
    trace = tmp_path / "slow.json"
    trace.write_text(json.dumps([{"t_ms": 100, "link": [1, 0], "factor": 0.5}, {"t_ms": 100, "link": [1, 2], "factor": 0.1}]))
    with pytest.raises(TrainConfigError, match=r"takes 5 s on its emulated ring \(--emulate-gb-per-s 0.004 x factor 0.5 of "):
        network_for_train(str(trace), 0.004, None, [0, 1, 2], 3, 4.0, None, ring)


@pytest.mark.torch
def test_train_refuses_an_all_reduce_longer_than_the_timeout_before_any_process_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """train --plan (bert-48, stage 0 on 2 devices) at 0.1 GB/s with --timeout 5: exit 2, one line, nothing launched."""
    import pipeplan.runtime.training.launch as launch
    from cli_runner import run

    monkeypatch.setattr(launch, "launch_local", lambda *a, **k: pytest.fail("launched"))
    (tmp_path / "plan.json").write_text(json.dumps(REPLICATED_PLAN))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(monkeypatch, capsys, "train", "--local", "3", "--plan", "plan.json", "--emulate-gb-per-s", "0.1",
                         "--timeout", "5", "--steps", "1")  # fmt: skip
    lines = err.strip().splitlines()
    assert (code, out, len(lines)) == (2, "", 1), err
    assert lines[0].startswith("error: TrainConfigError: stage 0's data-parallel all-reduce of ") and "over devices [7, 9]" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
