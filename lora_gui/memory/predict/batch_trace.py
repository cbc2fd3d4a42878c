"""The real batch's structure in a fake-tensor trace: masks, packed position ids, the kernel.

Fake tensors have no values, so the checks transformers makes on a batch's values (is every
token real? do the position ids restart?) are answered here from what the real batch holds,
and the attention kernel each call runs is recorded per device. Used by :mod:`trace`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def batch_structure(packed_rows: bool) -> Iterator[None]:
    """Tells transformers (and the windowed backend) whether the batch's rows hold several
    documents, as the real batch's position ids say.

    transformers detects packed sequences by reading ``position_ids``; fake tensors have no
    values, so it would always assume packing and build a (B, 1, S, S) mask that a real run of
    an unpacked batch (or of a packed row holding one document) never builds. ``packed_rows``:
    the real rows restart their positions (several documents a row): the mask is built, as in
    the run. A padding mask is given to the model only when the real batch has padding, so the
    "is every token real?" checks (which cannot read fake values) answer as the run's would.
    """
    from transformers import masking_utils

    from lora_gui.attention import hf as windowed_hf

    modules = [m for m in (masking_utils, windowed_hf) if hasattr(m, "find_packed_sequence_indices")]
    originals = [m.find_packed_sequence_indices for m in modules]
    if not packed_rows:
        for m in modules:
            m.find_packed_sequence_indices = lambda *a, **k: None
    try:
        yield
    finally:
        for m, orig in zip(modules, originals):
            m.find_packed_sequence_indices = orig


# Attention kernels by device: the trace runs CPU kernels; a CUDA run picks others where the
# memory differs in name only (see the module docstring).
_CPU_KERNELS = {"ScaledDotProductFlashAttentionForCpuBackward0": "sdpa_flash_cpu",
                "ScaledDotProductEfficientAttentionBackward0": "sdpa_memory_efficient",
                "ScaledDotProductFlashAttentionBackward0": "sdpa_flash"}


@contextlib.contextmanager
def kernel_watch(found: set[str], device: str, workspaces: list[int] | None = None) -> Iterator[None]:
    """Records which SDPA kernel each attention call of the step runs on ``device``.

    On a CPU the kernel is read from the autograd node of the real dispatch (torch's CPU flash
    kernel takes a mask: the boolean mask is converted to an additive one in the query dtype and
    kept for backward, per layer; without grad the kernel name is "sdpa"). On CUDA the kernel is
    the one PyTorch's rule picks (:func:`lora_gui.memory.predict.cuda_kernels.sdpa_kernel`: flash without
    a mask in 16-bit with head dim <= 256, else memory-efficient), and the scratch its backward
    allocates (flash: float32 dq accumulator, expanded dK / dV for GQA) is allocated inside that
    layer's backward (:func:`~lora_gui.memory.predict.cuda_kernels.wrap_attention`); ``workspaces`` gets
    each call's bytes. Without a mask the CPU flash kernel keeps what the CUDA kernels keep (output
    and float32 logsumexp). With a mask the CPU kernel's memory stands in for the
    memory-efficient kernel's, which keeps its converted (B, 1, S, S) bias: not yet checked on a
    GPU (bench/gpu/check.py is the place).
    """
    from lora_gui.memory.predict.cuda_kernels import sdpa_kernel, wrap_attention

    orig = torch.nn.functional.scaled_dot_product_attention
    sizes = workspaces if workspaces is not None else []

    def sdpa(query, key, value, attn_mask=None, *args, **kwargs):  # noqa: ANN001, ANN202 (torch API)
        if device == "cuda":
            kernel = sdpa_kernel(mask=attn_mask is not None, dtype=query.dtype, head_dim=query.shape[-1])
            found.add(kernel)
            return wrap_attention(lambda q, k, v: orig(q, k, v, attn_mask, *args, **kwargs),
                                  query, key, value, kernel, sizes)
        out = orig(query, key, value, attn_mask, *args, **kwargs)
        node = type(out.grad_fn).__name__ if out.grad_fn is not None else ""
        found.add(_CPU_KERNELS.get(node, "sdpa_math" if node else "sdpa"))
        return out

    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = orig
