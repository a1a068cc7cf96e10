"""cli.train_network: the emulated network train checks before any process starts, priced by its largest message."""

from __future__ import annotations

import pytest

from pipeplan.cli.train_network import largest_message_bytes, network_for_train
from pipeplan.io.plan_json import plan_from_json
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.runtime.errors import TrainConfigError
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
