"""DiT attention that keeps its normalised queries and keys as recomputes, not tensors.

In SD3.5 and Flux blocks (and any SD3-shaped model with ``qk_norm``) the attention kernel saves
its query and key for the backward: ``cat(norm_q(q), norm_added_q(q_text))`` (Flux: with rotary
embeddings on top). Each RMSNorm keeps its input ``q`` for its own backward anyway, so the kernel's
query and key are two sequence x width tensors kept twice. Here the kernel's saved query and key
leave as recomputes of those few elementwise passes from the norms' inputs (in the backward, under
the forward's autocast): per block, two sequence x width tensors less (in models at least
:data:`~lora_gui.models.stand_ins.MIN_REBUILD_WIDTH` wide: in narrower ones the recompute costs
more than it saves). In Flux.1-dev at 1024 px that is 56 MiB a block in bf16, 57 blocks.

What the processors hand ``to_out`` and ``to_add_out`` can be a copy of the kernel's output,
which the kernel keeps for its own backward, and their adapters kept that copy: under CUDA's
autocast Flux's float32 norms make the query float32 and the output is handed on in float32
(the adapters kept a 16-bit copy of it, equal to the kernel's output); SD3's kernel output is
heads first, and the tokens-first reshape copies it. Those parts are marked as rebuilt from the
kernel's output instead (:func:`_rebuilt_from_kernel_output`): one sequence x width tensor less a
block (SD3: at a batch of one, where the parts are contiguous; a larger batch's LoRA layers copy
their slices themselves, as with diffusers' processor).

The processors below are diffusers' ``FluxAttnProcessor`` and ``JointAttnProcessor2_0`` with those
changes only: the same ops in the same order, so the same outputs and gradients, bit for bit
(``tests/models/test_lean_attention.py``). The kernel call (``dispatch_attention_fn`` / SDPA, or
whatever wraps it: the eager backend, windowed image attention) runs under a saved-tensor hook
that swaps what it saves of the query and key (they or views of them) for the recomputes. Under
CUDA's autocast, which casts a float32 query for SDPA to 16 bits and SDPA keeps that copy, the
processor makes the same cast itself where the call reaches SDPA (:func:`_kernel_cast`). The
plain processor runs where nothing would be saved for a backward (no grad) and inside
checkpointed blocks (checkpointing decides there); the query and key stay as diffusers' keep them
where the norms' inputs need no gradient (the norms keep nothing then) and without query / key
norms (SD3-medium: no kept tensor to recompute from; its output parts are still rebuilt).

The copies are of the diffusers releases in :data:`CHECKED_DIFFUSERS`. On any other release, or
one without the private helper the Flux copy calls, :func:`lean_dit_attention` leaves diffusers'
own processors in place and logs one warning saying why. The run and its plan's trace both swap
processors through :func:`lean_dit_attention` (by way of ``lean_backward.lean_frozen_layers``),
so the plan traces whichever processor the run uses.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from lora_gui.models import stand_ins
from lora_gui.models.cuda_autocast import CudaAutocast, emulated_dtype, same_autocast
from lora_gui.models.stand_ins import Recompute, other_hooks_active, unpack, worth_rebuilding

log = logging.getLogger(__name__)

# The diffusers releases whose FluxAttnProcessor and JointAttnProcessor2_0 the lean processors copy
# op for op (copied from 0.42.1; tests/models/test_lean_attention_guard.py compares each copy with
# diffusers' own processor on the installed release). Another release may have changed what they
# copy: list it here only once that test passes on it.
CHECKED_DIFFUSERS = ("0.42.1",)
# the private helper of diffusers' Flux module that the Flux copy calls, as diffusers' processor does
FLUX_QKV_HELPER = "_get_qkv_projections"

try:  # the active torch function modes (a private torch API: without it, see _kernel_routed_elsewhere)
    from torch.overrides import _get_current_function_mode_stack as _function_modes
except ImportError:
    _function_modes = None


class _Strided:
    """Recomputes a saved view of a query or key: ``fn(args)`` laid out as the original, then
    the view's sizes, strides and offset."""

    __slots__ = ("base_stride", "fn", "offset", "shape", "stride")

    def __init__(self, view: torch.Tensor, base: torch.Tensor, fn: Any) -> None:
        self.shape, self.stride, self.offset = view.shape, view.stride(), view.storage_offset()
        self.base_stride, self.fn = base.stride(), fn

    def __call__(self, args: tuple) -> torch.Tensor:
        with torch.no_grad():
            out = self.fn(args)
            if out.stride() != self.base_stride:  # the layout the views' strides refer to
                out = torch.empty_strided(out.shape, self.base_stride, dtype=out.dtype,
                                          device=out.device).copy_(out)
        return out.as_strided(self.shape, self.stride, self.offset)


class _KeptAsRecomputes:
    """Pack hook for one attention kernel call: what it saves of ``query`` or ``key`` (either
    tensor, or a view of it) leaves as a recompute from ``args`` (the norms' inputs)."""

    __slots__ = ("targets",)

    def __init__(self, targets: list[tuple[torch.Tensor, Any, tuple]]) -> None:
        self.targets: dict[int, tuple[torch.Tensor, Any, tuple]] | None = {
            id(t): (t, fn, a) for t, fn, a in targets}

    def pack(self, t: torch.Tensor) -> object:
        base = t if t._base is None else t._base
        hit = self.targets.get(id(base)) if self.targets else None
        if hit is None or hit[0] is not base:
            return t
        return Recompute(_Strided(t, base, hit[1]), hit[2])

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            with saved_tensors_hooks(self.pack, unpack):
                return fn(*args, **kwargs)
        finally:
            self.targets = None  # autograd keeps the pack hook: it must not keep query and key


def _can_recompute(*norm_inputs: torch.Tensor | None) -> bool:
    """The norms keep their inputs (they need a gradient) and nothing else decides what is kept."""
    return (torch.is_grad_enabled() and not other_hooks_active()
            and all(t is None or t.requires_grad for t in norm_inputs))


def _kernel_cast(device_type: str, query: torch.Tensor) -> torch.dtype | None:
    """The dtype CUDA's autocast (real or emulated) casts a float32 query to for SDPA, which it
    runs in 16 bits; None where it casts nothing. The processor makes that cast itself (the same
    values), so that what SDPA keeps is the processor's tensor, which it can recompute."""
    if query.dtype != torch.float32 or _kernel_routed_elsewhere():
        return None
    if device_type == "cuda" and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return emulated_dtype()


def _kernel_routed_elsewhere() -> bool:
    """A function mode other than the CUDA autocast emulation is active (windowed image
    attention routes SDPA calls to its own kernel): the SDPA call may not reach SDPA, so its
    cast is left to autocast, as in diffusers' processor. Unknown (no such torch API): True."""
    if _function_modes is None:
        return True
    return any(not isinstance(mode, CudaAutocast) for mode in _function_modes())


def _cast(fn: Any, dtype: torch.dtype | None, args: tuple) -> torch.Tensor:
    out = fn(args)
    return out if dtype is None else out.to(dtype)


def _kernel_keeping_recomputes(kernel: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               sdpa: bool, make_q: Any, q_args: tuple, make_k: Any, k_args: tuple) -> Any:
    """``kernel(query, key, value)`` keeping its query and key as ``make_q(q_args)`` and
    ``make_k(k_args)``, recomputed under the forward's autocast. ``sdpa``: the kernel is torch's
    SDPA, whose cast under CUDA's autocast is then made here (:func:`_kernel_cast`)."""
    device = query.device.type
    cast = _kernel_cast(device, query) if sdpa else None
    if cast is not None:  # autocast's cast for SDPA, made here
        query, key = query.to(cast), key.to(cast)
    rebuild = [(query, functools.partial(_cast, same_autocast(make_q, device), cast), q_args),
               (key, functools.partial(_cast, same_autocast(make_k, device), cast), k_args)]
    return _KeptAsRecomputes(rebuild).run(kernel, query, key, value)


def _flux_layout(raw: torch.Tensor) -> torch.Tensor:
    return raw.flatten(2, 3)  # (batch, tokens, heads, head dim) -> (batch, tokens, width)


def _joint_layout(raw: torch.Tensor) -> torch.Tensor:
    return raw.transpose(1, 2).flatten(2, 3)  # (batch, heads, tokens, head dim) -> (batch, tokens, width)


def _kernel_output_part(raw: torch.Tensor, layout: Any, dtype: torch.dtype, start: int,
                        stop: int) -> torch.Tensor:
    """The tokens ``start:stop`` of the kernel's output as the processor hands them on."""
    return layout(raw).to(dtype)[:, start:stop].contiguous()


def _rebuilt_from_kernel_output(parts: tuple[torch.Tensor, ...], raw: torch.Tensor, layout: Any) -> None:
    """What the processor hands ``to_out`` / ``to_add_out`` can be a copy of the kernel's output,
    which the kernel keeps for its own backward: cast to float32 where the query was (after
    float32 norms, under CUDA's autocast), or laid out tokens first (SD3's kernel output is heads
    first wherever its query is). Their adapters kept that copy (under autocast, a 16-bit copy
    of it). Each part (the image and the text tokens, in token order) is marked as rebuilt from
    the kernel's output instead (:func:`~lora_gui.models.stand_ins.rebuilt_from`)."""
    if not parts or parts[0].untyped_storage()._cdata == raw.untyped_storage()._cdata:
        return  # views of the kernel's output, which it keeps anyway
    start = 0
    for part in parts:
        stop = start + part.shape[1]
        stand_ins.rebuilt_from(part, raw, functools.partial(
            _kernel_output_part, layout=layout, dtype=part.dtype, start=start, stop=stop))
        start = stop


def _native_kernel(backend: Any) -> bool:
    """diffusers' attention dispatch runs torch's SDPA (its native backend) for ``backend``;
    False where that cannot be told (the processor then leaves autocast's cast to autocast)."""
    try:
        from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

        name = backend if backend is not None else _AttentionBackendRegistry.get_active_backend()[0]
        return AttentionBackendName(name) == AttentionBackendName.NATIVE
    except (ImportError, AttributeError, ValueError, TypeError, IndexError):  # another diffusers
        return False


# -- Flux ------------------------------------------------------------------------------------------
def _flux_qk(norm: nn.Module, added: nn.Module | None, rope: Any, args: tuple) -> torch.Tensor:
    """Flux's query or key from the norms' inputs: ``rope(cat(added(text), norm(image)))``."""
    from diffusers.models.embeddings import apply_rotary_emb

    image, text = args
    out = norm(image)
    if text is not None:
        out = torch.cat([added(text), out], dim=1)
    if rope is not None:
        out = apply_rotary_emb(out, rope, sequence_dim=1)
    return out


@functools.cache
def _lean_flux_processor_class() -> type:
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, _get_qkv_projections

    class LeanFluxAttnProcessor(FluxAttnProcessor):
        """diffusers' ``FluxAttnProcessor``; the kernel keeps its query and key as recomputes."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                     attention_mask: torch.Tensor | None = None,
                     image_rotary_emb: torch.Tensor | None = None) -> Any:
            if not _can_recompute() or attn.fused_projections:
                return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                        image_rotary_emb)
            query, key, value, encoder_query, encoder_key, encoder_value = _get_qkv_projections(
                attn, hidden_states, encoder_hidden_states)
            query = query.unflatten(-1, (-1, attn.head_dim))
            key = key.unflatten(-1, (-1, attn.head_dim))
            value = value.unflatten(-1, (-1, attn.head_dim))
            q_in, k_in, eq_in, ek_in = query, key, None, None
            query = attn.norm_q(query)
            key = attn.norm_k(key)
            if attn.added_kv_proj_dim is not None:
                encoder_query = encoder_query.unflatten(-1, (-1, attn.head_dim))
                encoder_key = encoder_key.unflatten(-1, (-1, attn.head_dim))
                encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
                eq_in, ek_in = encoder_query, encoder_key
                encoder_query = attn.norm_added_q(encoder_query)
                encoder_key = attn.norm_added_k(encoder_key)
                query = torch.cat([encoder_query, query], dim=1)
                key = torch.cat([encoder_key, key], dim=1)
                value = torch.cat([encoder_value, value], dim=1)
            if image_rotary_emb is not None:
                query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
                key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
            out_dtype = query.dtype  # as diffusers' processor leaves the kernel's output
            kernel = functools.partial(dispatch_attention_fn, attn_mask=attention_mask,
                                       backend=self._attention_backend, parallel_config=self._parallel_config)
            if _can_recompute(q_in, k_in, eq_in, ek_in) and worth_rebuilding(query.shape[-2] * attn.head_dim):
                added_q, added_k = getattr(attn, "norm_added_q", None), getattr(attn, "norm_added_k", None)
                rope = image_rotary_emb
                hidden_states = _kernel_keeping_recomputes(
                    kernel, query, key, value, _native_kernel(self._attention_backend),
                    functools.partial(_flux_qk, attn.norm_q, added_q, rope), (q_in, eq_in),
                    functools.partial(_flux_qk, attn.norm_k, added_k, rope), (k_in, ek_in))
            else:
                hidden_states = kernel(query, key, value)
            raw = hidden_states
            hidden_states = hidden_states.flatten(2, 3)
            hidden_states = hidden_states.to(out_dtype)
            if encoder_hidden_states is not None:
                encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                    [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]],
                    dim=1)
                encoder_hidden_states = encoder_hidden_states.contiguous()
                hidden_states = hidden_states.contiguous()
                _rebuilt_from_kernel_output((encoder_hidden_states, hidden_states), raw, _flux_layout)
                hidden_states = attn.to_out[0](hidden_states)
                hidden_states = attn.to_out[1](hidden_states)
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
                return hidden_states, encoder_hidden_states
            return hidden_states

    return LeanFluxAttnProcessor


# -- SD3 (joint attention) -----------------------------------------------------------------------------
def _joint_qk(norm: nn.Module, added: nn.Module | None, args: tuple) -> torch.Tensor:
    """SD3's query or key from the norms' inputs: ``cat(norm(image), added(text))`` (heads first)."""
    image, text = args
    out = norm(image)
    return out if text is None else torch.cat([out, added(text)], dim=2)


@functools.cache
def _lean_joint_processor_class() -> type:
    from diffusers.models.attention_processor import JointAttnProcessor2_0

    class LeanJointAttnProcessor(JointAttnProcessor2_0):
        """diffusers' ``JointAttnProcessor2_0``; with query / key norms the kernel keeps its
        query and key as recomputes; the output parts ``to_out`` / ``to_add_out`` read are
        rebuilt from the kernel's output where they are copies of it."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                     attention_mask: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> Any:
            if not _can_recompute():
                return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                        *args, **kwargs)
            text_norms = attn.norm_added_q is not None and attn.norm_added_k is not None
            norms = attn.norm_q is not None and attn.norm_k is not None and (
                encoder_hidden_states is None or text_norms)
            residual = hidden_states
            batch_size = hidden_states.shape[0]
            query = attn.to_q(hidden_states)
            key = attn.to_k(hidden_states)
            value = attn.to_v(hidden_states)
            inner_dim = key.shape[-1]
            head_dim = inner_dim // attn.heads
            query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
            key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
            value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
            q_in, k_in, eq_in, ek_in = query, key, None, None
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            if encoder_hidden_states is not None:
                eq = attn.add_q_proj(encoder_hidden_states)
                ek = attn.add_k_proj(encoder_hidden_states)
                ev = attn.add_v_proj(encoder_hidden_states)
                eq = eq.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
                ek = ek.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
                ev = ev.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
                eq_in, ek_in = eq, ek
                if attn.norm_added_q is not None:
                    eq = attn.norm_added_q(eq)
                if attn.norm_added_k is not None:
                    ek = attn.norm_added_k(ek)
                query = torch.cat([query, eq], dim=2)
                key = torch.cat([key, ek], dim=2)
                value = torch.cat([value, ev], dim=2)
            out_dtype = query.dtype  # as diffusers' processor leaves the kernel's output
            kernel = functools.partial(F.scaled_dot_product_attention, dropout_p=0.0, is_causal=False)
            if norms and _can_recompute(q_in, k_in, eq_in, ek_in) and worth_rebuilding(inner_dim):
                hidden_states = _kernel_keeping_recomputes(
                    kernel, query, key, value, True,  # torch's SDPA
                    functools.partial(_joint_qk, attn.norm_q, attn.norm_added_q), (q_in, eq_in),
                    functools.partial(_joint_qk, attn.norm_k, attn.norm_added_k), (k_in, ek_in))
            else:
                hidden_states = kernel(query, key, value)
            raw = hidden_states
            hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
            hidden_states = hidden_states.to(out_dtype)
            if encoder_hidden_states is not None:
                # a batch of one: contiguous parts, rebuilt; a larger batch's are not (its LoRA
                # layers copy them: kept as diffusers' processor keeps them)
                hidden_states, encoder_hidden_states = (hidden_states[:, : residual.shape[1]],
                                                        hidden_states[:, residual.shape[1]:])
                _rebuilt_from_kernel_output((hidden_states, encoder_hidden_states), raw, _joint_layout)
                if not attn.context_pre_only:
                    encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
            else:
                _rebuilt_from_kernel_output((hidden_states,), raw, _joint_layout)
            hidden_states = attn.to_out[0](hidden_states)
            hidden_states = attn.to_out[1](hidden_states)
            if encoder_hidden_states is not None:
                return hidden_states, encoder_hidden_states
            return hidden_states

    return LeanJointAttnProcessor


def copies_unusable(flux_module: Any = None) -> str | None:
    """Why the lean processors may not stand in for diffusers' own here (None: they may): the
    installed diffusers is not a release in :data:`CHECKED_DIFFUSERS`, or (for the Flux copy,
    given diffusers' ``transformer_flux`` module) it lacks the private helper the copy calls."""
    import diffusers

    version = getattr(diffusers, "__version__", "unknown")
    if version not in CHECKED_DIFFUSERS:
        return (f"diffusers {version} is not a release they were checked against "
                f"({', '.join(CHECKED_DIFFUSERS)})")
    if flux_module is not None and not callable(getattr(flux_module, FLUX_QKV_HELPER, None)):
        return f"diffusers {version} has no transformer_flux.{FLUX_QKV_HELPER}, which the Flux copy calls"
    return None


@functools.cache
def _warn_unusable(reason: str) -> None:
    """One warning per reason and process (a run builds its model and its plan's trace apart)."""
    log.warning("lean_backward: DiT attention layers keep diffusers' own attention processors "
                "(the same results, their query and key kept as diffusers keeps them, which the "
                "plan counts): %s.", reason)


def lean_dit_attention(module: nn.Module) -> int:
    """Gives every attention layer in ``module`` whose processor is exactly diffusers'
    ``FluxAttnProcessor`` or ``JointAttnProcessor2_0`` (or a wrapper around one, with an
    ``inner`` processor: the eager backend, windowed image attention) the lean processor above,
    where the installed diffusers is one the copies were checked against
    (:func:`copies_unusable`; else diffusers' own stay, with one warning). Returns how many."""
    if "diffusers.models.attention_processor" not in sys.modules:
        return 0  # no DiT here (a text model)
    from diffusers.models.attention_processor import JointAttnProcessor2_0

    swaps: dict[type, type] = {}
    flux = sys.modules.get("diffusers.models.transformers.transformer_flux")
    checks = [(JointAttnProcessor2_0, copies_unusable(), _lean_joint_processor_class)]
    if flux is not None:
        checks.append((flux.FluxAttnProcessor, copies_unusable(flux), _lean_flux_processor_class))
    for plain, why_not, lean_class in checks:
        if not why_not:
            swaps[plain] = lean_class()
        elif any(type(proc) is plain for _, _, proc in _processors(module, {plain})):
            _warn_unusable(why_not)
    count = 0
    for m, owner, proc in _processors(module, set(swaps)):
        lean = swaps[type(proc)]()
        for name in ("_attention_backend", "_parallel_config"):
            if name in vars(proc):
                setattr(lean, name, getattr(proc, name))
        if owner is m:
            m.set_processor(lean)
        else:
            owner.inner = lean
        count += 1
    return count


def _processors(module: nn.Module, kinds: set[type]) -> Any:
    """(layer, owner, processor) for each attention layer of ``module`` whose processor is of a
    type in ``kinds``, directly (owner: the layer) or inside a wrapper (owner: the wrapper)."""
    for m in module.modules():
        owner, proc = m, getattr(m, "processor", None)
        while proc is not None and type(proc) not in kinds and hasattr(proc, "inner"):
            owner, proc = proc, proc.inner  # a wrapper's own processor
        if proc is not None and type(proc) in kinds:
            yield m, owner, proc
