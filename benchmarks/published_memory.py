"""Published memory per GPU of large-transformer training, and pipeplan's prediction of each figure it can express.

Usage: PYTHONPATH=src .venv/bin/python benchmarks/published_memory.py [--json] [--skip-plan]

Three kinds of published figure, each priced by pipeplan's cost model (pipeplan.sim.cost: plan_costs' static bytes,
memory_per_device) on an analytic profile (pipeplan.presets.gpt_profile) of the source's model:

- model state per parameter (weights, gradients, optimizer state), unsharded and sharded over d copies: Rajbhandari
  et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (SC'20, arXiv 1910.02054),
  Figure 1 (a 7.5B model, K = 12, on 64 copies: 120 / 31.4 / 16.6 / 1.9 GB for baseline / P_os / P_os+g /
  P_os+g+p), and Megatron-LM's docs/source/distrib_optimizer.md (bytes per parameter of its three precision
  layouts without and with the distributed optimizer);
- activation bytes per transformer layer: Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models" (MLSys 2023, arXiv 2205.05198), Table 2, at the model shapes of its Table 3 (22B, 175B,
  530B, 1T; s 2048, t 8) and b 1 (every formula is linear in b);
- measured peak memory of whole runs: torchtitan's docs/performance.md (pytorch/torchtitan at eaea6f6; runs of
  torchtitan 9dec370, 2024-12-26, on H100 96 GB): Llama 3.1 8B, 70B and 405B under FSDP, TP, PP, CP.

Each row says what pipeplan cannot express and how the row is handled: a row pipeplan expresses is compared (error =
predicted / published - 1); one it cannot is skipped with the reason, or priced at the nearest configuration pipeplan
can express (stated) and kept out of the error statistics. Last, pipeplan's own plan of the 70B test (a 70B-class
GPT on 1,024 H100, global batch 1,024, tests/test_tensor_grid.py) with its memory per device against the published
70B figure, split into static bytes and activations (`--skip-plan` leaves it out: it plans for ~20 CPU s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

GIB = float(1 << 30)
ZERO_PAPER = "Rajbhandari et al., ZeRO (SC'20, arXiv 1910.02054), Figure 1"
MEGATRON_DOC = "NVIDIA/Megatron-LM docs/source/distrib_optimizer.md (bytes per parameter table)"
KORTHIKANTI = "Korthikanti et al., Reducing Activation Recomputation (arXiv 2205.05198), Table 2"
TORCHTITAN = "pytorch/torchtitan docs/performance.md @ eaea6f6"
SEVEN_B = "gpt:layers=36,hidden=4096,heads=32,seq=2048,vocab=51200,gpu=H100"
"""A 7.5B GPT (Narayanan et al.'s 7.5B row) for the state rows: bytes per parameter do not depend on the shape."""
PLAN_70B = "gpt:layers=80,hidden=8192,heads=64,seq=4096,vocab=32000,gpu=H100"
"""The 70B test's profile (tests/test_tensor_grid.py): Llama-2-70B-like, multi-head attention, FFN 4h."""


def _static_per_parameter(spec: str, zero: int, d: int, layout: tuple[bool, str] | None = None) -> float:
    """Bytes per parameter pipeplan's cost model holds for the whole model on one stage over d copies at ZeRO `zero`
    (the profile's own layout unless `layout` gives its (master_copy, main_grads): sim.cost.holding)."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.cost.plan_costs import plan_costs

    profile = load_profile(spec)
    if layout is not None:
        profile = dataclasses.replace(profile, master_copy=layout[0], main_grads=layout[1])
    model = CostModel.build(profile, load_cluster(f"dgx-h100-8x{max(1, d // 8)}"))
    plan = Plan((Stage(0, profile.num_layers - 1, tuple(range(d))),), 1, 1, d, "1f1b", zero=zero if d > 1 else 0)
    parameters = sum(layer.param_bytes for layer in profile.layers) / 4  # param_bytes: 4 bytes per parameter
    return plan_costs(plan, model).stages[0].static_bytes / parameters


def state_rows() -> list[dict[str, Any]]:
    """ZeRO's Figure 1 and Megatron-LM's bytes-per-parameter table against pipeplan's static bytes."""
    rows: list[dict[str, Any]] = []
    psi, d = 7.5e9, 64
    figure = (("baseline (no sharding)", 0, 120.0), ("P_os (ZeRO-1)", 1, 31.4), ("P_os+g (ZeRO-2)", 2, 16.6))
    for label, zero, published in figure:  # ZeRO's count: 16-bit gradients (main_grads "weights")
        predicted = _static_per_parameter(SEVEN_B, zero, d, (True, "weights")) * psi / 1e9
        rows.append(
            _row(ZERO_PAPER, f"7.5B on 64 copies, {label}", "GB", published, predicted, f"zero {zero}, main_grads weights")
        )
    rows.append(_row(ZERO_PAPER, "7.5B on 64 copies, P_os+g+p (ZeRO-3)", "GB", 1.9, None,
                     skipped="pipeplan shards optimizer state (zero 1) and gradients (zero 2), never the weights"))  # fmt: skip
    layouts = (  # the gpt: profile's own layout under bf16 (fp32) and under fp16 (fp32_copy)
        ("bf16 param, fp32 grads", 18.0, (6.0, 12.0), (True, "fp32")),
        ("fp16 param, fp16 grads", 20.0, (4.0, 16.0), (True, "fp32_copy")),
        ("fp32 param, fp32 grads", 16.0, (8.0, 8.0), (False, "weights")),
    )
    for label, plain, (kept, sharded), master in layouts:
        how = f"main_grads {master[1]}" if master[0] else "weights are the master"
        unsharded = _static_per_parameter(SEVEN_B, 0, 1, master)
        rows.append(_row(MEGATRON_DOC, f"{label}, non-distributed", "B/param", plain, unsharded, how))
        for copies in (8, 64):
            published = kept + sharded / copies
            predicted = _static_per_parameter(SEVEN_B, 1, copies, master)
            rows.append(_row(MEGATRON_DOC, f"{label}, distributed optimizer, d {copies}", "B/param", published, predicted, how))
    return rows


KORTHIKANTI_SHAPES = (("22B", 6144, 64), ("175B", 12288, 96), ("530B", 20480, 128), ("1T", 25600, 160))
"""(name, hidden h, heads a) of Korthikanti et al.'s Table 3 models; s 2048, t 8 for all."""


def _block_saved(h: int, a: int, s: int, t: int, sp: bool, recompute: bool) -> float:
    """Saved bytes one device of a group of t keeps for one transformer block (its attention and MLP layers) at b 1:
    pipeplan's cost model's stage cost (sim.cost.plan_costs.stage_cost, the function plan_costs prices each stage
    with) of a stage holding that one block, the embedding and the head on stages of their own."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.presets.gpt_profile import GptConfig, gpt_profile
    from pipeplan.presets.resolve import load_cluster
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.cost.plan_costs import stage_cost

    config = GptConfig(layers=1, hidden=h, heads=a, seq=s, vocab=51200, micro=1, gpu="A100-80GB", recompute=recompute)
    model = CostModel.build(gpt_profile(config), load_cluster("dgx-a100-8x2"))
    block = tuple(range(1, t + 1))
    stages = (Stage(0, 0, (0,)), Stage(1, 2, block, tp=t, sequence_parallel=sp), Stage(3, 3, (t + 1,)))
    return stage_cost(Plan(stages, 1, 1, 1, "1f1b"), model, 1).saved_bytes


def activation_rows() -> list[dict[str, Any]]:
    """Korthikanti et al.'s per-layer activation formulas against pipeplan's saved bytes of one block."""
    rows: list[dict[str, Any]] = []
    s, b, t = 2048, 1, 8
    for name, h, a in KORTHIKANTI_SHAPES:
        sbh, score = s * b * h, 5 * a * s / h
        cases = (
            ("no parallelism", 1, False, False, sbh * (34 + score)),
            ("tensor parallel", t, False, False, sbh * (10 + 24 / t + score / t)),
            ("tensor + sequence parallel", t, True, False, sbh * (34 + score) / t),
            ("full recomputation", 1, False, True, 2.0 * sbh),
        )
        for label, degree, sp, recompute, published in cases:
            predicted = _block_saved(h, a, s, degree, sp, recompute)
            rows.append(_row(KORTHIKANTI, f"{name} layer, {label}", "MiB", published / 2**20, predicted / 2**20))
        for label in ("tensor parallel + selective recomputation", "tensor + sequence parallel + selective"):
            rows.append(_row(KORTHIKANTI, f"{name} layer, {label}", "MiB", None, None,
                             skipped="pipeplan recomputes a block fully or not at all"))  # fmt: skip
    return rows


TITAN_SKIPPED = (
    ("Table 1: Llama 3.1 8B, FSDP 8, b 2, selective AC", 82.4),
    ("Table 3: Llama 3.1 8B, FSDP 128, b 2, selective AC", 67.0),
    ("Table 5: Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, b 32, full AC, fp8, 1F1B", 82.5),
    ("Table 5: Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, b 32, full AC, fp8, interleaved 1F1B", 72.7),
)
TITAN_REASONS = {
    "8B": "selective activation checkpointing (pipeplan: full or none) and FSDP (ZeRO-3: pipeplan stops at 2)",
    "405B": "FSDP (ZeRO-3) and fp8; the microbatch count of its pipeline is not given",
}
TITAN_70B = "gpt:layers=80,hidden=8192,heads=64,seq=8192,vocab=128256,micro=16,gpu=H100,recompute=1"
"""The nearest analytic profile of Llama 3.1 70B as torchtitan's Table 4 runs it: 80 blocks, h 8192, 64 heads, s 8192,
V 128,256, local batch 16 as one microbatch, full recomputation (GPT-shaped: multi-head K/V and an FFN of 4h where
Llama 3.1 has 8 K/V heads and SwiGLU of 28,672: 66.5B parameters counted against its 70.6B)."""


def titan_rows() -> list[dict[str, Any]]:
    """torchtitan's measured peaks: the 70B row at its nearest expressible plan, the others skipped with the reason."""
    from pipeplan.core.plan import Stage
    from pipeplan.planner.baselines.megatron import GridPoint, megatron_plan
    from pipeplan.planner.request import PlanRequest
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.sim.cost.memory import memory_per_device

    rows = []
    for label, published in TITAN_SKIPPED:
        reason = TITAN_REASONS["8B" if "8B" in label else "405B"]
        rows.append(_row(TORCHTITAN, label, "GiB", published, None, skipped=reason))
    request = PlanRequest(load_profile(TITAN_70B), load_cluster("dgx-h100-8x32"), 512, microbatch_size=16)
    plan = megatron_plan(request, GridPoint(8, 1, 32, 16))
    stages = tuple(Stage(x.first_layer, x.last_layer, x.devices, tp=x.tp, sequence_parallel=True) for x in plan.stages)
    plan = dataclasses.replace(plan, stages=stages, zero=2)
    total, static, active = fullest(plan, request.model)
    assert total == max(memory_per_device(plan, request.model))
    predicted = total / GIB
    how = (
        f"nearest: t 8 x d 32, SP, zero 2 for FSDP, full recomputation, b 16, no fp8 ({static / GIB:.1f} static + "
        f"{active / GIB:.1f} activations; not in the error statistics)"
    )
    for label, published in (("2D", 71.9), ("2D + AsyncTP", 67.6)):
        name = f"Table 4: Llama 3.1 70B, FSDP 32 x TP 8, b 16, s 8192, full AC, fp8, {label}"
        rows.append(_row(TORCHTITAN, name, "GiB", published, predicted, how, compared=False))
    return rows


def fullest(plan: Any, model: Any) -> tuple[float, float, float]:
    """(bytes, static bytes, activation peak) of the plan's fullest rank (sim.cost.memory.rank_memory's two parts:
    weights, gradients and optimizer state of its stages, and the saved bytes of its in-flight microbatches)."""
    from pipeplan.schedules.plan_schedule import plan_schedule
    from pipeplan.sim.cost.memory import order_peak_activation
    from pipeplan.sim.cost.plan_costs import plan_costs

    costs = plan_costs(plan, model)
    p = plan.num_ranks
    static = [sum(c.static_bytes for s, c in enumerate(costs.stages) if s % p == r) for r in range(p)]
    active = order_peak_activation(plan_schedule(plan), tuple(c.saved_bytes for c in costs.stages))
    rank = max(range(p), key=lambda r: static[r] + active[r])
    return static[rank] + active[rank], static[rank], active[rank]


def plan_70b() -> dict[str, Any]:
    """pipeplan's plan of the 70B test (`plan`'s pipeplan planner, no time budget) and its fullest device: static bytes
    (weights, gradients, optimizer state) and the activation peak."""
    from pipeplan.api.planning import plan_request
    from pipeplan.planner.planners import run_planner

    request = plan_request(PLAN_70B, "dgx-h100-8x128", 1024, time_budget_s=None)
    result = run_planner("pipeplan", request)
    plan = result.plan
    total, static, active = fullest(plan, request.model)
    stage = plan.stages[0]
    return {
        "plan": f"t {stage.tp} x p {plan.num_ranks} x d {plan.data_parallel_of(0)}, zero {plan.zero}, "
        f"sp {int(stage.sequence_parallel)}, b {plan.microbatch_size}, {plan.schedule} v {plan.chunks}",
        "iteration_ms": result.iteration_time,
        "memory_gib": total / GIB,
        "static_gib": static / GIB,
        "activation_gib": active / GIB,
        "zero_reason": result.extra.get("tensor", {}).get("zero_reason"),
    }


def _row(
    source: str,
    name: str,
    unit: str,
    published: float | None,
    predicted: float | None,
    how: str = "",
    skipped: str = "",
    compared: bool = True,
) -> dict[str, Any]:
    """One row: error = predicted / published - 1 where both are known and the row is compared."""
    error = predicted / published - 1 if compared and predicted is not None and published else None
    return {"source": source, "name": name, "unit": unit, "published": published, "predicted": predicted,
            "error": error, "how": how, "skipped": skipped}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--skip-plan", action="store_true", help="leave out planning the 70B test (~20 CPU s)")
    args = parser.parse_args(argv)
    rows = state_rows() + activation_rows() + titan_rows()
    planned = None if args.skip_plan else plan_70b()
    if args.json:
        print(json.dumps({"rows": rows, "plan_70b": planned}, indent=2))
        return 0
    for row in rows:
        published = "-" if row["published"] is None else f"{row['published']:.4g}"
        predicted = "-" if row["predicted"] is None else f"{row['predicted']:.4g}"
        error = "-" if row["error"] is None else f"{row['error']:+.1%}"
        note = f"skipped: {row['skipped']}" if row["skipped"] else row["how"]
        print(f"{row['name']:<78} {row['unit']:>7} {published:>9} {predicted:>9} {error:>8}  {note}")
    compared = [row for row in rows if row["error"] is not None]
    worst = max(compared, key=lambda row: abs(row["error"]))
    print(f"{len(compared)} rows compared; worst {worst['name']} ({worst['error']:+.1%})")
    if planned is not None:
        print(f"70B test plan: {planned['plan']}: {planned['iteration_ms']:.1f} ms, fullest device "
              f"{planned['memory_gib']:.1f} GiB ({planned['static_gib']:.1f} static + {planned['activation_gib']:.1f} "
              f"activations); {planned['zero_reason']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
