"""Make tests/data/pipedream_original.json.gz: the plans PipeDream's own planner made on the shared profiles.

The original (msr-fiddle/pipedream `optimizer/optimizer_graph_hierarchical.py` at 7db6a1c, unmodified,
CPython 3.11, PYTHONHASHSEED=0) was run on every built-in profile it can plan, over eight 1-GPU servers
(`-n 8 -b 3.125e9`), two 8-GPU servers (`-n 8 2 -b 1e10 3.125e9`) and a 4-GPU straight pipeline
(`-n 4 -b 1e10 --straight_pipeline`), with and without `--activation_compression_ratio 1`, some with
`--use_memory_constraint -s 16GiB`. The runs live outside the repository (RUNS below); this keeps, per run,
only what the tests compare: the flags, the predicted seconds per minibatch, each stage's planner node ids,
replicas per level and level-2 stage, and whether the stage sets stayed the same under PYTHONHASHSEED 1
and 2 (null: not re-run). inception_v3 was planned branch-compressed, as the original's README says
(tests/data/inception_v3_compressed-pbs-128.txt.gz, the input it read).

Run from the repository root: .venv/bin/python tests/data/make_pipedream_original.py RUNS
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from pipeplan.io.graph_txt import profile_name_from_file

HERE = Path(__file__).resolve().parent


def stage_sets(record: dict) -> list[list[str]]:
    """The planner node ids of every stage."""
    return [sorted(s["planner_node_ids"]) for s in record["stages"]]


def level2_groups(record: dict) -> list[int]:
    """Per stage, the index of the level-2 stage holding it (0 everywhere with one level)."""
    out: list[int] = []
    key = None
    for s in record["stages"]:
        group = s.get("level2_group")
        this = None if group is None else tuple(group["states"])
        if out and this is not None and this != key:
            out.append(out[-1] + 1)
        else:
            out.append(out[-1] if out else 0)
        key = this
    return out


def write_gz(path: Path, text: str) -> None:
    """Write `text` gzip-compressed with no timestamp (same input, same bytes)."""
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        out.write(text.encode())


def main(runs: Path) -> None:
    """Write the fixture and the compressed inception input."""
    cases = []
    for path in sorted((runs / "pipedream_plans").glob("*.json")):
        record = json.loads(path.read_text())
        seeds = [json.loads(p.read_text()) for p in sorted((runs / "pipedream_plans_seeds").glob(f"seed*/{path.name}"))]
        source = Path(record.get("planner_input") or record["flags"]["profile"])
        profile = (
            "inception_v3_compressed"
            if "inception" in source.name
            else f"{source.parent.name}/{profile_name_from_file(source.name)}"
        )
        flags = record["flags"]
        cases.append(
            {
                "tag": path.stem,
                "profile": profile,
                "units": flags["all_num_machines"],
                "bandwidths": flags["network_bandwidths_bytes_per_s"],
                "memory": flags["memory_size_bytes"],
                "memory_constraint": flags["use_memory_constraint"],
                "straight": flags["straight_pipeline"],
                "compression": flags["activation_compression_ratio"],
                "predicted_s": record["predicted"]["pipeline_time_per_stage_s"],
                "stages": stage_sets(record),
                "replicas": [s["replicas_per_level"] for s in record["stages"]],
                "groups": level2_groups(record),
                "sinks": sorted(d["id"] for d in record["nodes_not_in_any_stage"]),
                "seed_stable": all(stage_sets(s) == stage_sets(record) for s in seeds) if seeds else None,
            }
        )
    write_gz(HERE / "pipedream_original.json.gz", json.dumps(cases, separators=(",", ":"), sort_keys=True))
    inception = runs / "inputs" / "pipedream" / "inception_v3-pbs-128.txt"
    write_gz(HERE / "inception_v3_compressed-pbs-128.txt.gz", inception.read_text())
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
