"""Frozen layers that keep for the backward only what it reads.

autograd saves, for each op, what any of its input gradients could need. With the weights
frozen some of that is never read, yet stays alive from the forward to the backward:

- ``Conv2d``: the convolution's backward is one formula for input, weight and bias, so its input
  is saved even when only the input's gradient is wanted, which needs the weight alone. In a
  UNet that input is the SiLU output of every ResNet block (twice per block) and, in each
  upsampler, the tensor after the 2x nearest upsampling, four times the block's input.
- ``GroupNorm`` then ``SiLU`` (twice in every ResNet block, and before the UNet's last
  convolution): the SiLU keeps the normalised tensor although the norm keeps its own input, from
  which the backward recomputes it (one normalisation pass) instead.
- a peft LoRA ``Linear`` whose adapter weights are float32 over 16-bit frozen weights (the
  usual set-up: peft keeps adapters in float32) casts its input to float32 and ``lora_A`` keeps
  that copy: q, k and v keep three float32 copies of one 16-bit tensor, gate and up two more.
  The 16-bit input is kept instead, once for every adapter that reads it, and the copy is
  recomputed (one cast) in the backward. Under autocast (a GPU run's mixed precision) autocast
  casts the float32 copy straight back to 16 bits and keeps that second copy per adapter; there
  peft's cast is skipped and ``lora_A`` reads the input itself (the same values: the round
  trip is exact; without LoRA dropout, whose mask would be drawn in another dtype). Not for
  other adapter variants (DoRA, ...) (:mod:`lora_gui.models.lean_lora`).
- ``GroupNorm`` and ``LayerNorm`` under CUDA's autocast (a GPU run's mixed precision), which runs a
  norm in float32, so a 16-bit input is cast to a float32 copy, which the norm keeps for its
  backward (4 bytes a value). The norm keeps the 16-bit input instead and the backward
  recomputes the copy (one exact cast): half the bytes, in every ResNet block, UNet transformer
  block and DiT block (the DiTs' adaptive norms are LayerNorms).
- an RMSNorm (transformers' Llama, Qwen, Mistral, Gemma ...; diffusers' q / k norms of SD3 and
  Flux) casts its 16-bit input to float32 and its ``pow`` and product keep that copy (4 bytes a
  value; diffusers' keeps the 16-bit input as well). The 16-bit input is kept instead and the
  copy recomputed (one exact cast): in a decoder layer without checkpointing, 2 of the 4 bytes a
  value of each of its two norms' inputs; in a DiT's q / k norms, all 4.
- the LoRA layers that read an RMSNorm's output (q, k and v; gate and up) keep that output for
  their weight gradients, although the norm keeps its input for its own backward. They keep
  the input instead, and the output is recomputed from it (one norm pass, once for all the
  layers that read it): in a decoder layer without checkpointing, two hidden-size tensors a
  token less (the first layer's first norm reads the embeddings, which keep no gradient: there
  the output stays).
- diffusers' ``GEGLU`` (the feed-forward of SD 1.x / SDXL transformer blocks): ``h * gelu(g)``
  keeps ``gelu(g)`` beside the projection ``[h, g]`` it came from; it is recomputed from ``g``
  in the backward (one elementwise pass) instead of kept: a third of that block's saved bytes.
- a feed-forward whose output layer has a LoRA (Flux's default targets: ``ff.net.2``) keeps
  what that layer reads, ``gelu(proj)`` (diffusers' ``GELU``: DiT blocks) or ``h * gelu(g)``
  (``GEGLU``), beside the projection it is computed from, which the activation's own backward
  keeps: the adapter keeps the projection instead and the activation is recomputed from it
  (one elementwise pass): a feed-forward-width tensor a token less in every such block.
- transformers' gated MLP (Llama, Mistral, Qwen, Gemma ...) keeps ``act(gate)`` and the
  product ``down_proj``'s adapter reads; both are recomputed from ``gate`` and ``up`` instead
  (:mod:`lora_gui.models.lean_mlp`): two of the four intermediate-width tensors a token.

Each runs torch's own ops and backward: a saved-tensor hook swaps what the op saves for a
stand-in (the convolution's input: its sizes only, all its backward reads for the input's
gradient, as ``torch.nn.grad.conv2d_input`` does; the norm's output and ``gelu(g)``: recomputed
when the backward asks), so the gradients are the same, bit for bit. A hook costs less than a
custom autograd Function (about 20 against 50-70 microseconds a layer here). A layer is changed
only where the result is certain: a plain ``Conv2d`` with zero padding mode whose weight and
bias do not require grad at the call (a trainable one, e.g. an adapter's own convolution, keeps
torch's path), a plain ``SiLU`` reading a plain ``GroupNorm``'s output, and diffusers' own
``GEGLU`` and ``GELU``; and not inside a checkpointed block (another saved-tensor hook decides there). The
run and the memory planner's trace apply the same function, so plans count what the run holds.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.overrides import TorchFunctionMode

from lora_gui.models import stand_ins
from lora_gui.models.cuda_autocast import autocast_dtype, norms_in_float32, same_autocast
from lora_gui.models.lean_attention import lean_dit_attention
from lora_gui.models.lean_lora import lean_lora_layers
from lora_gui.models.lean_mlp import lean_gated_mlps
from lora_gui.models.stand_ins import Recompute, Sizes, Swap, other_hooks_active, unpack


class LeanConv2d(nn.Conv2d):
    """``nn.Conv2d`` that does not keep its input for the backward while it is frozen."""

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
        frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
        if (self.padding_mode != "zeros" or not frozen or not input.requires_grad
                or not torch.is_grad_enabled() or other_hooks_active()):
            return super()._conv_forward(input, weight, bias)
        cast = autocast_dtype(input.device.type)
        if cast is not None and input.dtype != cast:
            # the copy autocast would make for the convolution (and keep): made here, so that it
            # is the input this hook leaves out
            input = input.to(cast)
        return Swap(input, Sizes(input)).run(F.conv2d, input, weight, bias, self.stride, self.padding,
                                              self.dilation, self.groups)


def _to_float32(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _norm_in_float32(input: torch.Tensor, norm: Any) -> torch.Tensor:
    """``norm(input)``; under CUDA's autocast, which runs norms in float32 and keeps the float32
    copy of a 16-bit input it makes for them, the copy is made here and the 16-bit input kept
    instead (the copy is recomputed, exactly, in the backward): half the bytes."""
    half = input.dtype in (torch.float16, torch.bfloat16)
    if (not half or not norms_in_float32(input.device.type) or not input.requires_grad
            or not torch.is_grad_enabled() or other_hooks_active()):
        return norm(input)
    wide = input.float()
    return Swap(wide, Recompute(_to_float32, input)).run(norm, wide)


class LeanGroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` whose output, when a :class:`LeanSiLU` reads it next, is recomputed
    from the input in the backward instead of kept (the norm keeps its input anyway); under
    CUDA's autocast it keeps its 16-bit input, not autocast's float32 copy (:func:`_norm_in_float32`)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = _norm_in_float32(input, self.recompute)
        if out.requires_grad:
            out._lean_norm = (self, input)  # read by LeanSiLU; dies with the output
        return out

    def recompute(self, input: torch.Tensor) -> torch.Tensor:
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class LeanLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that under CUDA's autocast keeps its 16-bit input, not autocast's float32 copy
    (:func:`_norm_in_float32`); without autocast, torch's own. Its output is rebuilt from the input
    for the LoRA layers that read it (:func:`~lora_gui.models.stand_ins.rebuilt_from`)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = _norm_in_float32(input, self._plain)
        stand_ins.rebuilt_from(out, input, self._plain)
        return out

    def _plain(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class LeanRMSNorm(nn.RMSNorm):
    """torch's ``nn.RMSNorm`` (Flux's query / key norms), lean as :class:`LeanLayerNorm`: under
    CUDA's autocast, which runs it in float32, it keeps its 16-bit input, not autocast's float32
    copy; its output is rebuilt from the input for the LoRA layers that read it."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = _norm_in_float32(input, self._plain)
        stand_ins.rebuilt_from(out, input, self._plain)
        return out

    def _plain(self, input: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)


class LeanSiLU(nn.SiLU):
    """``nn.SiLU`` that keeps a :class:`LeanGroupNorm` output it reads as a recompute, not a
    tensor: a UNet ResNet block's two normalised activations (one elementwise pass each)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        norm = getattr(input, "_lean_norm", None)
        if norm is None or self.inplace or not torch.is_grad_enabled() or other_hooks_active():
            return F.silu(input, inplace=self.inplace)
        module, source = norm
        recompute = same_autocast(module.recompute, input.device.type)
        return Swap(input, Recompute(recompute, source)).run(F.silu, input)


class _Upcasts(TorchFunctionMode):
    """Watches one norm's forward: the float32 copies it makes of its 16-bit input (``x.float()``,
    ``x.to(torch.float32)``), which its ops then save, leave as recomputes of that cast."""

    def __init__(self, source: torch.Tensor) -> None:
        super().__init__()
        self.source: torch.Tensor | None = source
        self.copies: dict[int, torch.Tensor] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch API)
        out = func(*args, **(kwargs or {}))
        if (func in _UPCASTS and args and args[0] is self.source and isinstance(out, torch.Tensor)
                and out.dtype == torch.float32 and out is not self.source):
            self.copies[id(out)] = out
        return out

    def pack(self, t: torch.Tensor) -> object:
        if self.copies.get(id(t)) is t:
            return Recompute(_to_float32, self.source)
        return t


_UPCASTS = (torch.Tensor.to, torch.Tensor.float)


def _lean_rms_forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    inner = self._lean_inner_forward
    if not x.requires_grad or not torch.is_grad_enabled() or other_hooks_active() or args or kwargs:
        return inner(x, *args, **kwargs)
    if x.dtype in (torch.float16, torch.bfloat16):
        watch = _Upcasts(x)
        try:
            with watch, saved_tensors_hooks(watch.pack, unpack):
                out = inner(x)
        finally:
            watch.copies.clear()  # autograd keeps the pack hook: it must not keep the copies
            watch.source = None
    else:
        out = inner(x)
    stand_ins.rebuilt_from(out, x, inner)
    return out


def _lean_rms_norms(module: nn.Module) -> int:
    """Gives every RMSNorm (transformers' ``*RMSNorm`` of Llama, Qwen, Mistral, Gemma...,
    diffusers' ``RMSNorm`` of the DiTs' q / k norms) the forward above. Returns how many."""
    count = 0
    for m in module.modules():
        if (type(m).__name__.endswith("RMSNorm") and not isinstance(m, nn.RMSNorm)
                and "_lean_inner_forward" not in m.__dict__):
            m._lean_inner_forward = m.forward
            m.forward = types.MethodType(_lean_rms_forward, m)
            count += 1
    return count


def _first_output(inner: Any, args: tuple, kwargs: dict, x: torch.Tensor) -> torch.Tensor:
    out = inner(x, *args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def _lean_modulated_forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    inner = self._lean_inner_forward
    out = inner(x, *args, **kwargs)
    first = out[0] if isinstance(out, tuple) else out
    # what q, k and v (a single DiT block: and its MLP) read: ``norm(x) * (1 + scale) + shift``,
    # rebuilt from x (the norm keeps it) and the conditioning (a (batch, width) tensor)
    stand_ins.rebuilt_from(first, x, functools.partial(_first_output, inner, args, kwargs))
    return out


_MODULATED_NORMS = ("AdaLayerNormZero", "AdaLayerNormZeroSingle", "AdaLayerNormContinuous",
                    "SD35AdaLayerNormZeroX")


def _lean_modulated_norms(module: nn.Module) -> int:
    """Gives diffusers' adaptive norms (the DiT blocks' ``norm1``, ``norm1_context`` and a single
    block's ``norm``: a LayerNorm scaled and shifted by the timestep's conditioning) the forward
    above: the LoRA layers that read their output keep the norm's input instead. Returns how many."""
    norms = sys.modules.get("diffusers.models.normalization")
    classes = tuple(getattr(norms, n) for n in _MODULATED_NORMS if hasattr(norms, n)) if norms else ()
    count = 0
    for m in module.modules():
        if type(m) in classes and "_lean_inner_forward" not in m.__dict__:
            m._lean_inner_forward = m.forward
            m.forward = types.MethodType(_lean_modulated_forward, m)
            count += 1
    return count


@functools.cache
def _lean_geglu_class() -> type[nn.Module]:
    from diffusers.models.activations import GEGLU

    class LeanGEGLU(GEGLU):
        """diffusers' GEGLU that recomputes ``gelu(gate)`` in the backward instead of keeping it."""

        def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            proj = self.proj(hidden_states)
            hidden, gate = proj.chunk(2, dim=-1)
            kernels_here = proj.device.type in ("cpu", "cuda", "meta")  # diffusers' own path elsewhere
            if (not hidden.requires_grad or not torch.is_grad_enabled() or not kernels_here
                    or other_hooks_active()):
                return hidden * self.gelu(gate)
            act = F.gelu(gate)
            # the product saves hidden and act; act goes, gate stays (gelu's backward keeps it)
            recompute = same_autocast(F.gelu, gate.device.type)
            out = Swap(act, Recompute(recompute, gate)).run(torch.mul, hidden, act)
            stand_ins.rebuilt_from(out, proj, _geglu_product)  # for a LoRA on the feed-forward's output layer
            return out

    LeanGEGLU.__name__ = LeanGEGLU.__qualname__ = "LeanGEGLU"
    return LeanGEGLU


def _geglu_product(proj: torch.Tensor) -> torch.Tensor:
    hidden, gate = proj.chunk(2, dim=-1)
    return hidden * F.gelu(gate)


@functools.cache
def _lean_gelu_class() -> type[nn.Module]:
    from diffusers.models.activations import GELU

    class LeanGELU(GELU):
        """diffusers' GELU (``gelu(proj(x))``: the first layer of a DiT's feed-forward) whose output
        is rebuilt from the projection for the LoRA layer that reads it (the feed-forward's output
        layer, a default target for Flux), not kept: gelu's backward keeps the projection anyway."""

        def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            proj = self.proj(hidden_states)
            out = self.gelu(proj)
            if proj.device.type in ("cpu", "cuda", "meta"):  # where self.gelu is F.gelu itself
                stand_ins.rebuilt_from(out, proj, functools.partial(F.gelu, approximate=self.approximate))
            return out

    LeanGELU.__name__ = LeanGELU.__qualname__ = "LeanGELU"
    return LeanGELU


def lean_frozen_layers(module: nn.Module) -> int:
    """Turns every plain ``nn.Conv2d``, ``nn.GroupNorm``, ``nn.LayerNorm``, ``nn.RMSNorm``,
    ``nn.SiLU`` and diffusers ``GEGLU`` and ``GELU`` in ``module`` into its lean subclass, and
    gives plain peft LoRA ``Linear`` layers, RMSNorms and transformers' gated MLPs
    (:mod:`lora_gui.models.lean_mlp`) the lean forward (same parameters, state dict and output;
    see the module doc). Call after the adapter is attached (and after any other forward
    override). Returns how many layers changed."""
    swaps: list[tuple[type, type]] = [(nn.Conv2d, LeanConv2d), (nn.GroupNorm, LeanGroupNorm),
                                      (nn.LayerNorm, LeanLayerNorm), (nn.RMSNorm, LeanRMSNorm),
                                      (nn.SiLU, LeanSiLU)]
    if "diffusers.models.activations" in sys.modules:  # else no GEGLU / GELU exists (a text model)
        for lean_class in (_lean_geglu_class(), _lean_gelu_class()):
            swaps.append((lean_class.__mro__[1], lean_class))
    count = (lean_lora_layers(module) + _lean_rms_norms(module) + lean_gated_mlps(module)
             + _lean_modulated_norms(module) + lean_dit_attention(module))
    for m in module.modules():
        for plain, lean in swaps:
            if type(m) is plain:  # exact type: a subclass may change what its forward computes
                m.__class__ = lean
                count += 1
    return count
