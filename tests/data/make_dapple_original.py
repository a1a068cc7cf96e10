"""Make tests/data/dapple_original.json.gz: the plans DAPPLE's own planner made on the shared profiles.

The original (HPGO 0.9.2, the PyPI wheel of the AlibabaPAI/DAPPLE planner, CPython 3.7, PYTHONHASHSEED=0,
`conductor_from_torch_graph_and_seps(profile, pbs, gbs, seps).py_orchestrate()`) was run on 20 built-in profiles
over eight 1-GPU machines (seps [1..8]), two 8-GPU machines ([8, 16], up to 240 states) and one 4-GPU machine
([4]), at global batch 256 and 2048: 112 plans. The runs live outside the repository (RUNS below); this keeps,
per run, what the tests compare: the flags, the predicted speed-up over one GPU, each stage's planner node ids,
GPUs per replica and GPU ids, and HPGO's own order of the states (`order[i]`: the index HPGO gives pipeplan's
state i, recorded by running the planner's embedded graph code with the same hash seed), which its ranking's
index arithmetic depends on.

Run from the repository root: .venv/bin/python tests/data/make_dapple_original.py RUNS
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from pipeplan.io.graph_txt import parse_graph, profile_name_from_file
from pipeplan.planner.baselines.downset_tables import ancestor_masks, downset_states
from pipeplan.planner.baselines.pipedream_graph import graph_of_model_graph, planning_graph
from pipeplan.presets.profiles import builtin_profile_text

HERE = Path(__file__).resolve().parent


def hpgo_order(profile: str, recorded: list[list[str]]) -> list[int]:
    """Per pipeplan state of `profile`, its index in HPGO's order (recorded: each state's maximal node ids)."""
    source, text = builtin_profile_text(profile)
    planning = planning_graph(graph_of_model_graph(parse_graph(text, source)))
    states = downset_states(planning.graph, planning.first)
    anc = ancestor_masks(planning.graph)
    local = {name: i for i, name in enumerate(planning.graph.names)}
    position = {}
    for rank, maximal in enumerate(recorded):
        mask = 0
        for node_id in maximal:
            mask |= anc[local[node_id]]
        position[mask] = rank
    return [position[m] for m in states.masks]


def write_gz(path: Path, text: str) -> None:
    """Write `text` gzip-compressed with no timestamp (same input, same bytes)."""
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        out.write(text.encode())


def main(runs: Path) -> None:
    """Write the fixture."""
    orders = json.loads((runs / "proto" / "fixtures" / "hpgo_state_order.json").read_text())
    cases = []
    for path in sorted((runs / "dapple_plans").glob("*.json")):
        record = json.loads(path.read_text())
        source = Path(record["planner_input"])
        profile = f"{source.parent.name}/{profile_name_from_file(source.name)}"
        flags = record["flags"]
        cases.append(
            {
                "tag": path.stem,
                "profile": profile,
                "seps": flags["seps"],
                "global_batch": flags["global_batch_size"],
                "speedup": record["predicted"]["speedup_over_one_gpu"],
                "stages": [sorted(s["planner_node_ids"]) for s in record["stages"]],
                "units": [s["gpus_per_replica"] for s in record["stages"]],
                "gpus": [s["gpu_ids"] for s in record["stages"]],
                "order": hpgo_order(profile, orders[str(source)]),
            }
        )
    write_gz(HERE / "dapple_original.json.gz", json.dumps(cases, separators=(",", ":"), sort_keys=True))
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
