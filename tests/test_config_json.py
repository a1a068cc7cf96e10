"""runtime.training.config_json: a TrainConfig through its JSON text (what the --local launcher hands its workers)
comes back equal, for plans (adaptive, with a layer order, with an order of their own) and schedule layouts, with the
files' contents it carries (TrainConfig.loaded: a profile, clusters, a schedule file's schedule, a trace's steps)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.torch  # runtime.training imports torch's modules (make test-fast leaves it out)

torch = pytest.importorskip("torch")

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep  # noqa: E402
from pipeplan.core.plan import AdaptiveSetting, Plan, Stage  # noqa: E402
from pipeplan.core.schedule import Action  # noqa: E402
from pipeplan.io.schedule_io import schedule_from_csv, schedule_to_csv  # noqa: E402
from pipeplan.presets.resolve import load_cluster, load_profile  # noqa: E402
from pipeplan.runtime.execution.job import ScheduleLayout  # noqa: E402
from pipeplan.runtime.options import AsyncSettings  # noqa: E402
from pipeplan.runtime.rank_errors import TrainConfigError  # noqa: E402
from pipeplan.runtime.training.config_json import config_from_json, config_to_json  # noqa: E402
from pipeplan.runtime.training.train_config import TrainConfig  # noqa: E402
from pipeplan.runtime.transport.network import NetworkSettings  # noqa: E402
from pipeplan.schedules import make_schedule  # noqa: E402

STAGES = (Stage(0, 1, (0,)), Stage(2, 3, (1, 2)))
PLANS = [
    Plan(STAGES, 1, 4, 8, "1f1b"),
    Plan(STAGES, 1, 4, 8, "kfkb", k=2, adaptive=AdaptiveSetting((1, 2, 4), 1e9)),
    Plan(STAGES, 1, 4, 8, "gpipe", layer_order=(0, 2, 1, 3)),
    Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, 4, "custom",
         order=((Action(0, "F", 0), Action(0, "F", 1), Action(0, "B", 0), Action(0, "B", 1)),
                (Action(1, "F", 0), Action(1, "B", 0), Action(1, "F", 1), Action(1, "B", 1)))),
]  # fmt: skip
PROFILES = st.sampled_from([load_profile("dapple/amoeba-6-simplified"), load_profile("pipedream/alexnet")])
CLUSTERS = st.sampled_from([load_cluster("v100-8x1"), load_cluster("hetero-a100-v100")])
READ_SCHEDULES = st.sampled_from(
    [  # a schedule file's schedule as the launcher read it: generated, or a CSV's
        make_schedule("1f1b", 2, 4),
        schedule_from_csv(schedule_to_csv(make_schedule("zb-h1", 3, 5)), "order.csv", name="order.csv"),
    ]
)
LAYOUTS = st.builds(ScheduleLayout, st.sampled_from(["1f1b", "kfkb", "gpipe", "order.csv"]), st.integers(1, 4),
                    st.integers(1, 8), st.sampled_from([8, 64]), st.integers(1, 3), st.just(1),
                    st.none() | st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple),
                    file_schedule=st.none() | READ_SCHEDULES)  # fmt: skip
TRACES = st.lists(
    st.tuples(st.floats(0.0, 1e6), st.none() | st.tuples(st.integers(0, 3), st.integers(4, 7)), st.floats(0.01, 1.0)),
    min_size=1,
    max_size=4,
).map(lambda rows: BandwidthTrace(tuple(TraceStep(t, link, f) for t, link, f in sorted(rows, key=lambda r: r[0]))))
WORDS = st.text("abc/._-", min_size=1, max_size=8)
CONFIGS = st.builds(
    TrainConfig,
    plan=st.none(),
    layout=LAYOUTS,
    module=st.sampled_from(["mlp", "transformer", "pkg.mod:build"]),
    module_options=st.lists(
        st.tuples(st.sampled_from(["hidden", "blocks"]), st.integers(1, 64) | WORDS), max_size=2, unique_by=lambda kv: kv[0]
    ).map(tuple),
    steps=st.integers(1, 99),
    lr=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31),
    timeline=st.booleans(),
    profile=st.none() | WORDS,
    cluster=st.none() | WORDS,
    profile_value=st.none() | PROFILES,
    cluster_value=st.none() | CLUSTERS,
    network=st.none()
    | st.builds(
        NetworkSettings,
        st.none() | WORDS,
        st.none() | st.floats(0.5, 100.0),
        st.none() | WORDS,
        st.none() | TRACES,
        st.none() | CLUSTERS,
    ),
    memory_budget_bytes=st.none() | st.floats(1.0, 1e12),
    data=st.none() | WORDS,
    eval_fraction=st.floats(0.0, 0.5),
)


def through_text(config: TrainConfig) -> TrainConfig:
    """`config` to JSON text and back, as a worker reads it."""
    return config_from_json(json.loads(json.dumps(config_to_json(config))))


@settings(max_examples=60, deadline=None)
@given(CONFIGS)
def test_a_layout_s_config_comes_back_equal(config: TrainConfig) -> None:
    """Any schedule layout's config, with any of the other fields drawn, comes back equal."""
    assert through_text(config) == config


@pytest.mark.parametrize("plan", PLANS, ids=["1f1b", "adaptive", "layer-order", "own-order"])
def test_a_plan_s_config_comes_back_equal(plan: Plan) -> None:
    """A plan (adaptive, with a layer order, with its own order) comes back as the same value, its path beside it."""
    config = TrainConfig(plan=plan, plan_path="runs/plan.json", module_options=(("hidden", "16"),),
                         asynchronous=None, evaluate=True, epochs=2)  # fmt: skip
    assert through_text(config) == config


def test_pipemare_s_settings_come_back_equal() -> None:
    """An asynchronous run's switches come back as the same AsyncSettings."""
    layout = ScheduleLayout("pipemare", 2, 4, 64, minibatches=10, sync_minibatches=1)
    config = TrainConfig(layout=layout, asynchronous=AsyncSettings(5, 0.5, 1, False))
    assert through_text(config) == config


def test_an_unknown_field_is_refused() -> None:
    """A key that names no field (another version's launcher) is refused, naming it."""
    obj = config_to_json(TrainConfig(layout=ScheduleLayout("1f1b", 2, 4, 64)))
    with pytest.raises(TrainConfigError, match="no field 'trace'"):
        config_from_json({**obj, "trace": True})
