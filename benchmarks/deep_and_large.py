"""Deep and large inputs (issue 31, class 4): showing a 52 MB profile and planning 5,000- and 20,000-layer chains.

Usage: .venv/bin/python benchmarks/deep_and_large.py [--runs 3] [--cases D1,D3] [--timeout 300] [--check]

Cases, each a fresh `pipeplan` process (targets from issue 31):
  D1 `show profile` of a valid 52 MB profile/1 whose `notes` hold 52 MB of text           peak <= 10x the file
  D2 `show profile --json` of a 54 MB profile/2: 20,000 layers at 14 batch sizes, I/W      peak <= 10x the file
  D3 `plan` of a 5,000-layer chain on v100-8x1, global batch 256                            <= 6 s CPU
  D4 `plan` of a 20,000-layer chain on v100-8x1, global batch 256                           <= 20 s CPU (docs: "about 20 s")
  D5 `plan --time-budget none` of the 5,000-layer chain on 8,192 H100 (1,024 nodes, described)  <= 60 s CPU (issue 36)
  D6 `plan --time-budget none` of the 20,000-layer chain on 8,192 H100                          <= 60 s CPU (issue 36)
The profiles are made here from a fixed seed. Times are CPU seconds (user + sys of the process, from wait4): on a
shared machine load stretches the wall clock, not the CPU time. Cases run in turn (A B C D A B C D ...); the table
gives medians and the load before and after. --check exits 1 when a target fails.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proc_timing import PIPEPLAN, time_cases
from scale import h100_nodes


def notes_profile(path: Path, notes_bytes: int) -> Path:
    """A valid profile/1 of 100 layers whose free-text `notes` field holds `notes_bytes` characters."""
    layers = [{"name": f"l{i}", "fwd_ms": 1.0, "bwd_ms": 2.0, "activation_bytes": 1000, "param_bytes": 1000} for i in range(100)]
    path.write_text(json.dumps({"name": "notes", "batch_size": 8, "layers": layers, "notes": "n" * notes_bytes}))
    return path


def curves_profile(path: Path, layers: int, sizes: int) -> Path:
    """A valid profile/2 of `layers` layers measured at `sizes` batch sizes, with the I/W split and optimizer steps,
    written indented (as `pipeplan profile` writes it)."""
    rng = random.Random(1)
    batch_sizes = sorted({2**i if i < 7 else 64 * (i - 5) for i in range(sizes)})

    def curve(base: float, whole: bool = False) -> list[float] | list[int]:
        values = [base * b * (1 + 0.01 * rng.random()) for b in batch_sizes]
        return [int(v) for v in values] if whole else values

    rows = []
    for i in range(layers):
        fwd = rng.uniform(0.1, 2.0) / batch_sizes[-1]
        bwd = curve(2 * fwd)
        rows.append({
            "name": f"layer{i}", "fwd_ms": curve(fwd), "bwd_ms": bwd, "bwd_input_ms": [x / 2 for x in bwd],
            "bwd_weight_ms": [x / 2 for x in bwd], "activation_bytes": curve(rng.randint(1000, 100000), True),
            "saved_bytes": curve(rng.randint(1000, 100000), True), "param_bytes": rng.randint(10**5, 10**7),
            "optimizer_ms": {"adam": rng.random(), "sgd": rng.random()}, "flops": None, "bytes_moved": None,
        })  # fmt: skip
    profile = {
        "format": "pipeplan.profile/2", "name": "curves", "batch_size": batch_sizes[0], "batch_sizes": batch_sizes,
        "reference_device": "V100", "measured": True, "threads": None, "source": None,
        "cut_bytes": [curve(rng.randint(1000, 100000), True) for _ in range(layers - 1)], "layers": rows,
    }  # fmt: skip
    path.write_text(json.dumps(profile, indent=2))
    return path


def chain_profile(path: Path, layers: int) -> Path:
    """A profile/1 chain of `layers` layers with random times (0.1-2 ms forward, 0.2-4 ms backward) and sizes
    (10 kB-1 MB activations and parameters), which fits v100-8x1 at global batch 256."""
    rng = random.Random(3)
    rows = [
        {"name": f"l{i}", "fwd_ms": round(rng.uniform(0.1, 2), 4), "bwd_ms": round(rng.uniform(0.2, 4), 4),
         "activation_bytes": rng.randint(10**4, 10**6), "param_bytes": rng.randint(10**4, 10**6)}
        for i in range(layers)
    ]  # fmt: skip
    path.write_text(json.dumps({"name": f"chain-{layers}", "batch_size": 32, "reference_device": "V100", "layers": rows}))
    return path


def make_inputs(folder: Path) -> None:
    """Write the four cases' profiles into `folder`."""
    notes_profile(folder / "notes.json", 52_000_000)
    curves_profile(folder / "curves.json", 20_000, 14)
    chain_profile(folder / "c5k.json", 5_000)
    chain_profile(folder / "c20k.json", 20_000)


def main() -> None:
    """Make the inputs, time every case in turn, print a table with targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="counted rounds")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a run is stopped")
    parser.add_argument("--cases", default=None, help="comma-separated case names to run (default: all)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--make", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make is not None:
        make_inputs(Path(args.make))
        return
    with tempfile.TemporaryDirectory(prefix="pipeplan-deep-") as tmp:
        folder = Path(tmp)
        # made in a child: Linux keeps a process's peak memory across exec, so every timed process forked from a
        # parent that had built the inputs would report the parent's peak
        subprocess.run([sys.executable, __file__, "--make", str(folder)], check=True)
        notes, curves = folder / "notes.json", folder / "curves.json"
        plan = ["plan", "--cluster", "v100-8x1", "--global-batch", "256"]
        # the whole search, not the best plan found within the default time budget: what planning deep costs
        wide = ["plan", "--cluster", h100_nodes(1024, folder), "--global-batch", "256", "--time-budget", "none"]
        cases: list[tuple[str, str, list[str], float | None, float | None]] = [
            ("D1", f"show a {notes.stat().st_size / 1e6:.0f} MB profile (notes)",
             [*PIPEPLAN, "show", "profile", str(notes)], None, 10 * notes.stat().st_size / 2**20),
            ("D2", f"show --json a {curves.stat().st_size / 1e6:.0f} MB profile/2 (20,000 layers x 14 sizes)",
             [*PIPEPLAN, "show", "profile", str(curves), "--json"], None, 10 * curves.stat().st_size / 2**20),
            ("D3", "plan a 5,000-layer chain on v100-8x1",
             [*PIPEPLAN, *plan, "--profile", str(folder / "c5k.json")], 6.0, None),
            ("D4", "plan a 20,000-layer chain on v100-8x1",
             [*PIPEPLAN, *plan, "--profile", str(folder / "c20k.json")], 20.0, None),
            ("D5", "plan a 5,000-layer chain on 8,192 H100 (described)",
             [*PIPEPLAN, *wide, "--profile", str(folder / "c5k.json")], 60.0, None),
            ("D6", "plan a 20,000-layer chain on 8,192 H100 (described)",
             [*PIPEPLAN, *wide, "--profile", str(folder / "c20k.json")], 60.0, None),
        ]  # fmt: skip
        cases, timings = time_cases(cases, args.cases, args.runs, args.timeout, parser.error)
    print("| case | what | CPU s (median) | min | max | wall s (median) | peak MiB (median) | target |")
    print("|---|---|---|---|---|---|---|---|")
    failed = []
    for (name, label, _, seconds, mib), timing in zip(cases, timings, strict=True):
        if not timing.cpu_s:
            print(f"| {name} | {label} | > {args.timeout:g} s wall (stopped) | - | - | - | - | FAIL |")
            failed.append(name)
            continue
        ok = (
            set(timing.codes) == {0}
            and not timing.timed_out
            and (seconds is None or timing.median_cpu() <= seconds)
            and (mib is None or timing.median_peak() <= mib)
        )
        target = f"<= {seconds:g} s CPU" if seconds is not None else f"<= {mib:.0f} MiB"
        if not ok:
            failed.append(name)
        cpu = f"{timing.median_cpu():.2f} | {min(timing.cpu_s):.2f} | {max(timing.cpu_s):.2f}"
        exits = "" if set(timing.codes) == {0} else f" (exit {timing.codes})"
        print(
            f"| {name} | {label} | {cpu} | {timing.median_wall():.2f} | {timing.median_peak():.0f} | "
            f"{target} {'PASS' if ok else 'FAIL'}{exits} |"
        )
    if args.check and failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
