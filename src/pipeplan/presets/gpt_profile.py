"""An analytic GPT profile: a model config priced by FLOP counts at a GPU's measured matmul rate, bytes in closed form.

`gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200` (more fields below) names one wherever a profile is
named (presets.resolve.load_profile). Its layers are the embedding, each transformer block as two layers (its
attention and its MLP) and the head (final layer norm, logits, loss).

Note:
    FLOPs (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
    SC'21, appendix): a transformer block's forward is 24 B s h^2 + 4 B s^2 h, here its attention
    8 B s h^2 + 4 B s^2 h (QKV and output projections, scores and their product with the values) and its MLP
    16 B s h^2; the logits' forward is 2 B s h V. A backward is twice its forward, and with recomputation each
    block runs its forward once more in its backward. So an iteration is 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
    FLOPs with recomputation and 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) without: the paper's formulas.
    Times are FLOPs / (the GPU's 16-bit peak x its measured matmul fraction), the linear layers' FLOPs at the rate
    of a large matmul, plus the memory-bound operators (layer norms, softmax, GeLU, dropout, bias and residual adds,
    the loss): the bytes each reads and writes (memory_bound_bytes) / the GPU's HBM bandwidth x its measured
    achievable fraction (presets.calibrated.HBM_FRACTIONS; the nominal bandwidth where none is known). The
    attention scores' batched matmuls (Q K^T and the probabilities times V, and the four of their backward), whose
    inner dimension is one head's h / a, are priced at the roofline (Williams, Waterman and Patterson, "Roofline",
    CACM 2009): each the larger of its FLOPs at the matmul rate and its bytes at the HBM rate (attention_core_ms),
    as a head of h / a below the GPU's rate / bandwidth (about 149 FLOP per byte on an A100) leaves them bound by
    the a s^2 b scores they write or read. Kernel launches are not priced (they overlap the GPU's work while the
    CPU runs ahead).

    Bytes (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022, section 4):
    16-bit activations with 1-byte dropout masks. A block saves s b h (34 + 5 a s / h): its attention
    11 s b h + 5 a s^2 b plus its layer norm's 2 s b h, its MLP 19 s b h plus its layer norm's 2 s b h. With full
    recomputation a block keeps only its input, 2 s b h, held by its attention layer. The embedding keeps its
    dropout mask (s b h), the head the final norm's and the projection's inputs (2 s b h each) and the fp32
    logits the loss reads (4 s b V). Each layer's output is one 16-bit s x b x h tensor (the head's: the loss).
    Parameters are counted with their biases and norms; `param_bytes` is 4 bytes per parameter, the fp32 master
    copy, and the profile says so (core.profile.ModelProfile.master_copy), with its gradients as Megatron-LM holds
    them (MAIN_GRADS_OF, ModelProfile.main_grads; NVIDIA/Megatron-LM docs/source/distrib_optimizer.md): under bf16 a
    device holds 16-bit weights (2 bytes), fp32 gradients (4), the master copy (4) and Adam's two moments (8),
    18 bytes per parameter, 6 + 12/d with the distributed optimizer (ZeRO-1), 2 + 16/d under ZeRO-2, and the
    data-parallel exchange moves the fp32 gradients; under fp16 its gradients are 16-bit (2), reduced in 16 bits,
    and copied to fp32 (4) for the update, 20 bytes per parameter, 4 + 16/d and 2 + 18/d (sim.cost.holding). The head
    holds its own copy of the word embedding (Megatron-LM keeps one on the first and one on the last stage); the
    all-reduce that keeps those two equal is not priced.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.core.errors import ClusterError, ProfileError
from pipeplan.core.hardware.devices import GPU_SPECS, gpu_spec
from pipeplan.core.layer_profile import LayerProfile, TensorSplit
from pipeplan.core.limits import BATCH, LAYERS
from pipeplan.core.profile import ModelProfile
from pipeplan.presets.calibrated import HBM_FRACTIONS, MATMUL_FRACTIONS

GPT_PREFIX = "gpt:"
BYTES_16 = 2
"""Bytes of one 16-bit activation element (bf16 or fp16)."""
MASTER_BYTES = 4
"""Bytes a parameter counts for in param_bytes: its fp32 master copy (module note)."""

_INTEGER_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "micro")
_FIELDS = (*_INTEGER_FIELDS, "gpu", "precision", "recompute", "matmul_fraction")
_PRECISIONS = ("bf16", "fp16")
MAIN_GRADS_OF = {"bf16": "fp32", "fp16": "fp32_copy"}
"""The gradients Megatron-LM's update reads under each precision (core.profile.ModelProfile.main_grads): fp32 ones
accumulated and all-reduced in fp32 under bf16 (it forces accumulate_allreduce_grads_in_fp32), 16-bit ones reduced
in 16 bits and copied to fp32 main grads under fp16 (its default)."""
_MOST = {"layers": LAYERS.value // 2 - 1, "hidden": 1 << 20, "heads": 1 << 14, "seq": 1 << 22, "vocab": 1 << 24}


@dataclass(frozen=True, slots=True)
class GptConfig:
    """A GPT model and how it runs: sizes, microbatch size `micro` (B), the GPU whose peak prices it, its precision,
    full recomputation or none, and the matmul fraction (None: the GPU kind's measured one, presets.calibrated).

    Raises:
        ProfileError: a bad field, naming it and its value (parse_gpt_spec prefixes the spec).
    """

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    micro: int = 1
    gpu: str = "A100-80GB"
    precision: str = "bf16"
    recompute: bool = True
    matmul_fraction: float | None = None

    def __post_init__(self) -> None:
        for key in _INTEGER_FIELDS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProfileError(f"{key} must be a whole number >= 1, got {value!r}")
            most = BATCH.value if key == "micro" else _MOST[key]
            if value > most:
                raise ProfileError(f"{key}={value:,} is above the most it may be, {most:,.0f}")
        if self.hidden % self.heads:
            raise ProfileError(f"heads={self.heads} must divide hidden={self.hidden} (each head gets hidden/heads)")
        try:
            object.__setattr__(self, "gpu", gpu_spec(self.gpu).name)
        except ClusterError:  # said as a profile field
            raise ProfileError(f"gpu must be one of {', '.join(GPU_SPECS)}, got {self.gpu!r}") from None
        if self.precision not in _PRECISIONS:
            raise ProfileError(f"precision must be one of {', '.join(_PRECISIONS)}, got {self.precision!r}")
        if not isinstance(self.recompute, bool):
            raise ProfileError(f"recompute must be 1 (full recomputation) or 0 (none), got {self.recompute!r}")
        fraction = self.matmul_fraction
        if fraction is not None and not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
            raise ProfileError(f"matmul_fraction must be a number in (0, 1], got {fraction!r}")
        if fraction is None and self.gpu not in MATMUL_FRACTIONS:
            raise ProfileError(
                f"no measured matmul fraction is known for gpu={self.gpu}; give matmul_fraction=F (0 < F <= 1), "
                "e.g. what `pipeplan probe` measured"
            )

    @property
    def name(self) -> str:
        """The spec that names this config (every field, so two configs never share a name)."""
        fraction = "" if self.matmul_fraction is None else f",matmul_fraction={self.matmul_fraction:g}"
        return (
            f"gpt:layers={self.layers},hidden={self.hidden},heads={self.heads},seq={self.seq},vocab={self.vocab},"
            f"micro={self.micro},gpu={self.gpu},precision={self.precision},recompute={int(self.recompute)}{fraction}"
        )

    def rate_flops_per_ms(self) -> float:
        """FLOPs per millisecond: the GPU's 16-bit peak times the matmul fraction."""
        return gpu_spec(self.gpu).bf16_tflops * 1e12 / 1e3 * self.fraction()

    def memory_bytes_per_ms(self) -> float:
        """Bytes per millisecond a memory-bound operator moves: the GPU's HBM bandwidth times its measured
        achievable fraction (presets.calibrated.HBM_FRACTIONS), the nominal bandwidth where none is known."""
        return gpu_spec(self.gpu).hbm_gb_per_s * 1e9 / 1e3 * HBM_FRACTIONS.get(self.gpu, 1.0)

    def fraction(self) -> float:
        """The matmul fraction in use: the given one, else the GPU kind's measured one."""
        if self.matmul_fraction is not None:
            return self.matmul_fraction
        return MATMUL_FRACTIONS[self.gpu]


def parse_gpt_spec(spec: str) -> GptConfig:
    """A `gpt:key=value,...` spec as a checked GptConfig; layers, hidden, heads, seq and vocab are required.

    Raises:
        ProfileError: one line naming the spec, the field and its value, and what it must be.
    """
    given: dict[str, str] = {}
    for item in spec.removeprefix(GPT_PREFIX).split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ProfileError(f"profile {spec!r}: {item!r} is no key=value; write e.g. gpt:layers=24,hidden=1024,...")
        if key not in _FIELDS:
            raise ProfileError(f"profile {spec!r}: unknown field {key!r}; the fields are {', '.join(_FIELDS)}")
        if key in given:
            raise ProfileError(f"profile {spec!r}: field {key!r} is given twice")
        given[key] = value.strip()
    missing = [k for k in ("layers", "hidden", "heads", "seq", "vocab") if k not in given]
    if missing:
        raise ProfileError(f"profile {spec!r}: missing field(s) {', '.join(missing)}")
    values: dict[str, object] = {key: _whole(given[key]) for key in _INTEGER_FIELDS if key in given}
    if "gpu" in given:
        values["gpu"] = given["gpu"]
    if "precision" in given:
        values["precision"] = given["precision"]
    if "recompute" in given:
        values["recompute"] = {"1": True, "0": False}.get(given["recompute"], given["recompute"])
    if "matmul_fraction" in given:
        values["matmul_fraction"] = _number(given["matmul_fraction"])
    try:
        return GptConfig(**values)  # type: ignore[arg-type]
    except ProfileError as exc:
        raise ProfileError(f"profile {spec!r}: {exc}") from None


def _whole(text: str) -> int | str:
    """The text as an int when it is one (digits only), else the text itself, for GptConfig to refuse."""
    return int(text) if text.isdigit() else text


def _number(text: str) -> float | str:
    """The text as a float when it reads as one, else the text itself, for GptConfig to refuse."""
    try:
        return float(text)
    except ValueError:
        return text


def layer_flops(config: GptConfig) -> dict[str, float]:
    """Forward FLOPs of one microbatch: per layer kind (`embedding`, `attention`, `mlp`, `head`)."""
    b, s, h, v = config.micro, config.seq, config.hidden, config.vocab
    return {
        "embedding": 0.0,
        "attention": 8.0 * b * s * h * h + 4.0 * b * s * s * h,
        "mlp": 16.0 * b * s * h * h,
        "head": 2.0 * b * s * h * v,
    }


def memory_bound_bytes(config: GptConfig) -> dict[str, tuple[float, float]]:
    """Bytes the memory-bound operators of one microbatch read and write: per layer kind, (forward, backward).

    In bytes, with S = s b h, A = a s^2 b (the attention scores, a heads) and L = s b V elements, 2 bytes per 16-bit
    element, 1 per dropout-mask element (Korthikanti et al. 2022's tensors), each operator counted once as
    Megatron-LM's fused kernels run it (bias + GeLU, bias + dropout + residual add, scale + mask + softmax are one
    kernel each; the h-sized biases and norm parameters are left out). An operator's forward reads its input and
    writes its output (and a dropout its mask); its backward reads what it saved (its input, its output for a
    softmax, its mask for a dropout) and the incoming gradient, and writes one gradient. Terms:

    - `attention` forward 11 S + 9 A: layer norm 4 S (read S, write S); scale + mask + softmax 4 A; attention
      dropout 5 A (read, write, mask); bias + dropout + residual add 7 S (read the output and the residual, write,
      mask). Backward 17 S + 11 A: bias + dropout + add 5 S (mask, gradient, write); dropout 5 A; softmax 6 A;
      layer norm 6 S; the sum of the residual's and the norm's gradients 6 S (read two, write one).
    - `mlp` forward 27 S: layer norm 4 S; bias + GeLU 16 S (read 4 S, write 4 S); bias + dropout + add 7 S.
      Backward 41 S: bias + dropout + add 5 S; bias + GeLU 24 S (its saved 4 S input, the 4 S gradient, write
      4 S); layer norm 6 S; the residual's gradient sum 6 S.
    - `embedding` forward 19 S: the word and the position lookups 8 S (each reads its rows and writes them); their
      sum 6 S; dropout 5 S. Backward 17 S: dropout 5 S; each table's scatter-add of the gradient 6 S (read the
      gradient, read and write the rows).
    - `head` forward 4 S + 14 L: the final layer norm 4 S; the logits' cast to fp32 6 L (read 2, write 4 bytes
      per element); softmax and cross-entropy 8 L (read the fp32 logits, write the fp32 softmax it keeps).
      Backward 6 S + 14 L: the loss's gradient 8 L (read the softmax, write an fp32 gradient); its cast back to
      16-bit 6 L; the final layer norm 6 S.

    With recomputation a block's backward also reruns its forward (gpt_profile adds those bytes again).
    """
    b, s, h, a, v = config.micro, config.seq, config.hidden, config.heads, config.vocab
    big_s, big_a, big_l = float(s * b * h), float(a * s * s * b), float(s * b * v)
    return {
        "embedding": (19.0 * big_s, 17.0 * big_s),
        "attention": (11.0 * big_s + 9.0 * big_a, 17.0 * big_s + 11.0 * big_a),
        "mlp": (27.0 * big_s, 41.0 * big_s),
        "head": (4.0 * big_s + 14.0 * big_l, 6.0 * big_s + 14.0 * big_l),
    }


def iteration_flops(config: GptConfig) -> float:
    """FLOPs of one microbatch's forward and backward (with the recomputed forwards): the sum over the layers."""
    flops = layer_flops(config)
    per_block = flops["attention"] + flops["mlp"]
    block_passes = 4.0 if config.recompute else 3.0
    return config.layers * per_block * block_passes + 3.0 * flops["head"]


def tensor_parallel_role(layer_name: str) -> str:
    """What a layer of an analytic GPT profile is, for tensor parallelism (Megatron-LM's split of each):

    - `embedding`: the word and position embeddings; vocab-parallel (the word table split by rows over the group).
    - `attention`: layer norm, then QKV (column-parallel, by heads) and the output projection (row-parallel);
      the norm is replicated.
    - `mlp`: layer norm, then h -> 4h (column-parallel) and 4h -> h (row-parallel); the norm is replicated.
    - `head`: the final layer norm (replicated) and the logits (vocab-parallel, with a parallel cross-entropy).
    """
    role = layer_name.split(".", 1)[0]
    if role not in ("embedding", "attention", "mlp", "head"):
        raise ProfileError(f"layer {layer_name!r} is no layer of an analytic GPT profile")
    return role


def tensor_splits(config: GptConfig) -> dict[str, TensorSplit]:
    """How each layer kind splits over a tensor-parallel group (tensor_parallel_role; core.layer_profile.TP_KINDS),
    with the share of its saved bytes (gpt_profile) each device keeps whole without sequence parallelism:

    - `embedding`: `vocab` over V rows; it saves only its dropout mask, which every device keeps whole (share 1).
    - `attention`: `attention` over the heads. With full recomputation it saves the block's input, whole on every
      device (share 1); without, of its 13 s b h + 5 a s^2 b bytes the norm's and the QKV linear's inputs and the
      output dropout mask, 5 s b h, stay whole (Korthikanti et al. 2022, eq. 2: 10 s b h whole per block).
    - `mlp`: `mlp` over the 4h hidden units; without recomputation 5 of its 21 s b h stay whole (the kind's share;
      with recomputation it saves nothing).
    - `head`: `column` over V (the logits split by vocabulary, a parallel cross-entropy after them): of its
      4 s b h + 4 s b V bytes the final norm's and the projection's inputs, 4 s b h, stay whole.

    and the share of its forward and backward time every device runs whole without sequence parallelism
    (TensorSplit.whole_fwd / whole_bwd: whole_bytes / the layer's time): the memory-bound operators on the
    s x b x h tensors (memory_bound_bytes), which Megatron-LM runs replicated on every rank of the group:

    - `attention` and `mlp`: the layer norm (4 S forward, 6 S backward) and the bias + dropout + residual add (7 S,
      5 S), with the residual's gradient sum (6 S) in the backward: 11 S forward, 17 S backward, plus the 11 S of
      the rerun forward under recomputation (recomputed: the rerun forward's all-reduce runs again too). The
      attention scores' operators (split by heads) and the MLP's bias + GeLU (split over 4h) divide by t.
    - `embedding`: all of it (its lookups, sum and dropout write whole s x b x h tensors on every device).
    - `head`: the final layer norm (4 S forward, 6 S backward); the fp32 logits and the loss split by vocabulary.

    `attention` and `mlp` name their layer norm's 2 h parameters (TensorSplit.norm_bytes, 4 bytes each as param_bytes
    count them), whose gradients sequence parallelism all-reduces over the group.

    Note:
        The position embedding and the norms' parameters are split with their layer's (Megatron-LM replicates
        them): h (s + 7) parameters per device too few, against at least 12 h^2 / t per block.
    """
    b, s, h, a, v = config.micro, config.seq, config.hidden, config.heads, config.vocab
    attention_share = 1.0 if config.recompute else 5.0 * s * b * h / (13.0 * s * b * h + 5.0 * a * s * s * b)
    big_s = float(s * b * h)
    rerun = 11.0 * big_s if config.recompute else 0.0
    whole = {"attention": (11.0 * big_s, 17.0 * big_s + rerun), "mlp": (11.0 * big_s, 17.0 * big_s + rerun)}
    whole["head"] = (4.0 * big_s, 6.0 * big_s)
    shares = {kind: _whole_shares(config, kind, fwd, bwd) for kind, (fwd, bwd) in whole.items()}
    rec = config.recompute
    norm = 2.0 * h * MASTER_BYTES  # its layer norm's weight and bias (sequence parallelism all-reduces their gradients)
    return {
        "embedding": TensorSplit("vocab", v, 1.0, 1.0, 1.0),
        "attention": TensorSplit("attention", a, attention_share, *shares["attention"], recomputed=rec, norm_bytes=norm),
        "mlp": TensorSplit("mlp", 4 * h, None, *shares["mlp"], recomputed=rec, norm_bytes=norm),
        "head": TensorSplit("column", v, h / (h + v), *shares["head"]),
    }


def attention_core_ms(config: GptConfig) -> float:
    """One of the attention scores' batched matmuls of one microbatch at the roofline (module note): max(FLOPs /
    matmul rate, bytes / HBM rate), FLOPs 2 b s^2 h (all heads) and bytes 4 S + 2 A (S = s b h, A = a s^2 b, 16-bit:
    two s x b x h operands read or written and one a x s x s x b scores tensor). The forward runs two (Q K^T, then
    the probabilities times V), the backward four (the gradients of both operands of each)."""
    b, s, h, a = config.micro, config.seq, config.hidden, config.heads
    flops = 2.0 * b * s * s * h
    nbytes = 4.0 * s * b * h + 2.0 * a * s * s * b
    return max(flops / config.rate_flops_per_ms(), nbytes / config.memory_bytes_per_ms())


def layer_times(config: GptConfig, kind: str) -> tuple[float, float]:
    """(forward ms, backward ms) of one layer of `kind` at batch `micro`: the linear layers' FLOPs at the matmul rate,
    the attention scores' matmuls at the roofline (attention_core_ms: 2 forward, 4 backward) and the memory-bound
    bytes at the HBM rate, a block's backward with its rerun forward under recomputation."""
    b, s, h = config.micro, config.seq, config.hidden
    flops = layer_flops(config)[kind]
    fwd_bytes, bwd_bytes = memory_bound_bytes(config)[kind]
    passes = 3.0 if config.recompute and kind in ("attention", "mlp") else 2.0
    if passes == 3.0:  # the recomputed forward
        bwd_bytes += fwd_bytes
    rate, bandwidth = config.rate_flops_per_ms(), config.memory_bytes_per_ms()
    if kind == "attention":  # the projections at the matmul rate, the scores' matmuls at the roofline
        linear, core = 8.0 * b * s * h * h, attention_core_ms(config)
        return linear / rate + 2.0 * core + fwd_bytes / bandwidth, passes * (linear / rate + 2.0 * core) + bwd_bytes / bandwidth
    return flops / rate + fwd_bytes / bandwidth, passes * flops / rate + bwd_bytes / bandwidth


def _whole_shares(config: GptConfig, kind: str, fwd_bytes: float, bwd_bytes: float) -> tuple[float, float]:
    """(whole_fwd, whole_bwd) of a layer kind: the time of `fwd_bytes` / `bwd_bytes` at the HBM rate over the layer's
    forward / backward time (layer_times)."""
    fwd_ms, bwd_ms = layer_times(config, kind)
    bandwidth = config.memory_bytes_per_ms()
    return min(1.0, fwd_bytes / bandwidth / fwd_ms), min(1.0, bwd_bytes / bandwidth / bwd_ms)


def gpt_profile(config: GptConfig) -> ModelProfile:
    """The profile of `config`: 2 l + 2 layers at batch size `micro`, priced on `gpu` (module note)."""
    b, s, h, a, v = config.micro, config.seq, config.hidden, config.heads, config.vocab
    flops = layer_flops(config)
    output = BYTES_16 * s * b * h
    attention_saved = 2.0 * s * b * h if config.recompute else 13.0 * s * b * h + 5.0 * a * s * s * b
    mlp_saved = 0.0 if config.recompute else 21.0 * s * b * h
    backward_passes = 3.0 if config.recompute else 2.0  # the backward, with the recomputed forward
    params = {
        "embedding": v * h + s * h,
        "attention": 4 * h * h + 4 * h + 2 * h,
        "mlp": 8 * h * h + 5 * h + 2 * h,
        "head": v * h + 2 * h,
    }

    splits = tensor_splits(config)

    def layer(name: str, kind: str, saved: float, activation: float, passes: float) -> LayerProfile:
        fwd_ms, bwd_ms = layer_times(config, kind)
        return LayerProfile(
            name=name,
            fwd_ms=fwd_ms,
            bwd_ms=bwd_ms,
            activation_bytes=activation,
            param_bytes=float(MASTER_BYTES * params[kind]),
            saved_bytes=saved,
            flops=(1.0 + passes) * flops[kind],
            tp=splits[kind],
        )

    layers = [layer("embedding", "embedding", float(s * b * h), output, 2.0)]
    for i in range(config.layers):
        layers.append(layer(f"attention.{i}", "attention", attention_saved, output, backward_passes))
        layers.append(layer(f"mlp.{i}", "mlp", mlp_saved, output, backward_passes))
    head_saved = 2.0 * s * b * h + 2.0 * s * b * h + 4.0 * s * b * v
    layers.append(layer("head", "head", head_saved, 4.0 * b, 2.0))
    return ModelProfile(
        name=config.name,
        batch_size=b,
        layers=tuple(layers),
        reference_device=config.gpu,
        measured=False,
        master_copy=True,
        main_grads=MAIN_GRADS_OF[config.precision],
    )
