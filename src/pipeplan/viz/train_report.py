"""What `pipeplan train` prints and writes at the end, on process 0: the results first, then the timeline files."""

from __future__ import annotations

import json
import sys
from typing import Any

from pipeplan.core.errors import OutputError
from pipeplan.core.units import bytes_per_s_to_gb_per_s, ms_to_us


def _say(line: str) -> None:
    """One line of the report on stdout, flushed (the job's other ranks print too)."""
    print(line, flush=True)


def report_results(
    report: Any, timeline: str | None, png: str | None, as_json: bool, timeline_option: str = "--timeline"
) -> list[str]:
    """Print the results (the JSON object, or the summary lines), then write the measured timeline's files
    (`timeline_option`: the name the timeline was given by, said when it cannot be written).

    The results are printed before any file is written, so a file that cannot
    be written (a full disk) loses nothing already computed.

    Returns:
        One reason per file that could not be written (empty when all were).
    """
    from pipeplan.io.atomic import write_failure

    print_results(report, as_json)
    failures = []
    for flag, path in ((timeline_option, timeline), ("--png", png)):
        if report.timeline is None or not path:
            continue
        try:
            write_timeline(report, "--png" if flag == "--png" else "--timeline", path)
        except (OSError, OutputError) as exc:
            failures.append(f"{flag} {path!r} not written: {write_failure(exc)}")
            continue
        if flag == timeline_option and not as_json:
            _say(f"timeline:  {timeline}")
    return failures


def write_timeline(report: Any, flag: str, path: str) -> None:
    """Write the measured timeline as Perfetto JSON (--timeline) or a PNG (--png), whole or not at all."""
    if flag == "--timeline":
        from pipeplan.viz.perfetto import write_timeline

        write_timeline(report.timeline, path)
    else:
        from pipeplan.viz.gantt import render_gantt

        render_gantt(report.timeline, path, title=f"measured: {report.schedule.name}")


def print_results(report: Any, as_json: bool) -> None:
    """Process 0's summary: measured against predicted time, or the JSON object when asked."""
    measured = report.measured_ms()
    predicted = report.predicted.iteration_time if report.predicted is not None else None
    step = report.measured_step_ms()
    planned = report.plan_prediction
    if as_json:
        out: dict[str, Any] = {
            "schedule": report.schedule.name,
            "start_step": report.start_step,
            "losses": report.losses,
            "pipeline_ms": report.pipeline_ms,
            "optimizer_ms": report.optimizer_ms,
            "optimizer_ms_by_process": report.optimizer_ms_by_process,
            "step_ms": report.step_ms,
            "measured_step_ms": step,
            "predicted_step_ms": planned.step_ms if planned is not None else None,
            "predicted_memory_bytes": list(planned.memory_bytes) if planned is not None else None,
            "measured_memory_bytes": report.memory_bytes,
            "measured_ms": measured,
            "predicted_ms": predicted,
            "link": None
            if report.link is None
            else {"latency_us": ms_to_us(report.link[0]), "bandwidth_gb_per_s": bytes_per_s_to_gb_per_s(report.link[1])},
        }
        if report.shared:  # a plan that splits tied weights over stages: what is exchanged for them
            out["shared_parameters"] = [c.to_json() for c in report.shared]
        if report.allreduce:  # an emulated network: each replicated stage's all-reduce, measured and nominal
            out["allreduce"] = report.allreduce
        if report.adaptive is not None:  # --adaptive: k per iteration, the controller's decisions
            out["adaptive"] = report.adaptive
        if report.loss_scale is not None:  # --precision fp16: the scale at the end, the steps skipped on every rank
            out |= {"loss_scale": report.loss_scale, "skipped_steps": report.skipped_steps}
        if report.delays is not None:  # pipemare: measured delays per stage (optimizer steps), throughput
            out |= {"delays": report.delays, "samples_per_s": report.samples_per_s}
        if report.evals:
            out |= {"eval": [e.to_json() for e in report.evals], "test_accuracy": report.evals[-1].test_accuracy,
                    "test_loss": report.evals[-1].test_loss}  # fmt: skip
        json.dump(out, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return
    for shared in report.shared:
        _say(f"shared:    {shared.describe()}")
    if step is not None:
        skip = min(report.warmup_steps, max(0, len(report.step_ms) - 1))
        _say(f"measured:  {step:.2f} ms per step (median of steps {skip + 1}-{len(report.step_ms)}: pipeline, "
                   "all-reduce, optimizer)")  # fmt: skip
    if planned is not None and step is not None:
        _say(
            f"predicted: {planned.step_ms:.2f} ms per step (the plan simulated with {planned.profile} and {planned.cluster}, "
            f"before running); measured/predicted = {step / planned.step_ms:.3f}"
        )
    if predicted is not None and measured is not None:
        latency, bandwidth = report.link
        _say(
            f"re-profiled: {predicted:.2f} ms (simulated {report.schedule.name} with every stage profiled where it ran; "
            f"link {ms_to_us(latency):.0f} us, {bytes_per_s_to_gb_per_s(bandwidth):.2f} GB/s) "
            f"against {measured:.2f} ms of pipeline per step; "
            f"ratio {measured / predicted:.3f}"
        )
    for a in report.allreduce or ():
        from pipeplan.viz.tables import format_bytes

        steps = len(a["spans_ms"])
        buckets = int(a.get("buckets", 1))
        cut = f" in {buckets} buckets (first start to last end)" if buckets > 1 else ""
        _say(
            f"all-reduce: stage {a['stage']}'s {format_bytes(a['bytes'])} over devices {a['devices']}{cut}: "
            f"{a['mean_ms']:.2f} ms "
            f"per step on the emulated network (mean of {steps} step{'s' if steps != 1 else ''}), {a['nominal_ms']:.2f} "
            "ms at its nominal rates"
        )
    if report.loss_scale is not None:
        skipped = (
            f"steps {[s + 1 for s in report.skipped_steps]} skipped on every rank (an overflow)"
            if report.skipped_steps
            else "no step skipped"
        )
        _say(f"fp16:      loss scale {report.loss_scale:g} at the end; {skipped}")
    for e in report.evals:
        _say(f"eval:      step {e.step} (epoch {e.epoch:.2f}): test accuracy {e.test_accuracy:.2%}, loss {e.test_loss:.4f}")
    if report.delays is not None:
        _say(f"pipemare:  {report.samples_per_s:.1f} samples/s; measured delays (optimizer steps, stage 0 first) "
                   f"{report.delays}")  # fmt: skip
    if report.adaptive is not None:
        for line in adaptive_lines(report.adaptive):
            _say(line)


def adaptive_lines(adaptive: dict[str, Any]) -> list[str]:
    """The human summary of an adaptive run: k per iteration, each switch with its reason, the controller's cost."""
    ks = adaptive["k"]
    switches = [d for d in adaptive["decisions"] if d["switched"] and d["iteration"] < len(ks)]  # not after the last
    lines = [f"adaptive:  k per step {ks}; {len(switches)} switch{'es' if len(switches) != 1 else ''}"]
    lines += [f"           before step {d['iteration'] + 1}: {d['reason']}" for d in switches]
    if adaptive.get("k_dropped"):
        lines.append(f"           note: the plan's k_choices {adaptive['k_dropped']} do not fit this run's memory limit "
                     f"(the runtime's pipeline): left out; candidates {adaptive['k_choices']}")  # fmt: skip
    decision_ms = [d["decision_ms"] for d in adaptive["decisions"]]
    if decision_ms and adaptive["iteration_ms"]:
        share = sum(decision_ms) / sum(adaptive["iteration_ms"])
        lines.append(
            f"           controller: {max(decision_ms):.2f} ms per decision at most, {share:.2%} of the iterations' time"
        )
    peaks = adaptive.get("peak_memory_bytes_by_k")
    if peaks:
        from pipeplan.viz.tables import format_bytes

        each = ", ".join(f"k={k} {format_bytes(b)}" for k, b in sorted(peaks.items(), key=lambda kv: int(kv[0])))
        lines.append(f"           peak memory per k used (the most any process held): {each}")
    if adaptive.get("setup_ms") is not None:
        when = "before the first step, from the plan" if adaptive.get("built_from") == "plan" else "after the warm-up"
        lines.append(f"           controller built {when} in {adaptive['setup_ms']:.1f} ms (not in any step's time)")
    return lines
