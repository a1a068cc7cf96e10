"""The pipedream baseline against the original planner's own plans on the shared profiles (tests/pipedream_cases).

The default suite checks a representative subset (every setup on the small chains and DAGs, ResNet, GNMT and
SqueezeNet DAGs over one and two levels); benchmarks/pipedream_original.py checks all 214 runs.
"""

from __future__ import annotations

import pytest

from pipedream_cases import REL, Case, case, cases, original_value_ms, planned, planning_sets

SMALL = ("pipedream/alexnet", "pipedream/vgg16", "dapple/bert-24", "dapple/amoeba-18", "dapple/xlnet-24",
         "dapple/gnmt-32-simplified", "dapple/amoeba-6-complicated")  # fmt: skip
DAGS = (
    "resnet50-pbs-128__a8x1__acts", "resnet50-pbs-128__a8x1__noacts", "resnet18-pbs-256__b8x2__noacts",
    "squeezenet1_0-pbs-256__b8x2__acts", "gnmt-pbs-64__b8x2__noacts", "gnmt-pbs-64__a8x1-mem16__acts",
    "resnext50-pbs-128__c4straight__acts", "resnet101-pbs-64__c4straight-mem16__acts",
)  # fmt: skip
SUBSET = [c.tag for c in cases() if c.profile in SMALL] + list(DAGS)


def check_case(c: Case) -> None:
    """The baseline predicts the original's time; its plan is the original's where the optimum has no tie, and the
    original's plan is worth the same time under the baseline's terms everywhere."""
    mine = planned(c.tag)
    assert mine.predicted_ms == pytest.approx(c.predicted_ms, rel=REL)
    assert original_value_ms(c) == pytest.approx(mine.predicted_ms, rel=REL)
    if mine.unique:
        ours, theirs = planning_sets(c, mine)
        assert ours == theirs
        assert tuple(s.replicas_per_level for s in mine.stages) == c.replicas


@pytest.mark.parametrize("tag", SUBSET)
def test_pipedream_baseline_equals_the_original(tag: str) -> None:
    """Same predicted time (1e-9 relative), same stage node sets and replicas per level where tie-free."""
    check_case(case(tag))


def test_subset_covers_setups_and_has_tie_free_cases() -> None:
    """The subset spans one and two levels, straight, both activation settings and the memory rule, and at least
    a third of it is tie-free (stage sets compared, not only times)."""
    chosen = [case(t) for t in SUBSET]
    assert {len(c.options.units) for c in chosen} == {1, 2}
    assert any(c.options.straight for c in chosen) and any(c.options.memory_constraint for c in chosen)
    assert {c.options.compression for c in chosen} == {None, 1.0}
    assert sum(planned(c.tag).unique for c in chosen) * 3 >= len(chosen)


def test_a_case_whose_stages_move_with_the_hash_seed_is_a_tie() -> None:
    """Where the original's stage sets changed with PYTHONHASHSEED, the baseline reports its optimum as tied."""
    moved = [c for c in cases() if c.seed_stable is False and c.tag in SUBSET]
    assert moved
    assert not any(planned(c.tag).unique for c in moved)
