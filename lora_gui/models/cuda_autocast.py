"""CUDA's autocast, applied to tensors on any device: how a plan made on a CPU traces a GPU step.

A run on a GPU trains its 16-bit model under autocast (accelerate's mixed precision): matmuls
and convolutions run in the 16-bit dtype, while norms, softmax, ``pow``, ``exp``, sums and the
losses run in float32, and their float32 outputs flow on (a LayerNorm's output, a modulated
DiT input, a GroupNorm read by SiLU), and each 16-bit matmul makes its own cast copy of them,
which autograd keeps when an adapter's weight needs it. A trace without autocast keeps 16-bit
tensors there: up to a third less than the card holds (SD 1.5 at 512 px).

torch's ``torch.autocast("cuda")`` is switched off where CUDA is absent, and the planner's fake
tensors are CPU tensors, so :class:`CudaAutocast` applies CUDA's cast rules itself, as a
``TorchFunctionMode``: the ops in its lists get their floating arguments cast the way CUDA's
autocast casts them (``tests/models/test_cuda_autocast.py`` checks every listed op and several
unlisted ones against torch's own CUDA autocast kernels, which do run on fake CUDA tensors).
Like autocast, a cast of a trainable leaf (an adapter's weight) is made once per forward.

Not emulated: ops inside torch functions implemented in Python that are not in the lists (their
inner calls are not seen; none in the models planned here casts), and regions a model runs with
``torch.autocast(..., enabled=False)`` (transformers' rotary embedding: a small float32 product
of positions by frequencies, planned in 16 bits).

:func:`autocast_dtype` and :func:`same_autocast` answer for the real autocast and this one alike,
so layers that recompute in the backward (:mod:`lora_gui.models.lean_backward`, checkpointing)
recompute under what their forward ran.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_T = torch.Tensor
HALF = (torch.float16, torch.bfloat16)

# run in the autocast dtype (CUDA's "lower_precision_fp" list)
LOWER: frozenset[Any] = frozenset({
    F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
    F.prelu, F.scaled_dot_product_attention, torch.conv1d, torch.conv2d, torch.conv3d,
    torch.matmul, _T.matmul, _T.__matmul__, _T.__rmatmul__, torch.mm, _T.mm, torch.bmm, _T.bmm,
    torch.baddbmm, _T.baddbmm, torch.addmm, _T.addmm, torch.addbmm, _T.addbmm, torch.mv, _T.mv,
    torch.addmv, _T.addmv, torch.einsum,
})
# run in float32 ("fp32" list)
FLOAT32: frozenset[Any] = frozenset({
    F.layer_norm, torch.layer_norm, F.group_norm, torch.group_norm, F.rms_norm, torch.rms_norm,
    torch.exp, _T.exp, torch.expm1, _T.expm1, torch.log, _T.log, torch.log2, _T.log2, torch.log10,
    _T.log10, torch.log1p, _T.log1p, torch.reciprocal, _T.reciprocal, torch.rsqrt, _T.rsqrt,
    torch.pow, _T.pow, _T.__pow__, _T.__rpow__, _T.__rtruediv__, _T.__rdiv__, torch.square, _T.square,
    torch.acos, _T.acos, torch.asin, _T.asin, torch.cosh, _T.cosh, torch.sinh, _T.sinh, torch.tan, _T.tan,
    torch.erfinv, _T.erfinv, F.softplus, F.cosine_similarity, torch.norm, _T.norm,
    torch.linalg.vector_norm, torch.linalg.matrix_norm, F.normalize, torch.dist, _T.dist, torch.renorm,
    _T.renorm, torch.logsumexp, _T.logsumexp, torch.cdist,
    F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.nll_loss, F.cross_entropy, F.kl_div,
    F.binary_cross_entropy_with_logits,
})
# run in float32 except in mode "area" (an adaptive average pool): the upsampling kernels
INTERPOLATE = F.interpolate
# run in float32 unless a ``dtype`` is given ("fp32_set_opt_dtype" list)
FLOAT32_UNLESS_DTYPE: frozenset[Any] = frozenset({
    torch.softmax, _T.softmax, F.softmax, torch.log_softmax, _T.log_softmax, F.log_softmax,
    torch.sum, _T.sum, torch.prod, _T.prod, torch.cumsum, _T.cumsum, torch.cumprod, _T.cumprod,
})

_ACTIVE = threading.local()  # the innermost CudaAutocast of this thread


class CudaAutocast(TorchFunctionMode):
    """CUDA autocast's casts to ``dtype`` (bf16 or fp16) on tensors of any device."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        if dtype not in HALF:
            raise ValueError(f"autocast dtype must be float16 or bfloat16, got {dtype}")
        self.dtype = dtype
        self._leaf_casts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (leaf, its cast)

    def __enter__(self) -> CudaAutocast:
        self._outer = getattr(_ACTIVE, "mode", None)
        _ACTIVE.mode = self
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.mode = self._outer
        self._leaf_casts.clear()  # as autocast's cast cache, emptied when the region ends
        super().__exit__(*exc)

    def _lower(self, t: Any) -> Any:
        if isinstance(t, (list, tuple)):
            return type(t)(self._lower(x) for x in t)
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype == self.dtype:
            return t
        if t.is_leaf and t.requires_grad:  # a trainable weight: cast once per region
            hit = self._leaf_casts.get(id(t))
            if hit is None or hit[0] is not t:
                hit = self._leaf_casts[id(t)] = (t, t.to(self.dtype))
            return hit[1]
        return t.to(self.dtype)

    @staticmethod
    def _float32(t: Any) -> Any:
        if isinstance(t, (list, tuple)):
            return type(t)(CudaAutocast._float32(x) for x in t)
        return t.float() if isinstance(t, torch.Tensor) and t.dtype in HALF else t

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch API)
        kwargs = kwargs or {}
        if func in LOWER:
            args, kwargs = self._lower(tuple(args)), {k: self._lower(v) for k, v in kwargs.items()}
        elif _in_float32(func, args, kwargs):
            args, kwargs = self._float32(tuple(args)), {k: self._float32(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def _in_float32(func: Any, args: tuple, kwargs: dict) -> bool:
    if func in FLOAT32:
        return True
    if func in FLOAT32_UNLESS_DTYPE:
        return kwargs.get("dtype") is None and not any(isinstance(a, torch.dtype) for a in args)
    if func is INTERPOLATE:
        return kwargs.get("mode", args[3] if len(args) > 3 else "nearest") != "area"
    return False


def emulated_dtype() -> torch.dtype | None:
    """The dtype of the :class:`CudaAutocast` this thread runs under, else None."""
    mode = getattr(_ACTIVE, "mode", None)
    return None if mode is None else mode.dtype


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes matmuls in here: torch's autocast for ``device_type`` or a
    :class:`CudaAutocast`; None without either."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return emulated_dtype()


def norms_in_float32(device_type: str) -> bool:
    """True where the autocast in force runs norms in float32: CUDA's (real or emulated); the
    CPU's runs them in its 16-bit dtype."""
    return (device_type == "cuda" and torch.is_autocast_enabled("cuda")) or emulated_dtype() is not None


def same_autocast(fn: Callable[[Any], Any], device_type: str) -> Callable[[Any], Any]:
    """``fn`` as the forward ran it: under the same autocast (real or emulated), which a backward
    runs without (a norm autocast computes in float32 must be recomputed in float32)."""
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)

        def under_autocast(arg: Any) -> Any:
            with torch.autocast(device_type, dtype=dtype):
                return fn(arg)

        return under_autocast
    emulated = emulated_dtype()
    if emulated is None:
        return fn

    def under_emulation(arg: Any) -> Any:
        with CudaAutocast(emulated):
            return fn(arg)

    return under_emulation


def checkpoint_contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """``context_fn`` for ``torch.utils.checkpoint``: the recompute runs under the emulated
    autocast its forward ran under (torch's checkpoint restores only torch's own autocast)."""
    dtype = emulated_dtype()
    return contextlib.nullcontext(), (CudaAutocast(dtype) if dtype is not None else contextlib.nullcontext())


def checkpoint(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint`` (non-reentrant) whose recompute runs under the
    emulated autocast of its forward, as torch's own does for torch's autocast."""
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    kwargs.setdefault("context_fn", checkpoint_contexts)
    return torch_checkpoint(fn, *args, **kwargs)


@contextlib.contextmanager
def forward_under(model: torch.nn.Module, dtype: torch.dtype | None,
                  device: str = "cuda") -> Iterator[None]:
    """``model.forward`` as accelerate's mixed precision wraps it (one process): under the
    autocast of ``device`` to ``dtype`` (CUDA's emulated on the CPU's fake tensors, the CPU's
    own for a CPU run), its 16-bit outputs converted to float32. None: as is."""
    if dtype is None:
        yield
        return
    from accelerate.utils import convert_outputs_to_fp32

    forward, own = model.forward, "forward" in model.__dict__

    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        region = CudaAutocast(dtype) if device == "cuda" else torch.autocast("cpu", dtype=dtype)
        with region:
            return forward(*args, **kwargs)

    model.forward = convert_outputs_to_fp32(autocast_forward)
    try:
        yield
    finally:
        if own:
            model.forward = forward
        else:
            del model.forward  # the class's forward again
