"""Limits on what a user gives pipeplan, each with the reason its refusal quotes: sizes, nesting, magnitudes.

Every size that grows a computation (devices, layers, ranks, actions, batch
sizes, file bytes) and every magnitude that feeds sums and products (times,
bytes, speeds, rates) is bounded where it is read or constructed, so a
request either runs in seconds and megabytes with finite numbers throughout,
or is refused at once with "too large: N, the limit is M, because ...".
docs/troubleshooting.md lists them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeplan.core.errors import PipeplanError


@dataclass(frozen=True, slots=True)
class Limit:
    """A bound (the most, or with `least` the fewest) on a value, its unit for messages, and why."""

    value: float
    unit: str
    because: str
    least: bool = False
    word: str = ""

    def allows(self, value: float) -> bool:
        """Whether value is within the bound (NaN never is)."""
        return bool(value >= self.value) if self.least else bool(value <= self.value)

    def message(self, what: str, value: float) -> str:
        """`what too large: N unit, the limit is M unit, because ...` (too small for a lower bound)."""
        word = self.word or ("small" if self.least else "large")
        unit = f" {self.unit}" if self.unit else ""
        return f"{what} too {word}: {show(value)}{unit}, the limit is {show(self.value)}{unit}, because {self.because}"

    def check(self, error: type[PipeplanError], what: str, value: float) -> None:
        """Raise error with the message unless value is within the bound."""
        if not self.allows(value):
            raise error(self.message(what, value))

    def scaled(self, per_unit: float, unit: str) -> Limit:
        """The same bound in another unit, `per_unit` of this limit's units making one of `unit` (1e9 bytes/s = 1 GB/s)."""
        return Limit(self.value / per_unit, unit, self.because, self.least, self.word)


def show(value: float) -> str:
    """A number for a message: whole numbers with thousands separators, others in %g."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if abs(value) < 10**30 else f"about 10^{int(abs(value).bit_length() * 0.30103)}"
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e16:
        return f"{int(value):,}"
    return f"{value:g}"


# ---- files
FILE_BYTES = Limit(
    128 * 2**20,
    "bytes",
    "an input file is read whole into memory and parsed there (about ten times its size); the largest realistic inputs "
    "(a 1,024-device matrix cluster, a 20,000-layer profile) take a few tens of MB",
)
JSON_DEPTH = Limit(
    32, "levels", "pipeplan's formats nest at most 5 levels, and deeper nesting could exhaust the parser's stack", word="deep"
)
JSON_INT_DIGITS = Limit(
    30,
    "digits",
    "every count and size pipeplan reads is far below 10^30, and converting longer digit strings takes time that grows "
    "with the square of their length",
)

# ---- sizes that grow a computation
DEVICES = Limit(
    131_072,
    "devices",
    "planners and the simulator keep per-device state; pipeplan is measured up to 100,000 devices (BENCHMARKS.md, C8)",
)
LAYERS = Limit(
    20_000,
    "layers",
    "planning time grows with the layers (20,000 layers plan in about 20 s); the deepest built-in profile has 1,251",
)
RANKS = Limit(
    4_096,
    "ranks",
    "the simulator, timelines and rank tables hold per-rank state and the planners build pipelines of at most 64 ranks",
)
ACTIONS = Limit(
    4_000_000,
    "actions",
    "each action costs about 400 bytes to generate and simulate (1.5 GiB at the limit; 1F1B at p=64, m=1024 has 131,072)",
)
MODEL_BYTES = Limit(
    2**35,
    "bytes",
    "a built-in model's weights are built in this process's memory (float32), and measuring or training it holds its "
    "gradients and optimizer state too; the largest built-in, gpt2-xl, has 6.2 GB",
)
TIMELINE_ACTIONS = Limit(
    1_000_000,
    "actions",
    "a timeline (--png, --timeline, pipemare's steady state) keeps every action and draws or writes each: 1,000,000 take "
    "about 25 s and 1.4 GB",
)
BATCH = Limit(
    65_536,
    "samples",
    "the profiler builds and runs a whole batch in memory at once, once per timed round",
)
BATCH_SIZES = Limit(64, "sizes", "every size is measured in full and every layer stores one value per size")
SAMPLES = Limit(
    2**30,
    "samples",
    "no training step holds a billion samples, and sample counts above it stop being exact in the cost model's floats",
)
TRAIN_BATCH = Limit(
    65_536,
    "samples",
    "every process of train builds the whole global batch's inputs in memory at each step (100,000,000 samples asked "
    "for 25.6 GB)",
)
THREADS = Limit(1_024, "threads", "torch starts one OS thread per requested thread (100,000 crashed it)")
ROUNDS = Limit(10_000, "rounds", "every round measures everything once more; beyond this a run takes hours")
SEED = Limit(2**32 - 1, "", "seeds are 32-bit (torch seeds each process with seed x 7919 + rank, which must fit 64 bits)")
TIMEOUT_S = Limit(1e6, "s", "torch.distributed holds a timeout as a timedelta, and 11 days is never meant")
TRACE_STEPS = Limit(
    1_000_000, "steps", "every transfer looks its link's steps up, and a trace is held in memory as Python objects"
)

MAX_FLOPS = Limit(1e30, "FLOP", "sums over every layer must stay finite, and 10^30 FLOP is a million years of an exaflop machine")

# ---- magnitudes: bounded so that sums over all layers, microbatches and iterations stay finite
MAX_MS = Limit(
    1e9,
    "ms",
    "a time above 11 days per layer and microbatch is a unit mistake, and times are summed over every layer, microbatch "
    "and iteration, which must stay finite",
)
MAX_BYTES = Limit(
    1e18, "bytes", "no device holds an exabyte, and bytes are summed over layers and microbatches, which must stay finite"
)
BLOCK_MS = Limit(
    MAX_MS.value * LAYERS.value,
    "ms",
    "a layer value, or the sum of a block of layers a planner merges, adds at most 20,000 layers of at most 1e9 ms",
)
BLOCK_BYTES = Limit(
    MAX_BYTES.value * LAYERS.value,
    "bytes",
    "a layer value, or the sum of a block of layers a planner merges, adds at most 20,000 layers of at most 1e18 bytes",
)
MIN_SPEED = Limit(
    1e-6,
    "",
    "times are divided by the speed: a device a million times slower than the reference is a mistake and its times "
    "would overflow",
    least=True,
)
MAX_SPEED = Limit(1e6, "", "a device a million times faster than the reference is a mistake", least=False)
MIN_BYTES_PER_S = Limit(
    1e3,
    "bytes/s",
    "transfer times are bytes divided by the rate: a link slower than 1 kB/s (10^-6 GB/s) is a mistake and its times "
    "would overflow (0 means no link)",
    least=True,
)
MAX_BYTES_PER_S = Limit(1e18, "bytes/s", "no link moves an exabyte a second (10^9 GB/s)")
MAX_LATENCY_MS = Limit(1e9, "ms", "a latency above 11 days is a unit mistake, and latencies are summed over every message")
MIN_FACTOR = Limit(1e-6, "", "a link slowed more than a million times never finishes its transfer in finite time", least=True)
MAX_FACTOR = Limit(1e6, "", "a link sped up more than a million times is a mistake")
OPTIMIZER_FACTOR = Limit(1000, "", "an optimizer keeps a few copies of the weights (Adam 2, SGD with momentum 1), not thousands")

# ---- work of many iterations (core.work prices a request from its sizes)
SIMULATED_EVENTS = Limit(
    24_000_000,
    "events",
    "simulate --iterations, adapt and plan --trace-iterations simulate each iteration a trace changes (an event is one "
    "action or transfer; a reused or printed iteration counts 10) at about 400,000 events a second: about 60 s",
)
RUN_BYTES = Limit(
    2 * 2**30,
    "bytes",
    "every iteration's figures (about 120 bytes; a controller's decision 600 bytes per candidate k) are kept until "
    "the run ends and printed",
)
EMULATED_BYTES_PER_S = Limit(
    1e4,
    "bytes/s",
    "train waits out each emulated transfer in real time: below 10 kB/s (10^-5 GB/s) a 1 MB activation takes over "
    "a minute and a 10 kB message a second, and the 1e-9 GB/s once accepted waited out --timeout and failed naming "
    "neither (a known message size is also checked against --timeout)",
    least=True,
)
