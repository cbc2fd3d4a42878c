"""How much of the machine a training step uses: the machine's own matmul throughput, measured,
and each step's useful floating-point operations, counted.

Useful work of a LoRA step (a multiply-add is 2 FLOPs):

- forward: every matmul of the model (projections, MLP, output head, attention scores and values);
- activation gradients: the same matmuls again, for the gradient of their inputs;
- LoRA weight gradients: ``2 * r * (in + out)`` per token per adapted layer (A and B).

Not counted: gradients of frozen weights (never computed), the forward a gradient-checkpointed
block repeats in the backward (recompute is overhead, not useful work), elementwise work.
Model FLOPs utilisation (MFU) is useful FLOPs per second over the measured matmul peak.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

# (m, k, n) shapes the throughput probe tries, cheapest first: square, then skinny (many tokens
# through one projection, the shape a training step's matmuls have)
GEMM_SHAPES = ((256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (4096, 1024, 1024),
               (2048, 2048, 2048), (8192, 2048, 2048), (4096, 4096, 4096), (16384, 4096, 4096),
               (8192, 8192, 8192))
_PEAKS: dict[tuple[str, str, tuple[int, int, int]], float] = {}  # (device, dtype, largest shape) -> FLOP/s


@dataclass(frozen=True)
class MachinePeak:
    """The largest matmul throughput measured on a device in one dtype (FLOP/s)."""

    flops_per_s: float
    device: str
    dtype: str
    source: str = "measured gemm"

    def as_dict(self) -> dict[str, Any]:
        return {"peak_flops_per_s": self.flops_per_s, "peak_device": self.device,
                "peak_dtype": self.dtype, "peak_source": self.source}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_bytes(m: int, k: int, n: int, dtype: torch.dtype) -> int:
    """Bytes a probe matmul holds at once: both operands and the product in ``dtype``, plus the
    float32 draw an operand is made from."""
    return (m * k + k * n + m * n) * torch.empty((), dtype=dtype).element_size() + 4 * max(m * k, k * n)


def measure_gemm_peak(device: torch.device | str, dtype: torch.dtype, budget_s: float = 1.0,
                      max_bytes: int | None = None) -> float:
    """The largest FLOP/s a plain matmul reaches on ``device`` in ``dtype`` over :data:`GEMM_SHAPES`
    (each shape timed over repeats; larger shapes are skipped once the budget is spent, and
    shapes needing more than ``max_bytes`` at once are never tried: a run's probe stays inside the
    memory its plan leaves above the weights). Random operands from a private generator: the
    run's random state is untouched. 0.0 when no shape fits ``max_bytes``."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(0)
    best, start = 0.0, time.perf_counter()
    for m, k, n in GEMM_SHAPES:
        if max_bytes is not None and gemm_bytes(m, k, n, dtype) > max_bytes:
            break  # the shapes grow: no later one fits either
        left = budget_s - (time.perf_counter() - start)
        if left <= 0 or (best and 2 * m * k * n / best > left / 4):  # no time for its repeats
            break
        a = torch.rand(m, k, generator=gen, device=device).to(dtype)
        b = torch.rand(k, n, generator=gen, device=device).to(dtype)
        t0 = time.perf_counter()
        torch.mm(a, b)  # warm-up (kernel choice, caches)
        _sync(device)
        once = time.perf_counter() - t0
        reps = max(1, min(50, int(0.1 * budget_s / max(once, 1e-6))))
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        _sync(device)
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - t0))
    return best


def largest_shape(dtype: torch.dtype, max_bytes: int | None) -> tuple[int, int, int] | None:
    """The largest of :data:`GEMM_SHAPES` the probe may try within ``max_bytes``."""
    fit = [s for s in GEMM_SHAPES if max_bytes is None or gemm_bytes(*s, dtype) <= max_bytes]
    return fit[-1] if fit else None


def machine_peak(device: torch.device | str, dtype: torch.dtype, max_bytes: int | None = None,
                 ) -> MachinePeak | None:
    """:func:`measure_gemm_peak`, measured once per device, dtype and largest shape allowed by
    ``max_bytes`` for the process (~1 s); None when not even the smallest shape fits. On CUDA the
    probe's blocks go back to the card after it."""
    device = torch.device(device)
    shape = largest_shape(dtype, max_bytes)
    if shape is None:
        return None
    key = (str(device), str(dtype).removeprefix("torch."), shape)
    if key not in _PEAKS:
        _PEAKS[key] = measure_gemm_peak(device, dtype, max_bytes=gemm_bytes(*shape, dtype))
        if device.type == "cuda":
            torch.cuda.empty_cache()
        log.info("matmul peak on %s in %s (shapes up to %s): %.3g FLOP/s", *key, _PEAKS[key])
    source = "measured gemm" if shape == GEMM_SHAPES[-1] else "measured gemm up to {}x{}x{}".format(*shape)
    return MachinePeak(_PEAKS[key], key[0], key[1], source)


def compute_dtype(mixed_precision: str, model: nn.Module) -> torch.dtype:
    """The dtype a run's matmuls use: the autocast dtype, else the frozen weights' dtype."""
    if mixed_precision in ("bf16", "fp16"):
        return torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    for p in model.parameters():
        if p.is_floating_point() and not p.requires_grad:
            return p.dtype
    return torch.float32


def mfu(flops: float, seconds: float, peak: float | None, processes: int = 1) -> float | None:
    """Useful FLOPs per second over the peak of ``processes`` devices (None without a figure)."""
    if not peak or not seconds or not flops:
        return None
    return flops / seconds / (peak * processes)


# ---------------------------------------------------------------- text: a count from the modules


def causal_pairs(length: int, window: int | None = None, global_tokens: int = 0) -> int:
    """(query, key) pairs a causal row of ``length`` tokens attends to: L(L+1)/2, or with a
    sliding ``window`` each query sees its last ``window`` tokens plus up to ``global_tokens``
    leading ones beyond the window."""
    if window is None or length <= window:
        return length * (length + 1) // 2
    beyond = length - window  # queries whose window starts after token 0
    glob = beyond * (beyond + 1) // 2 if beyond <= global_tokens else \
        global_tokens * (global_tokens + 1) // 2 + (beyond - global_tokens) * global_tokens
    return window * (window + 1) // 2 + beyond * window + glob


@dataclass(frozen=True)
class TextFlops:
    """Per-token and per-pair costs of a decoder with LoRA (FLOPs; see the module's rules).

    Attributes:
        linear_per_token: forward + activation gradient of every frozen projection (4 * in * out).
        lora_per_token: forward, activation and weight gradients of every adapter (6 * r * (in + out)).
        attention_per_pair: scores and values forward (2 matmuls) and backward (4), every layer:
            12 * query heads * head dim * layers per causal (query, key) pair.
    """

    linear_per_token: int
    lora_per_token: int
    attention_per_pair: int

    def step(self, lengths: Sequence[int], window: int | None = None, global_tokens: int = 0) -> int:
        """Useful FLOPs of a step over documents of ``lengths`` real tokens (padding excluded)."""
        tokens = sum(lengths)
        pairs = sum(causal_pairs(n, window, global_tokens) for n in lengths)
        return (self.linear_per_token + self.lora_per_token) * tokens + self.attention_per_pair * pairs


def _lora_layers(model: nn.Module) -> Iterator[nn.Module]:
    from peft.tuners.lora import LoraLayer

    return (m for m in model.modules() if isinstance(m, LoraLayer))


def text_flops(model: nn.Module) -> TextFlops:
    """Counts a causal LM's costs from its modules (the adapted projections and their ranks as
    attached) and its config (layers, query heads, head dim). Embedding lookups cost nothing."""
    inside: set[int] = set()
    linear = lora = 0
    for layer in _lora_layers(model):
        base = layer.get_base_layer()
        inside.update(id(m) for m in layer.modules())
        linear += 4 * base.in_features * base.out_features
        for name in layer.active_adapters:
            if name in layer.r and name in getattr(layer, "lora_A", {}):
                lora += 6 * layer.r[name] * (base.in_features + base.out_features)
    for m in model.modules():
        if isinstance(m, nn.Linear) and id(m) not in inside:
            linear += 4 * m.in_features * m.out_features
    config = model.config
    config = getattr(config, "text_config", None) or config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return TextFlops(linear, lora, 12 * heads * head_dim * config.num_hidden_layers)


# ------------------------------------------------- image: a count on fake tensors, same model


@contextlib.contextmanager
def no_checkpointing(model: nn.Module) -> Iterator[None]:
    """Gradient checkpointing off for the count (its recompute is not useful work), then back."""
    flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in flagged:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in flagged:
            m.gradient_checkpointing = True


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Every module in eval mode, each module's own mode restored after. Dropout only masks
    (no matmul changes), while peft's LoHa / LoKr draw ``torch.rand(1)`` in training mode to
    decide a module dropout, a value fake tensors do not have."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _attention_formulas() -> dict[Any, Callable[..., int]]:
    """Fused attention counted as useful work: scores and values forward (2 matmuls, full rows:
    image attention is not causal) and 4 backward matmuls (torch's own formula counts the flash
    backward's recompute of the scores, a 5th). FlopCounterMode knows no CPU kernel: added."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    forward = lambda q, k, v, *_a, out_shape=None, **_k: fc.sdpa_flop_count(q, k, v)  # noqa: E731
    backward = lambda _g, q, k, v, *_a, out_shape=None, **_k: 2 * fc.sdpa_flop_count(q, k, v)  # noqa: E731
    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
            aten._scaled_dot_product_efficient_attention_backward: backward,
            aten._scaled_dot_product_flash_attention_backward: backward,
            aten._scaled_dot_product_cudnn_attention_backward: backward}


def counted_step_flops(model: nn.Module, loss_fn: Callable[..., torch.Tensor], *inputs: Any) -> int:
    """FLOPs of ``loss_fn(*inputs)`` and its gradients for the model's trainable weights, counted
    by torch's FlopCounterMode on fake copies of the inputs (no arithmetic runs, the model and its
    gradients are untouched). Autograd computes no frozen weight's gradient, so the count is
    forward + activation gradients + trainable weight gradients."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import FlopCounterMode

    trainable = [p for p in model.parameters() if p.requires_grad]
    with no_checkpointing(model), eval_mode(model), FakeTensorMode(allow_non_fake_inputs=True) as fake:
        fakes = tree_map(lambda t: fake.from_tensor(t) if isinstance(t, torch.Tensor) else t, inputs)
        with FlopCounterMode(display=False, custom_mapping=_attention_formulas()) as counter:
            loss = loss_fn(*fakes)
            torch.autograd.grad(loss, trainable, allow_unused=True)
    return int(counter.get_total_flops())
