"""What CUDA kernels allocate beyond their inputs and outputs, one row per kernel, from its source.

A fake-tensor trace runs CPU kernels: it sees every tensor an op returns, but not the scratch a
CUDA kernel allocates through the caching allocator and frees before it returns (FlashAttention-2's
float32 ``dq`` accumulator, its expanded dK / dV for grouped-query attention), nor what differs
between the CPU and CUDA code paths of the same Python (AdamW's ``foreach`` path). This module
names those allocations, sizes them from the shapes, and says where each one lives:

- ``in_trace=False`` rows are added to the trace at the moment they are alive
  (:func:`attention_workspace_hooks` allocates the attention backward's workspace inside that
  layer's backward, so it adds to the peak only when the peak is there); the closed-form estimate
  adds the same bytes to its in-backward peak (:func:`attention_backward_bytes`);
- ``in_trace=True`` rows are already counted because the trace runs the same Python on CPU
  (transformers' ``repeat_kv``, the bitsandbytes dequantized weights, the chunked loss) or runs
  the CUDA code path itself (AdamW ``foreach=True``, see
  :func:`lora_gui.memory.predict.quant.make_optimizer`);
- fixed rows (cuBLAS workspace) are named overheads of the plan.

Which attention kernel a run gets is decided by :func:`sdpa_kernel`, the rule of PyTorch's
``sdp_utils.cpp`` (``select_sdp_backend``: flash first, then memory-efficient, then math; cuDNN is
never picked by default) applied to what transformers passes (``integrations/sdpa_attention.py``:
``enable_gqa`` only without a mask and head dim <= 256, else ``repeat_kv`` copies K / V to all
heads). All sizes in bytes; not yet checked on a card (``bench/gpu/check.py`` is the check).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from lora_gui.units import gb

F32 = 4  # bytes
FLASH_MAX_HEAD_DIM = 256  # flash_api.cpp mha_bwd: "only supports head dimension at most 256"
MEM_EFF_BLOCK_I = 64  # kernel_backward.h: query block (kBlockSizeI) of the sm80 bf16 kernels
MEM_EFF_BLOCK_J = 128  # kernel_backward.h: key block (kBlockSizeJ), upper bound over variants
# torch's default CUBLAS_WORKSPACE_CONFIG (aten/src/ATen/cuda/CublasHandlePool.cpp,
# getChosenWorkspaceSize): ":4096:8" on Hopper = 8 x 4 MiB; older cards ":4096:2:16:8" = 8.125 MiB.
# One workspace per (handle, stream) that runs a matmul, and handles are per thread
# (DeviceThreadHandlePool): the forward's thread and the autograd engine's device thread, which
# runs every backward matmul, hold one each. Measured on an H200 (bench/gpu/check.py): every
# training step's max_memory_allocated was 31 MiB above a plan that counted one workspace.
# The plan takes 32 MiB (the Hopper size) on every card: a card of unknown kind never gets less.
# cuBLASLt: 1 MiB of its own (getCUDABlasLtWorkspaceSize, CUBLASLT_WORKSPACE_SIZE 1024 KiB),
# kept although recent builds share the cuBLAS workspace (erring by 1 MiB high, never low).
# (the step's total, both handles and cuBLASLt: trace_result.CUBLAS_WORKSPACE_BYTES)
CUBLAS_WORKSPACE_PER_HANDLE = 32 * 2**20  # one (handle, stream) pair
CUBLAS_HANDLES = 2  # forward thread + autograd's device thread
CUBLASLT_WORKSPACE_BYTES = 1 * 2**20
# aten/src/ATen/native/transformers/cuda/attention.cu _flash_attention_forward: the forward
# returns rng_state (2 x uint64) and an empty uint64 "_unused"; both are saved for backward, one
# 512-byte allocator block each per layer (the CPU flash kernel returns neither).
FLASH_FWD_SAVED_PER_LAYER = 2 * 512


@dataclass(frozen=True)
class KernelRow:
    """One allocation a CUDA kernel makes beyond its inputs and outputs.

    Attributes:
        kernel: the kernel (``sdpa_flash``, ``bnb_nf4_matmul``...).
        name: what it allocates (``dq_accum``...).
        phase: ``forward``, ``backward``, ``optimizer`` or ``step`` (the whole step).
        nbytes: bytes for the shapes given.
        lifetime: how long it lives.
        in_trace: True when the CPU trace already counts it (same Python, or CUDA path traced).
        source: file and function it comes from.
    """

    kernel: str
    name: str
    phase: str
    nbytes: int
    lifetime: str
    in_trace: bool
    source: str

    def to_json(self) -> dict[str, Any]:
        """The row as plain data (``plan --json``)."""
        return asdict(self)


def _round(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _dtype_bytes(dtype: Any) -> int:
    if isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size()
    return {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}[str(dtype)]


def sdpa_kernel(*, mask: bool, dtype: Any, head_dim: int,
                compute_capability: tuple[int, int] = (8, 0)) -> str:
    """The SDPA backend a CUDA run gets (PyTorch ``sdp_utils.cpp`` select_sdp_backend).

    Args:
        mask: an attention mask reaches SDPA (flash takes none: ``check_for_attn_mask``).
        dtype: query dtype (flash: fp16 / bf16 only, ``check_flash_attention_datatype``).
        head_dim: per-head size (flash: <= 256 and a multiple of 8; memory-efficient: a multiple
            of 8 for 16-bit, 4 for float32, ``check_head_dim_size_mem_efficient``).
        compute_capability: the card's (major, minor); flash needs sm80+ (sm75 is refused by
            ``check_flash_attention_hardware_support``); the default is an Ampere-or-newer card.

    Returns:
        ``sdpa_flash``, ``sdpa_memory_efficient`` or ``sdpa_math``.
    """
    size = _dtype_bytes(dtype)
    flash = (not mask and size == 2 and head_dim <= FLASH_MAX_HEAD_DIM and head_dim % 8 == 0
             and compute_capability >= (8, 0))
    if flash:
        return "sdpa_flash"
    if head_dim % (8 if size == 2 else 4) == 0 and compute_capability >= (5, 0):
        return "sdpa_memory_efficient"
    return "sdpa_math"


def attention_backward_rows(kernel: str, *, batch: int, seq: int, heads: int, kv_heads: int,
                            head_dim: int, dtype: Any) -> list[KernelRow]:
    """Scratch of one attention call's backward (one layer), freed when it returns.

    Args:
        kernel: as :func:`sdpa_kernel` (``eager`` / ``windowed`` / ``sdpa_math``: no kernel scratch
            beyond what the trace sees).
        batch, seq, heads, head_dim: query shapes (B, S, H, D); kv_heads: heads of K / V as the
            kernel receives them (H when transformers ran ``repeat_kv``).
        dtype: query dtype.
    """
    b, s, h, d, size = batch, seq, heads, head_dim, _dtype_bytes(dtype)
    fa = "aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_bwd"
    if kernel == "sdpa_flash":
        life = "inside one layer's attention backward"
        d_round = _round(d, 32 if d <= 128 else 64)  # head_size_rounded
        s_round = _round(s, 128)  # seqlen_q_rounded
        rows = [KernelRow(kernel, "dq_accum (float32)", "backward", b * s_round * h * d_round * F32,
                          life, False, fa),
                KernelRow(kernel, "softmax_d (float32)", "backward", b * h * s_round * F32, life, False, fa)]
        if kv_heads != h:  # GQA: dK / dV for every query head, summed into the kv heads after
            rows += [KernelRow(kernel, f"{n}_expanded (GQA)", "backward", b * s * h * d * size, life,
                               False, fa) for n in ("dk", "dv")]
        return rows
    if kernel == "sdpa_memory_efficient":
        life = "inside one layer's attention backward"
        src = ("aten/src/ATen/native/transformers/cuda/attention_backward.cu "
               "_efficient_attention_backward (delta, workspace); mem_eff_attention/kernel_backward.h "
               "Params::workspace_size")
        n_q = _round(s, MEM_EFF_BLOCK_I)
        d_round = _round(d, 32)
        grad_q = b * h * n_q * d_round * F32  # GradQTempStorage per query block: float32 dQ
        grad_kv = 2 * b * h * MEM_EFF_BLOCK_J * _round(d, MEM_EFF_BLOCK_I) * F32  # one key block each
        return [KernelRow(kernel, "workspace: float32 dQ accumulator", "backward", grad_q, life, False,
                          src),
                KernelRow(kernel, "workspace: dK / dV block accumulators", "backward", grad_kv, life, False,
                          src),
                KernelRow(kernel, "delta (float32)", "backward", b * h * s * F32, life, False, src)]
    return []


def attention_backward_bytes(kernel: str, **shapes: Any) -> int:
    """Sum of :func:`attention_backward_rows` (bytes alive at once inside one layer's backward)."""
    return sum(r.nbytes for r in attention_backward_rows(kernel, **shapes))


def kernel_table(*, kernel: str, batch: int, seq: int, heads: int, kv_heads: int, head_dim: int,
                 dtype: Any, layers: int, lora_param_bytes: int, quantization: str = "none",
                 gqa_in_kernel: bool = True) -> list[KernelRow]:
    """Every row of CUDA-only memory for one text step, for the plan to list.

    Args:
        kernel: the attention kernel (:func:`sdpa_kernel`, or ``eager`` / ``windowed``).
        batch, seq, heads, kv_heads, head_dim, dtype: the attention shapes (model's kv heads).
        layers: decoder layers.
        lora_param_bytes: bytes of the trainable parameters (AdamW foreach temporaries).
        quantization: ``none`` / ``nf4`` / ``int8`` (bitsandbytes rows).
        gqa_in_kernel: K / V reach the kernel with ``kv_heads`` heads (transformers' enable_gqa);
            False: ``repeat_kv`` expanded them first.
    """
    size = _dtype_bytes(dtype)
    kv_in = kv_heads if gqa_in_kernel else heads
    rows = attention_backward_rows(kernel, batch=batch, seq=seq, heads=heads, kv_heads=kv_in,
                                   head_dim=head_dim, dtype=dtype)
    if kernel == "sdpa_flash":
        rows.append(KernelRow(kernel, "rng_state + unused (saved per layer)", "forward",
                              layers * FLASH_FWD_SAVED_PER_LAYER, "from each layer's forward to its backward",
                              False, "aten/src/ATen/native/transformers/cuda/attention.cu "
                              "_flash_attention_forward"))
    if kernel == "windowed":
        rows.append(KernelRow("flex_attention", "delta (float32) + logsumexp", "backward",
                              batch * heads * seq * F32 * 2, "inside one layer's attention backward", True,
                              "torch/_inductor/kernel/flex_attention.py flex_attention_backward; "
                              "the trace runs the blocked kernel, which keeps more (scores per block)"))
    if kv_heads != heads and not gqa_in_kernel:
        rows.append(KernelRow("repeat_kv", "K and V copied to every query head", "forward",
                              2 * batch * heads * seq * head_dim * size, "saved per layer until its backward",
                              True, "transformers models/llama/modeling_llama.py repeat_kv (a mask "
                              "reaches SDPA: integrations/sdpa_attention.py use_gqa_in_sdpa is False)"))
    if quantization in ("nf4", "int8"):
        rows.append(KernelRow(f"bnb_{quantization}_matmul", "dequantized weight (compute dtype)",
                              "forward+backward", 0, "one Linear at a time, freed after its matmul",
                              True, "bitsandbytes/autograd/_functions.py MatMul4Bit / MatMul8bitLt "
                              "forward and backward (F.dequantize_4bit / int8 dequant); traced by "
                              "lora_gui.memory.predict.quant"))
    rows += [
        KernelRow("adamw_foreach", "sqrt(exp_avg_sq) copy of every trainable tensor", "optimizer",
                  lora_param_bytes, "inside optimizer.step()", True,
                  "torch/optim/adamw.py (adam.py) _multi_tensor_adam: torch._foreach_sqrt; "
                  "foreach is the default on CUDA, traced with foreach=True"),
        KernelRow("cublas", "cuBLAS workspaces (forward thread + autograd's backward thread)", "step",
                  CUBLAS_HANDLES * CUBLAS_WORKSPACE_PER_HANDLE,
                  "from the first matmul to the end of the process", False,
                  "aten/src/ATen/cuda/CublasHandlePool.cpp getChosenWorkspaceSize"),
        KernelRow("cublaslt", "cuBLASLt workspace", "step", CUBLASLT_WORKSPACE_BYTES,
                  "from the first Lt matmul to the end of the process", False,
                  "aten/src/ATen/cuda/CUDABlas.cpp getCUDABlasLtWorkspace"),
        KernelRow("offload_stream", "side stream of offloaded checkpoints", "step", 0,
                  "copies only: no matmul, so no cuBLAS workspace of its own", True,
                  "lora_gui/models/long_context.py (host copies)"),
        KernelRow("chunked_loss", "logits of one chunk", "forward+backward", 0,
                  "one chunk at a time", True, "lora_gui/models/chunked_loss.py (same Python on CPU)"),
    ]
    return rows


def nccl_rows(world_size: int) -> list[KernelRow]:
    """NCCL's own device buffers for a multi-GPU run (per GPU): a buffer per channel and peer.

    NCCL_BUFFSIZE defaults to 4 MiB per channel and protocol (nccl src/init.cc, ``DEFAULT_BUFFSIZE``);
    a ring over ``world_size`` GPUs uses up to 2 peers x 2 directions; the count of channels is
    decided at run time (up to 32 on NVLink), so 2 x 2 x 4 MiB x 8 channels is taken: 128 MiB, an
    estimate that the GPU check must confirm.
    """
    if world_size <= 1:
        return []
    return [KernelRow("nccl", "communicator buffers (ring, 8 channels x 2 peers x 2 directions x 4 MiB)",
                      "step", 8 * 2 * 2 * 4 * 2**20, "from the first collective to the end", False,
                      "nccl src/init.cc DEFAULT_BUFFSIZE (NCCL_BUFFSIZE)")]


NOT_COUNTED = "not counted"  # a row's lifetime when the plan leaves the kernel's effect out


def fast_kernel_rows(liger: bool, compiled: bool) -> list[KernelRow]:
    """Rows for the fast kernels a CUDA run uses (:mod:`lora_gui.models.fast_kernels`), none of
    them counted: the trace runs transformers' own modules, which keep more for the backward
    than Liger's (its RMSNorm saves its input, weight and one float32 rstd per row; its SwiGLU
    saves the gate and up projections and recomputes SiLU), so the plan stays above such a run;
    Inductor's compiled blocks choose what to save and recompute themselves."""
    rows = []
    if liger:
        rows.append(KernelRow("liger_kernels", "RMSNorm, RoPE, SwiGLU, fused linear cross-entropy", "step",
                              0, f"{NOT_COUNTED}: they keep less than the traced modules", False,
                              "liger_kernel/ops/rms_norm.py, swiglu.py (save_for_backward)"))
    if compiled:
        rows.append(KernelRow("torch_compile", "compiled decoder blocks", "step", 0,
                              f"{NOT_COUNTED}: Inductor picks what the backward keeps", False,
                              "torch/_inductor (min-cut partitioner)"))
    return rows


def describe_rows(rows: list[KernelRow]) -> list[str]:
    """The rows in words, one line each (for the CLI)."""
    out = []
    for r in rows:
        if r.lifetime.startswith(NOT_COUNTED):
            out.append(f"  {r.kernel:<22} {r.name:<48} {NOT_COUNTED:>12}  {r.lifetime} ({r.source})")
            continue
        where = "counted by the trace" if r.in_trace else "added by the plan"
        size = gb(r.nbytes) if r.nbytes else "see trace"
        out.append(f"  {r.kernel:<22} {r.name:<48} {size:>12}  {r.phase}, {r.lifetime}; {where} ({r.source})")
    return out


class _Workspace:
    """Holds one layer's attention backward workspace from the start of that backward to its end."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes, self.tensor = nbytes, None
        self.saved: tuple[torch.Tensor, ...] = ()  # what the forward keeps for the backward


class _AllocOnBackward(torch.autograd.Function):
    """Identity on the attention output; its backward (run just before the attention's own)
    allocates the workspace, as the CUDA kernel does on entry."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, holder: _Workspace) -> torch.Tensor:  # noqa: ANN001
        ctx.holder = holder
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        ctx.holder.tensor = torch.empty(ctx.holder.nbytes, dtype=torch.uint8, device=grad.device)
        return grad, None


class _FreeAfterBackward(torch.autograd.Function):
    """Identity on q, k, v; its backward (run once the attention's backward has returned their
    gradients) frees the workspace, as the kernel does on return."""

    @staticmethod
    def forward(ctx, holder: _Workspace, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):  # noqa: ANN001, ANN205
        ctx.holder = holder
        return q.view_as(q), k.view_as(k), v.view_as(v)

    @staticmethod
    def backward(ctx, dq, dk, dv):  # noqa: ANN001, ANN205
        ctx.holder.tensor, ctx.holder.saved = None, ()
        return None, dq, dk, dv


def wrap_attention(call: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   kernel: str, seen: list[int]) -> torch.Tensor:
    """Runs ``call(query, key, value)`` with the CUDA kernel's backward workspace allocated inside
    its backward (fake-tensor traces; q, k, v in transformers' (B, H, S, D) layout).

    ``seen`` gets the workspace bytes of each call that has one.
    """
    b, h, s, d = query.shape
    nbytes = attention_backward_bytes(kernel, batch=b, seq=s, heads=h, kv_heads=key.shape[1],
                                      head_dim=d, dtype=query.dtype)
    if not nbytes or not torch.is_grad_enabled() or not any(t.requires_grad for t in (query, key, value)):
        return call(query, key, value)
    holder = _Workspace(nbytes)
    seen.append(nbytes)
    if kernel == "sdpa_flash":  # rng_state (2 x uint64) and an empty uint64, kept until the backward
        holder.saved = (torch.empty(2, dtype=torch.int64), torch.empty((), dtype=torch.int64))
    q, k, v = _FreeAfterBackward.apply(holder, query, key, value)
    return _AllocOnBackward.apply(call(q, k, v), holder)


def gqa_expected_bytes(batch: int, seq: int, heads: int, head_dim: int, gqa: bool) -> int:
    """B x S x H x D x (4 + 2 + 2) bytes (GQA) or x 4 (no GQA): the flash backward's dq_accum and
    expanded dK / dV, the figure the plan's workspace must match within 1% (16-bit weights)."""
    return batch * seq * heads * head_dim * (8 if gqa else 4)


def step_rows(config: Any, info: dict[str, Any], *, dtype: Any, layers: int | None = None,
              lora_param_bytes: int = 0) -> list[KernelRow]:
    """The kernel table for a traced text step (``TraceResult.info``) of ``config``.

    The kernel is the one the trace recorded (the run's own rule); a masked batch means
    transformers ran ``repeat_kv`` (K / V reach the kernel with every query head).
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    mask = info.get("mask", "none") != "none"
    kernel = str(info.get("kernel") or "").split("+")[-1] or "sdpa"
    return kernel_table(kernel=kernel, batch=int(info.get("batch_size", 1)),
                        seq=int(info.get("seq_len", 1)), heads=heads, kv_heads=kv_heads,
                        head_dim=head_dim, dtype=dtype,
                        layers=layers or text.num_hidden_layers, lora_param_bytes=lora_param_bytes,
                        quantization=str(info.get("quantization", "none")), gqa_in_kernel=not mask)


def card_figures(step: Any) -> dict[str, int]:
    """What the card will show for a CUDA plan (bytes): ``allocated`` (max_memory_allocated),
    ``reserved`` (max_memory_reserved: the allocator's segments) and ``nvidia_smi`` (reserved
    plus the CUDA context), the figure a budget is checked against."""
    return {"allocated_bytes": step.allocator_peak_bytes, "reserved_bytes": step.reserved_peak_bytes,
            "nvidia_smi_bytes": step.peak_bytes}


def fixed_shortfall(budget: int, context_bytes: int, weights_bytes: int) -> str | None:
    """Why a budget cannot hold even the CUDA context and the frozen weights (None: it can).

    Says which of the two does not fit and by how much (decimal GB).
    """
    def size(n: int) -> str:
        return gb(n)

    if context_bytes > budget:
        return (f"the budget of {size(budget)} does not hold the CUDA context alone ({size(context_bytes)}): "
                f"{size(context_bytes - budget)} short")
    if context_bytes + weights_bytes > budget:
        return (f"the budget of {size(budget)} holds the CUDA context ({size(context_bytes)}) but not the "
                f"frozen weights beside it ({size(weights_bytes)}): "
                f"{size(context_bytes + weights_bytes - budget)} short; try a smaller quantization of "
                "the base weights or a larger card")
    return None
