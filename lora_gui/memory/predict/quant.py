"""Quantized base weights and 8-bit optimizer states in the trace (source: predicted).

The trace (:mod:`lora_gui.memory.predict.trace`) builds the model on the meta device and gives every
weight a fake tensor. For ``quantization`` nf4 / int8 this module then does what transformers'
bitsandbytes loader does to a real model: every Linear layer of the decoder (not the output
head) becomes bitsandbytes' ``Linear4bit`` / ``Linear8bitLt`` and its weight is quantized by
bitsandbytes' own ops, which have fake-tensor implementations. So the trace holds the real
storage - NF4: packed uint8 (two weights a byte) + a float32 absmax per 64 weights, or with
double quantization a uint8 absmax + a float32 scale per 256 absmax values + the 256-entry code
book and offset; int8: int8 weights + a float32 scale per output row - and the step runs
bitsandbytes' real autograd functions, so the dequantized weight a backward materializes per
layer (``dequantize_4bit`` in the compute dtype; int8: the dequantized int8 matrix) is counted
where it lives. LoRA is attached after the quantization, as the engine does.

8-bit optimizers: bitsandbytes' AdamW8bit runs in the trace as it is (its update is an in-place
fused kernel: no temporaries), its state made as the first step leaves it: uint8 moments (2
bytes/param) + a float32 absmax per 256 values per moment, float32 moments for tensors under
4,096 values, and the two shared 256-entry maps.

CUDA mapping of int8: on a GPU bitsandbytes runs ``MatMul8bitLt`` (int8 matmul, keeps the layer
input); on a CPU ``MatMul8bitFp`` (dequantize + matmul). The trace for ``device="cuda"`` runs the
CUDA function with outlier threshold 0: outlier columns (transformers' default threshold 6.0)
are data-dependent and add a (tokens x outliers) 16-bit copy per layer that is not predicted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from lora_gui.adapter_settings import TEXT_QUANTIZATIONS
from lora_gui.config import choices_of

QUANTIZATIONS = TEXT_QUANTIZATIONS  # a text decoder's (fp8 is a video run's: video_quant)
OPTIMIZERS = tuple(o for o in choices_of("optimizer") if o != "auto")
NF4_BLOCK = 64  # weights per absmax (bitsandbytes' default 4-bit blocksize)
NESTED_BLOCK = 256  # absmax values per float32 scale under double quantization
OPT_BLOCK = 256  # values per absmax in bitsandbytes' 8-bit optimizer states
MIN_8BIT_SIZE = 4096  # bitsandbytes keeps float32 optimizer states for smaller tensors


def check_quantization(quantization: str, optimizer: str = "adamw") -> None:
    """Raises ValueError naming a quantization or optimizer value that is not known."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")


def _quantized_linear(linear: nn.Linear, quantization: str, double_quant: bool,
                      compute_dtype: torch.dtype) -> nn.Module:
    """bitsandbytes' layer for a meta ``linear``, its weight quantized by bitsandbytes' own op.

    transformers' loader wraps the quantized tensor in bitsandbytes' parameter classes; those
    cannot wrap fake tensors, so the same layer class is filled with what they would hold: the
    quantized tensor as a frozen parameter and its ``quant_state`` on the layer (4-bit: the
    layer's forward puts it back on the weight), or the int8 matrix and row scales in the
    layer's matmul state. The storage is the loader's (checked in tests/memory).
    """
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    w = linear.weight.data
    if quantization == "nf4":
        layer = bnb.nn.Linear4bit.__new__(bnb.nn.Linear4bit)
        nn.Module.__init__(layer)
        packed, state = F.quantize_4bit(w, blocksize=NF4_BLOCK, compress_statistics=double_quant,
                                        quant_type="nf4", quant_storage=torch.uint8)
        state.dtype = compute_dtype
        layer.weight = nn.Parameter(packed, requires_grad=False)
        for key, value in {"quant_type": "nf4", "blocksize": NF4_BLOCK, "compress_statistics": double_quant,
                           "quant_storage": torch.uint8, "bnb_quantized": True}.items():
            setattr(layer.weight, key, value)
        layer.__dict__.update(compute_dtype=compute_dtype, compute_type_is_set=True, quant_state=state,
                              quant_storage=torch.uint8)
    else:
        layer = bnb.nn.Linear8bitLt.__new__(bnb.nn.Linear8bitLt)
        nn.Module.__init__(layer)
        cb, scb, _ = F.int8_vectorwise_quant(w.to(torch.float16))
        layer.weight = nn.Parameter(cb, requires_grad=False)
        layer.weight.CB, layer.weight.SCB, layer.weight.has_fp16_weights = None, None, False
        layer.state = bnb.MatmulLtState()
        layer.state.threshold, layer.state.has_fp16_weights = 0.0, False
        layer.state.CB, layer.state.SCB = cb, scb
        layer.index = None
    layer.in_features, layer.out_features = linear.in_features, linear.out_features
    layer.support_avx512bf16_for_cpu = False  # as the engine: no inference repacking
    layer.bias = None if linear.bias is None else nn.Parameter(linear.bias.data.to(compute_dtype),
                                                                requires_grad=False)
    return layer


def code_book(signed: bool) -> torch.Tensor:
    """bitsandbytes' 256-entry dynamic map, computed on real tensors (its construction reads
    values back) and then created as a tensor of the current mode (fake in a fake trace)."""
    import bitsandbytes.functional as F
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        values = F.create_dynamic_map(signed=signed).tolist()
    return torch.tensor(values, dtype=torch.float32)


@contextlib.contextmanager
def _own_code_books() -> Iterator[None]:
    """bitsandbytes caches its 8-bit code book in a module dict on first use; a fake tensor must
    not land there (a later real run would get it), nor a real one be used in a fake trace."""
    import bitsandbytes.functional as F

    saved = dict(F.name2qmap)
    F.name2qmap.clear()
    F.name2qmap["dynamic"] = code_book(signed=True)
    try:
        yield
    finally:
        F.name2qmap.clear()
        F.name2qmap.update(saved)


def quantize_model(model: nn.Module, quantization: str, double_quant: bool,
                   compute_dtype: torch.dtype) -> int:
    """Replaces every nn.Linear but the output head of a meta model by its quantized bitsandbytes
    layer, in place (bitsandbytes' ops run on meta tensors: shapes and dtypes only); returns how
    many layers were replaced. :func:`materialize_quant_states` gives them data later."""
    head = model.get_output_embeddings()
    count = 0
    with _own_code_books():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and child is not head:
                    setattr(parent, name, _quantized_linear(child, quantization, double_quant,
                                                            compute_dtype))
                    count += 1
    if not count:
        raise ValueError(f"quantization={quantization}: the model has no nn.Linear layer to quantize")
    flag = "is_loaded_in_4bit" if quantization == "nf4" else "is_loaded_in_8bit"
    setattr(model, flag, True)  # what transformers sets: peft then wraps bitsandbytes' layers
    return count


def materialize_quant_states(model: nn.Module, make: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Gives the quantization state of every quantized layer of a meta model ``make(meta)``
    (fake or random tensors), as :func:`lora_gui.memory.predict.trace_build.materialize` does for parameters;
    shared tensors (the nested code book) stay shared."""
    import bitsandbytes as bnb

    done: dict[int, torch.Tensor] = {}

    def new(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or not torch.is_tensor(t):
            return t
        if id(t) not in done:
            done[id(t)] = make(t)
        return done[id(t)]

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.quant_state
            state.absmax, state.code, state.offset = new(state.absmax), new(state.code), new(state.offset)
            if state.state2 is not None:
                state.state2.absmax, state.state2.code = new(state.state2.absmax), new(state.state2.code)
            module.weight.quant_state = state
        elif isinstance(module, bnb.nn.Linear8bitLt):
            module.state.CB, module.state.SCB = module.weight, new(module.state.SCB)
            module.weight.CB = module.weight.SCB = None  # moved to the state, as on first forward
            module.weight.has_fp16_weights = False


def quant_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Tensors of the quantized layers that are not parameters or buffers (4-bit absmax, nested
    absmax, code books, offset; int8 row scales): counted as frozen weights."""
    from lora_gui.models.quant import quant_state_tensors as tensors

    return tensors(model)


def make_optimizer(name: str, params: list[torch.Tensor], foreach: bool = False,
                   fused: bool = False) -> torch.optim.Optimizer:
    """The trace's optimizer: torch AdamW or bitsandbytes' 8-bit. ``foreach``: AdamW's multi-tensor
    path, torch's default for CUDA tensors (its ``_foreach_sqrt`` keeps a float32 copy of every
    exp_avg_sq during the step); ``fused``: the fused kernel a CPU run uses (in place, no
    temporaries; see lora_gui.engine.core.optim); neither: the per-parameter loop."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if fused else {"foreach": foreach}))
    import bitsandbytes as bnb

    cls = bnb.optim.AdamW8bit if name == "adamw8bit" else bnb.optim.PagedAdamW8bit
    import warnings

    from torch.utils._python_dispatch import _disable_current_modes

    with warnings.catch_warnings(), _disable_current_modes():  # its real maps are replaced below
        warnings.simplefilter("ignore", UserWarning)  # the paged one: a CPU has no paging
        opt = cls(params, lr=1e-4)
    opt.name2qmap.clear()  # made again where they are counted (materialize_8bit_state / first step)
    return opt


def materialize_8bit_state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Creates a bitsandbytes 8-bit optimizer's state as its first step leaves it."""
    made = []
    import warnings

    opt.name2qmap["dynamic"], opt.name2qmap["udynamic"] = code_book(True), code_book(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for gindex, group in enumerate(opt.param_groups):
            for pindex, p in enumerate(group["params"]):
                opt.init_state(group, p, gindex, pindex)
                opt.state[p]["step"] = 1
                made += [t for t in opt.state[p].values() if torch.is_tensor(t)]
    return made


@contextlib.contextmanager
def cuda_like_int8(enabled: bool) -> Iterator[None]:
    """int8 layers as a GPU runs them in training (``MatMul8bitLt``; a CPU runs MatMul8bitFp)."""
    if not enabled:
        yield
        return
    import bitsandbytes.autograd._functions as funcs

    orig = funcs.matmul

    def matmul(A, B, out=None, state=None, threshold=0.0, bias=None):  # noqa: ANN001, ANN202
        state = state or funcs.MatmulLtState()
        return funcs.MatMul8bitLt.apply(A, B, out, bias, state)

    funcs.matmul = matmul
    import bitsandbytes

    orig_top = bitsandbytes.matmul
    bitsandbytes.matmul = matmul
    try:
        yield
    finally:
        funcs.matmul = orig
        bitsandbytes.matmul = orig_top


def quantized_linear_bytes(n_in: int, n_out: int, quantization: str, double_quant: bool = True) -> int:
    """Bytes bitsandbytes stores for one quantized ``n_in x n_out`` weight (closed form).

    NF4: (n+1)//2 packed bytes + a float32 absmax per 64 weights + the 64-byte NF4 code book
    (double quant: a uint8 absmax per 64 weights + a float32 per 256 of those + a 1 KiB code
    book and a 4-byte offset per layer, as the loader leaves them);
    int8: one byte per weight + a float32 scale per output row.
    """
    n = n_in * n_out
    if quantization == "int8":
        return n + 4 * n_out
    blocks = -(-n // NF4_BLOCK)
    nf4_code = 16 * 4  # float32 NF4 code book kept per layer
    if not double_quant:
        return (n + 1) // 2 + 4 * blocks + nf4_code
    nested_code = 256 * 4  # float32 8-bit code book of the nested state, one copy per layer
    return (n + 1) // 2 + blocks + 4 * -(-blocks // NESTED_BLOCK) + nf4_code + nested_code + 4


def optimizer_state_bytes(numels: list[int], optimizer: str) -> int:
    """Optimizer state bytes for trainable tensors of these sizes (closed form).

    adamw: two float32 moments + a float32 step scalar per tensor. 8-bit: two uint8 moments + a
    float32 absmax per 256 values each, for tensors of at least 4,096 values (smaller: two
    float32 moments), plus the two shared 256-entry float32 maps.
    """
    if optimizer == "adamw":
        return sum(8 * n + 4 for n in numels)
    total = 2 * 256 * 4
    for n in numels:
        total += 2 * n + 2 * 4 * -(-n // OPT_BLOCK) if n >= MIN_8BIT_SIZE else 8 * n
    return total


def dequant_temporary_bytes(dims: list[tuple[int, int]], quantization: str, compute_bytes: int) -> int:
    """The largest weight a quantized layer dequantizes in the backward (compute dtype): one layer
    at a time, freed after its matmul; int8 on a GPU dequantizes in 16-bit, 4-bit to compute."""
    if quantization == "none" or not dims:
        return 0
    return max(a * b for a, b in dims) * compute_bytes


def estimate_terms(dims: dict[str, tuple[int, int]], layers: int, d: int, quantization: str,
                   double_quant: bool, optimizer: str, lora_numels: list[int], attn: str,
                   targets: tuple[str, ...]) -> dict[str, int]:
    """Closed-form corrections of :func:`lora_gui.memory.predict.estimate.estimate_text_step` for a
    quantized base and the optimizer (bytes; per token where named so).

    Returns:
        ``frozen_delta``: quantized storage of the decoder's Linear weights minus their bytes in
        the compute dtype. ``optimizer_state``: the optimizer's state bytes. ``saved_per_token``:
        bytes per token per layer that int8 layers keep for backward beyond what the unquantized
        step saves (bitsandbytes keeps each int8 layer's input as an attribute of the autograd
        context, so gradient checkpointing does not drop it: ``kept_under_checkpointing``).
        ``transient``: the largest weight a backward dequantizes at once (compute dtype).
    """
    out = {"frozen_delta": 0, "saved_per_token": 0, "transient": 0, "kept_under_checkpointing": 0,
           "optimizer_state": optimizer_state_bytes(lora_numels, optimizer)}
    if quantization == "none":
        return out
    per_layer = sum(quantized_linear_bytes(a, b, quantization, double_quant) - a * b * d
                    for a, b in dims.values())
    out["frozen_delta"] = layers * per_layer
    out["transient"] = dequant_temporary_bytes(list(dims.values()), quantization, d)
    if quantization == "int8":
        inputs = {"qkv": dims["q_proj"][0], "o": dims["o_proj"][0], "gu": dims["gate_proj"][0],
                  "down": dims["down_proj"][0]}
        groups = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gu": ("gate_proj", "up_proj"),
                  "down": ("down_proj",)}
        saved = 0
        for key, width in inputs.items():
            shared_with_lora = d == 4 and any(n in targets for n in groups[key])  # same float32 tensor
            shared_with_sdpa = key == "o" and attn == "sdpa"  # the SDPA output is saved anyway
            if not (shared_with_lora or shared_with_sdpa):
                saved += d * width
        out["saved_per_token"] = saved
        out["kept_under_checkpointing"] = sum(d * w for w in inputs.values())
    return out
