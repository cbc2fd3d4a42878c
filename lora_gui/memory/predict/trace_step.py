"""One training step traced: the model materialized (fake or real), one steady-state step run with
the training loop's lifetimes, and its peak broken down by category, with the CUDA overheads and
the caching allocator's replay. Every trace (text and UNet in :mod:`lora_gui.memory.predict.trace`,
whose doc says what is traced and how; DiT, video, text encoders) runs its step through
:func:`trace_step`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from lora_gui.memory.predict.adapter_trace import adapter_always_on, quantized_dora
from lora_gui.memory.predict.batch_trace import batch_structure, kernel_watch
from lora_gui.memory.predict.trace_build import materialize
from lora_gui.memory.predict.trace_result import (
    CATEGORIES,
    CUBLAS_WORKSPACE_BYTES,
    CUDA_ALLOC_ROUNDING,
    CUDA_CONTEXT_BYTES,
    TraceResult,
    _PhaseTracker,
)
from lora_gui.models.checkpointing import enable_checkpointing
from lora_gui.models.cuda_autocast import forward_under


def _materialize_adamw_state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Creates AdamW's state as the first step leaves it (steady state for every later step)."""
    made = []
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state[p]
            st["step"] = torch.tensor(1.0, dtype=torch.float32)  # float32 scalar, as torch does
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            made += [st["step"], st["exp_avg"], st["exp_avg_sq"]]
    return made


@contextlib.contextmanager
def _cuda_like_dropout(enabled: bool) -> Iterator[None]:
    """Dropout as CUDA runs it: ``native_dropout`` keeps a bool mask (CPU keeps input-dtype)."""
    if not enabled:
        yield
        return
    orig = torch.nn.functional.dropout

    def dropout(input, p=0.5, training=True, inplace=False):  # noqa: ANN001, ANN202 (F.dropout API)
        if not training or p == 0.0 or p >= 1.0:
            return orig(input, p, training, inplace)
        return torch.native_dropout(input, p, True)[0]

    torch.nn.functional.dropout = dropout
    try:
        yield
    finally:
        torch.nn.functional.dropout = orig


def _run_step(model: nn.Module, opt: torch.optim.Optimizer, tracker: _PhaseTracker,
              make_inputs: Callable[[], dict],
              loss_fn: Callable[[nn.Module, dict, _PhaseTracker], torch.Tensor], head: nn.Module | None,
              hold_inputs: bool) -> None:
    """One training step with phase markers: forward, loss, backward, optimizer step.
    ``hold_inputs``: the batch stays alive through the backward, as the text loop holds it."""
    hooks = []
    tracker.category = tracker.phase = "activations"
    tracker.head_entered = False
    if head is not None:
        hooks.append(head.register_forward_pre_hook(lambda _m, args: tracker.enter_head(args[0])))
    try:
        inputs: dict | None = make_inputs()
        loss = loss_fn(model, inputs, tracker)
        if not hold_inputs:
            inputs = None
    finally:
        for h in hooks:
            h.remove()
    tracker.phase = "backward"
    # the loss/logits gradients come first; the head input's gradient hook ends them
    tracker.category = "temporaries" if tracker.head_entered else "activations"
    scaled = loss / 1  # accelerate's backward divides by its accumulation steps (1): a scalar more
    scaled.backward()
    del scaled, loss, inputs
    for p in model.parameters():
        if p.grad is not None and (rec := tracker.record_of(p.grad)) is not None:
            rec.category = "gradients"
    tracker.category = tracker.phase = "optimizer_state"
    opt.step()
    opt.zero_grad(set_to_none=True)
    tracker.category, tracker.phase = "activations", "done"


def trace_step(model: nn.Module, *, fake: bool, device: str, make_inputs: Callable[[], dict],
                loss_fn: Callable[[nn.Module, dict, _PhaseTracker], torch.Tensor], head: nn.Module | None,
                gradient_checkpointing: bool, warm_steps: int, checkpoint_layers: int = 0,
                setup: Callable[[nn.Module, Callable], None] | None = None, optimizer: str = "adamw",
                cuda_int8: bool = False, packed_rows: bool = False, grads_before: bool = False,
                long_context: dict[str, Any] | None = None, autocast: torch.dtype | None = None,
                hold_inputs: bool = False) -> TraceResult:
    """Materializes ``model`` (fake or real), runs one steady-state step and breaks its peak down.

    ``setup(model, make)``: materializes what is neither a parameter nor a buffer (quantization
    state: :func:`lora_gui.memory.predict.quant.materialize_quant_states`). ``optimizer``: adamw or
    bitsandbytes' 8-bit (:mod:`lora_gui.memory.predict.quant`).
    ``packed_rows``: the batch's rows hold several documents (``batch_trace.batch_structure``).
    ``grads_before``: the LoRA gradients exist before the forward, as for every micro-batch but
    the first of an optimizer step (gradient accumulation adds into them).
    ``long_context``: :func:`lora_gui.models.long_context.apply_long_context` switches; their host
    copies are counted apart (``info["host_bytes"]``), not in the device peak.
    ``autocast``: the model's forward runs as a run's does under that mixed precision on
    ``device`` (:func:`lora_gui.models.cuda_autocast.forward_under`); None: no autocast.
    ``hold_inputs``: the batch's tensors stay alive until the backward ends (the text loop's).
    """
    from lora_gui.memory.predict import quant
    t0 = time.perf_counter()
    mode = FakeTensorMode(allow_non_fake_inputs=False) if fake else contextlib.nullcontext()
    with mode:
        make = (lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu")) if fake else _random_like
        materialize(model, make)
        if setup is not None:
            setup(model, make)
        if gradient_checkpointing:
            enable_checkpointing(model, checkpoint_layers)
        if long_context:
            from lora_gui.models.long_context import apply_long_context

            apply_long_context(model, **long_context)
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = quant.make_optimizer(optimizer, trainable, foreach=device == "cuda", fused=device == "cpu")
        tracker = _PhaseTracker()
        frozen = [p for p in model.parameters() if not p.requires_grad] + list(model.buffers())
        frozen += quant.quant_state_tensors(model)
        tracker.category = "frozen_weights"
        tracker.track(frozen)
        tracker.category = "lora_params"
        tracker.track(trainable)
        tracker.category = "optimizer_state"
        kernels: set[str] = set()
        workspaces: list[int] = []  # bytes of each attention backward workspace (CUDA kernels)
        with tracker, _cuda_like_dropout(device == "cuda"), batch_structure(packed_rows), \
                kernel_watch(kernels, device, workspaces), quant.cuda_like_int8(cuda_int8), \
                adapter_always_on(fake), quantized_dora(), forward_under(model, autocast, device):
            for _ in range(warm_steps):  # real steps that create the optimizer state themselves
                _run_step(model, opt, tracker, make_inputs, loss_fn, head, hold_inputs)
            if warm_steps == 0 and optimizer == "adamw":
                _materialize_adamw_state(opt)
            elif warm_steps == 0:
                quant.materialize_8bit_state(opt)
            if grads_before:
                tracker.category = "gradients"
                for p in trainable:
                    p.grad = torch.zeros_like(p)
            tracker.reset_peak()
            tracker.peak_event, tracker.peak_phase = tracker.events, "start"
            tracker.start_event = tracker.events
            workspaces.clear()  # the measured step's calls only
            _run_step(model, opt, tracker, make_inputs, loss_fn, head, hold_inputs)
    result = _result(tracker, device, time.perf_counter() - t0, model, trainable)
    result.info["sdpa_kernels"] = sorted(kernels)
    result.info["attention_workspace_bytes"] = max(workspaces, default=0)  # one layer's, largest
    result.info["autocast"] = None if autocast is None else str(autocast).removeprefix("torch.")
    return result


def run_autocast(device: str, dtype: torch.dtype, cpu_autocast: str | None = None) -> torch.dtype | None:
    """The autocast a run trains under on ``device`` with frozen weights in ``dtype``: on a GPU
    16-bit weights come with accelerate's mixed precision of the same dtype
    (:func:`lora_gui.models.precision.weights_dtype`); a CPU run's mixed precision is
    ``cpu_autocast`` ('bf16' / 'fp16'; None: none), whatever its weights' dtype."""
    if device == "cpu":
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cpu_autocast or "")
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def _random_like(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu")
    if out.is_floating_point():
        out.normal_(0.0, 0.02)
    else:
        out.zero_()
    return out


def _result(tracker: _PhaseTracker, device: str, seconds: float, model: nn.Module,
            trainable: list[torch.Tensor]) -> TraceResult:
    live = tracker.live_at_peak()
    breakdown = dict.fromkeys(CATEGORIES, 0)
    for r in live:
        breakdown[r.category] += r.nbytes
    traced = tracker.peak_bytes
    assert sum(breakdown.values()) == traced, (breakdown, traced)  # by construction
    overheads = dict.fromkeys(("cuda_context", "cublas_workspace", "allocator_rounding"), 0)
    reserved = None
    if device == "cuda":
        a = CUDA_ALLOC_ROUNDING
        overheads["allocator_rounding"] = sum(-r.nbytes % a for r in live)  # bytes of padding
        overheads["cublas_workspace"] = CUBLAS_WORKSPACE_BYTES
        overheads["cuda_context"] = CUDA_CONTEXT_BYTES
        reserved = _replay(tracker)
        from lora_gui.memory.predict.allocator import capped_need

        # reserved beyond allocated: what the allocator's segments hold that no live block uses
        # (expandable segments: the pages a capped run needs, the allocator unmapping free ones,
        # and the fragmentation it could not unmap on a card)
        overheads["allocator_cache"] = max(0, capped_need(reserved) - reserved.peak_allocated)
    n_train = sum(p.numel() for p in trainable)
    info = {
        "trainable_params": n_train,
        "total_params": sum(p.numel() for p in model.parameters()),
        "allocations": len(tracker.records),
        "peak_phase": tracker.peak_phase,
        "host_bytes": tracker.host_peak_bytes,  # host memory of the long-context switches (peak)
    }
    if reserved is not None:
        info["allocator_replay"] = {"peak_allocated": reserved.peak_allocated,
                                    "peak_reserved": reserved.peak_reserved, "segments": reserved.segments,
                                    "peak_pages": reserved.peak_pages,
                                    "expandable_segments": reserved.expandable}
    return TraceResult(traced + sum(overheads.values()), traced, breakdown, overheads, device, seconds, info)


def _replay(tracker: _PhaseTracker):
    """The caching allocator's replay of the run's first two steps (:mod:`allocator`)."""
    from lora_gui.memory.predict.allocator import replay_records, two_steps
    from lora_gui.memory.predict.cuda_kernels import CUBLAS_HANDLES as handles
    from lora_gui.memory.predict.cuda_kernels import CUBLAS_WORKSPACE_PER_HANDLE as cublas
    from lora_gui.memory.predict.cuda_kernels import CUBLASLT_WORKSPACE_BYTES as cublaslt
    from lora_gui.memory.runtime.alloc_conf import expandable_segments_planned

    start = tracker.start_event
    before = [r for r in tracker.records if r.born <= start and (r.died is None or r.died > start)]
    state = [r.nbytes for r in before if r.category == "optimizer_state"]
    kept = [r.nbytes for r in before if r.category != "optimizer_state"]
    step = [(r.nbytes, r.born, r.died) for r in tracker.records if r.born > start]
    return replay_records(two_steps(kept, state, step, fixed=(*[cublas] * handles, cublaslt)),
                          expandable=expandable_segments_planned())


def accumulated_trace(trace: Callable[[int, bool], TraceResult], micro_batch: int,
                      images: int) -> TraceResult:
    """The higher-peaked trace of a step of ``images`` samples cut into micro-batches of at most
    ``micro_batch``: its first micro-batch (``trace(size, False)``), or its largest later one
    (``images - micro_batch`` at most), which starts with every LoRA gradient the earlier ones
    left (``trace(size, True)``: gradient accumulation adds into them)."""
    first = trace(micro_batch, False)
    if images <= micro_batch:
        return first
    later = trace(min(micro_batch, images - micro_batch), True)
    return later if later.peak_bytes > first.peak_bytes else first
