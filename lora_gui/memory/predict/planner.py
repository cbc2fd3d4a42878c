"""Batch sizes that fit a VRAM budget, per sequence bucket or resolution (source: predicted).

Text: a binary search on the closed-form estimate (instant) finds the largest micro-batch per
bucket, then the fake-tensor trace confirms it and steps down while the trace says it does not
fit (``confirm=True``; a trace of an 8B step takes seconds); with the device's step-time model
(:mod:`lora_gui.memory.predict.step_time`) the run's ``batch_choice`` then picks among the
micro-batches that fit (fastest, most headroom or largest). Images: the trace-calibrated UNet
estimate. Gradient accumulation keeps ``effective_batch`` = micro-batch x accumulation (rounded
up, so the effective batch is at least the one asked for).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lora_gui.adapter_settings import TEXT_QUANTIZATIONS
from lora_gui.memory.predict.estimate import LLAMA_LIKE, estimate_text_step, estimate_unet_step
from lora_gui.memory.predict.model_configs import load_model_config, max_positions
from lora_gui.memory.predict.parallel import GPU_COUNTS, Parallel, per_gpu, saving_bytes
from lora_gui.memory.predict.step_time import StepTimeModel, choose_micro_batch
from lora_gui.memory.predict.trace import TraceResult, trace_text_step
from lora_gui.units import GB

MAX_BUDGET_BYTES = 2 * 10**12  # 2 TB: anything above is not a GPU budget
CARDS_GB = (8, 12, 16, 24, 40, 48, 80)


@dataclass
class BucketPlan:
    """Plan for one bucket: ``micro_batch`` 0 means batch 1 does not fit."""

    bucket: int | tuple[int, int]
    micro_batch: int
    grad_accum: int
    peak_bytes: int  # predicted peak at micro_batch (at batch 1 when it does not fit)
    confirmed_by_trace: bool = False
    largest_fitting: int | None = None  # the largest micro-batch under the budget (None: not asked)
    tokens_per_s: float | None = None  # predicted padded tokens/s of a step (step-time model)
    mfu: float | None = None  # predicted useful FLOP/s of full rows over the measured matmul peak


@dataclass
class Suggestion:
    """A switch that changes the peak of the largest bucket at batch 1."""

    switch: str
    peak_bytes: int
    saving_bytes: int
    fits: bool


@dataclass
class Plan:
    """Result of :func:`plan_text` / :func:`plan_image`."""

    budget_bytes: int
    buckets: list[BucketPlan]
    fits: bool  # batch 1 fits in every bucket
    min_bytes_needed: int  # peak at batch 1 of the largest bucket
    message: str
    suggestions: list[Suggestion] = field(default_factory=list)
    source: str = "predicted"

    @property
    def batch_by_bucket(self) -> dict[Any, int]:
        """bucket -> micro-batch (0: does not fit)."""
        return {b.bucket: b.micro_batch for b in self.buckets}


def check_budget(budget_bytes: float) -> int:
    """Validates a budget in bytes: positive and at most 2 TB.

    Raises:
        ValueError: naming the value.
    """
    number = isinstance(budget_bytes, (int, float)) and not isinstance(budget_bytes, bool)
    if not number or math.isnan(budget_bytes):
        raise ValueError(f"budget_bytes must be a number of bytes, got {budget_bytes!r}")
    if budget_bytes <= 0 or budget_bytes > MAX_BUDGET_BYTES:
        raise ValueError(f"budget_bytes={budget_bytes!r} is out of range: "
                         f"must be > 0 and <= {MAX_BUDGET_BYTES} (2 TB)")
    return int(budget_bytes)


def _largest(peak: Callable[[int], int], budget: int, hi: int) -> int:
    """Largest n in [1, hi] with peak(n) <= budget (peak increasing in n); 0 if none."""
    if peak(1) > budget:
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if peak(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _needs(nbytes: int) -> str:
    return f"does not fit even at batch 1: needs {nbytes / GB:.2f} GB"


def _speed(p: BucketPlan) -> str:
    mfu = f", MFU {p.mfu:.1%}" if p.mfu else ""
    return f" (~{p.tokens_per_s:,.0f} tokens/s{mfu})" if p.tokens_per_s else ""


def _finish(budget: int, plans: list[BucketPlan], needed: int, frozen: int,
            suggestions: list[Suggestion]) -> Plan:
    fits = all(p.micro_batch > 0 for p in plans)
    if frozen > budget:
        msg = _needs(needed) + f" (the frozen weights alone are {frozen / GB:.2f} GB)"
    elif not fits:
        msg = _needs(needed) + "; see the suggestions"
    else:
        msg = "fits: " + ", ".join(f"{p.bucket}: batch {p.micro_batch} x {p.grad_accum}" + _speed(p)
                                   for p in plans)
    return Plan(budget, plans, fits, needed, msg, suggestions if not fits else [])


def _shifted(budget: int, plans: list[BucketPlan], base: TraceResult, saving: int,
             suggestions: list[Suggestion], config: Any, parallel: Parallel | None) -> Plan:
    """The plan searched under ``budget + saving`` reported per GPU (every peak less ``saving``)."""
    plans = [replace(p, peak_bytes=p.peak_bytes - saving) for p in plans]
    suggestions = [replace(s, peak_bytes=s.peak_bytes - saving) for s in suggestions]
    frozen = per_gpu(base, config, parallel).breakdown["frozen_weights"]
    return _finish(budget, plans, base.peak_bytes - saving, frozen, suggestions)


def plan_text(config: Any, budget_bytes: float, buckets: Sequence[int], *, effective_batch: int = 8,
              max_batch: int = 256, confirm: bool = True, parallel: Parallel | None = None,
              step_time: StepTimeModel | None = None, batch_choice: str = "largest",
              **step: Any) -> Plan:
    """Micro-batch per sequence-length bucket under ``budget_bytes``: the largest that fits, or
    with ``step_time`` the one ``batch_choice`` picks among those that fit.

    Args:
        config: model config (see :func:`load_model_config`).
        budget_bytes: VRAM budget in bytes (``peak_bytes`` incl. CUDA overheads is compared).
        buckets: sequence lengths (tokens), e.g. ``[256, 512, 1024, 2048]``.
        effective_batch: sequences per optimizer step to keep via gradient accumulation.
        max_batch: upper end of the search.
        confirm: check each chosen batch with the fake-tensor trace and step down if needed.
        parallel: data-parallel processes and FSDP: peaks and the budget are per GPU.
        step_time: the device's step-time model; with it each bucket's predicted tokens/s.
        batch_choice: 'largest', 'fastest' or 'headroom' (:func:`step_time.choose_micro_batch`;
            without ``step_time``, the largest).
        **step: lora_rank, target_modules, attn_implementation, gradient_checkpointing, dtype,
            device (passed to the estimate and the trace).

    Returns:
        A :class:`Plan`; when batch 1 does not fit, ``suggestions`` lists switches with savings.
    """
    budget = check_budget(budget_bytes)
    cfg = load_model_config(config)
    if not buckets or any(b < 1 for b in buckets):
        raise ValueError(f"buckets must be positive sequence lengths, got {list(buckets)}")
    longest = max(buckets)
    base = estimate_text_step(cfg, batch_size=1, seq_len=longest, **step)
    saving = saving_bytes(base, cfg, parallel)  # FSDP: constant in batch and length
    limit = budget + saving  # one-GPU peaks under this budget = per-GPU peaks under ``budget``
    plans = []
    for seq in sorted(buckets):
        def est(b: int, seq: int = seq) -> int:
            return estimate_text_step(cfg, batch_size=b, seq_len=seq, **step).peak_bytes
        mb = _largest(est, limit, max_batch)
        peak, confirmed = est(max(mb, 1)), False
        while confirm and mb > 0:
            traced = trace_text_step(cfg, batch_size=mb, seq_len=seq, **step).peak_bytes
            peak, confirmed = traced, True
            if traced <= limit:
                break
            mb -= 1
        largest = mb
        if step_time is not None and mb > 1:
            mb = choose_micro_batch(step_time, effective_batch, seq, largest, batch_choice)
            if mb != largest:  # fewer rows: a lower peak, traced again when the largest was
                peak = (trace_text_step(cfg, batch_size=mb, seq_len=seq, **step).peak_bytes if confirmed
                        else est(mb))
        accum = math.ceil(effective_batch / mb) if mb else 0
        timed = step_time is not None and mb > 0
        speed = step_time.tokens_per_s(effective_batch, mb, seq) if timed else None
        mfu = step_time.mfu(effective_batch, mb, seq) if timed else None
        plans.append(BucketPlan(seq, mb, accum, peak, confirmed, largest, speed, mfu))
    fits_all = all(p.micro_batch for p in plans)
    sugg = [] if fits_all else _text_suggestions(cfg, limit, longest, base, step)
    return _shifted(budget, plans, base, saving, sugg, cfg, parallel)


def _text_suggestions(cfg: Any, budget: int, seq: int, base: TraceResult, step: dict) -> list[Suggestion]:
    """Switches that lower the batch-1 peak of the longest bucket, with predicted savings."""
    out = []

    def add(name: str, **change: Any) -> None:
        kw = {**step, **{k: v for k, v in change.items() if k != "seq_len"}}
        peak = estimate_text_step(cfg, batch_size=1, seq_len=change.get("seq_len", seq), **kw).peak_bytes
        out.append(Suggestion(name, peak, base.peak_bytes - peak, peak <= budget))

    if not step.get("gradient_checkpointing"):
        add("gradient_checkpointing=True", gradient_checkpointing=True)
    if not step.get("loss_chunk"):
        add("loss_chunk=1024", loss_chunk=1024)
    if step.get("attn_implementation", "sdpa") == "eager":
        add("attn_implementation='sdpa'", attn_implementation="sdpa")
        add("windowed attention (window 512)", attention_window=512)
    quantizable = getattr(cfg, "model_type", None) in LLAMA_LIKE  # nn.Linear decoders (not GPT-2)
    if quantizable and step.get("quantization", "none") == "none":  # base weights in 4 / 8 bits
        add("quantization=nf4", quantization="nf4")
        add("quantization=int8", quantization="int8")
    if step.get("optimizer", "adamw") == "adamw":
        add("optimizer=adamw8bit", optimizer="adamw8bit")
    rank = step.get("lora_rank", 16)
    if rank > 4:
        add(f"lora_rank={rank // 2}", lora_rank=rank // 2)
    def at_len(n: int) -> int:  # peak at batch 1 and n x 256 tokens
        return estimate_text_step(cfg, batch_size=1, seq_len=n * 256, **step).peak_bytes

    fit_len = _largest(at_len, budget, max(1, seq // 256 - 1))
    if fit_len:
        add(f"max length {fit_len * 256}", seq_len=fit_len * 256)
    return sorted((s for s in out if s.saving_bytes > 0), key=lambda s: -s.saving_bytes)  # int8 can cost more


def accumulated_peak(estimate: Callable[[int], TraceResult], micro_batch: int, images: int) -> int:
    """The estimated peak of a step of ``images`` images cut into micro-batches of at most
    ``micro_batch``: the first micro-batch's, or a later one's (the largest, ``images -
    micro_batch`` at most) beside the LoRA gradients the earlier ones left, whichever is higher
    (all of them counted: an upper bound on those alive at the first one's peak)."""
    first = estimate(micro_batch)
    if images <= micro_batch:
        return first.peak_bytes
    later = estimate(min(micro_batch, images - micro_batch))
    return max(first.peak_bytes, later.peak_bytes + later.breakdown.get("lora_params", 0))


def plan_image(config: Any, budget_bytes: float, resolutions: Sequence[int | tuple[int, int]], *,
               effective_batch: int = 8, max_batch: int = 64, parallel: Parallel | None = None,
               resident: int = 0, **step: Any) -> Plan:
    """Largest micro-batch per resolution bucket (UNet), like :func:`plan_text`.

    Args:
        config: UNet config; budget_bytes: bytes; resolutions: pixels or (h, w) buckets.
        effective_batch, max_batch, parallel: as in :func:`plan_text`.
        resident: bytes on the device besides the UNet step, added to every peak (VAE and text
            encoders kept without a latent cache, the text encoders' LoRA training).
        **step: lora_rank, gradient_checkpointing, dtype, device, text_seq_len, lean_backward.

    Returns:
        A :class:`Plan` (predicted with the trace-calibrated estimate).
    """
    budget = check_budget(budget_bytes)
    plans = []
    largest = max(resolutions, key=lambda r: r * r if isinstance(r, int) else r[0] * r[1])

    def est(b: int, res: Any, resident_free: bool = False, **change: Any) -> TraceResult:
        result = estimate_unet_step(config, batch_size=b, resolution=res, **{**step, **change})
        result.peak_bytes += 0 if resident_free else resident
        return result

    base = est(1, largest)
    saving = saving_bytes(est(1, largest, resident_free=True), config, parallel)  # FSDP: the UNet's share
    budget, reported = budget + saving, budget  # search one-GPU peaks; report per GPU

    def step_peak(b: int, res: Any) -> int:
        return accumulated_peak(lambda n: est(n, res), b, effective_batch)

    for res in resolutions:
        mb = _largest(lambda b, res=res: step_peak(b, res), budget, max_batch)
        accum = math.ceil(effective_batch / mb) if mb else 0
        plans.append(BucketPlan(res, mb, accum, step_peak(max(mb, 1), res)))
    sugg: list[Suggestion] = []
    if not all(p.micro_batch for p in plans):
        if not step.get("gradient_checkpointing"):
            peak = est(1, largest, gradient_checkpointing=True).peak_bytes
            saving = base.peak_bytes - peak
            sugg.append(Suggestion("gradient_checkpointing=True", peak, saving, peak <= budget))
        for res in range(1536, 511, -64):
            peak = est(1, res).peak_bytes
            if peak <= budget:
                sugg.append(Suggestion(f"resolution {res}", peak, base.peak_bytes - peak, True))
                break
    return _shifted(reported, plans, base, saving, sugg, config, parallel)


@dataclass
class CardFit:
    """One row of the "what fits where" table (source: predicted).

    ``by_gpus``: GPU count -> (longest, batch per GPU at chosen) with FSDP sharding the frozen
    weights over that many cards of this size (under DDP every GPU is the one-GPU column, and the
    global batch is the count times the per-GPU batch).
    """

    card_gb: float  # GB (1e9 bytes): a card size, or the budget being planned
    longest: int | None  # tokens (text) or pixels (image) at batch 1; None: nothing fits
    batch_at_chosen: int  # largest batch at the chosen length / resolution (0: none)
    by_gpus: dict[int, tuple[int | None, int]] = field(default_factory=dict)
    by_quantization: dict[str, tuple[int | None, int]] = field(default_factory=dict)  # text, one GPU


def what_fits_where(config: Any, *, chosen: int, cards_gb: Sequence[float] = CARDS_GB,
                    max_batch: int = 256, gpu_counts: Sequence[int] = GPU_COUNTS,
                    **step: Any) -> list[CardFit]:
    """For each card size: longest sequence (text, multiples of 256 up to the model's max
    position) or largest resolution (image, 512-1536 step 64) at batch 1, and the largest batch
    at ``chosen`` (tokens or pixels). Uses the estimates (instant).

    Returns:
        One :class:`CardFit` per card, with the FSDP columns for ``gpu_counts`` and, for text,
        a (longest, batch) column per base-weight quantization (none / nf4 / int8, one GPU).
    """
    cfg = load_model_config(config)
    image = isinstance(cfg, dict)
    if image:
        def estimate(b: int, res: int) -> TraceResult:
            return estimate_unet_step(cfg, batch_size=b, resolution=res, **step)
        sizes = list(range(512, 1537, 64))
    else:
        def estimate(b: int, n: int) -> TraceResult:
            return estimate_text_step(cfg, batch_size=b, seq_len=n, **step)
        sizes = list(range(256, (max_positions(cfg) or 4096) + 1, 256))
    savings = {n: saving_bytes(estimate(1, sizes[0]), cfg, Parallel(n, fsdp=True)) for n in gpu_counts}

    def fit(budget: int) -> tuple[int | None, int]:
        k = _largest(lambda i: estimate(1, sizes[i - 1]).peak_bytes, budget, len(sizes))
        batch = _largest(lambda b: estimate(b, chosen).peak_bytes, budget, max_batch)
        return (sizes[k - 1] if k else None), batch

    rows = []
    for gb in cards_gb:
        budget = check_budget(gb * GB)
        longest, batch = fit(budget)
        rows.append(CardFit(gb, longest, batch, {n: fit(budget + savings[n]) for n in gpu_counts}))
    if not image and cfg.model_type in LLAMA_LIKE:
        _quantization_columns(rows, cfg, sizes, chosen, max_batch, step)
    return rows


def _quantization_columns(rows: list[CardFit], cfg: Any, sizes: list[int], chosen: int,
                          max_batch: int, step: dict[str, Any]) -> None:
    """Fills each row's ``by_quantization``: (longest at batch 1, batch at ``chosen``) per
    quantization of the base weights, on one GPU (estimate)."""
    for quantization in TEXT_QUANTIZATIONS:
        kw = {**step, "quantization": quantization}

        def peak(b: int, n: int, kw: dict = kw) -> int:
            return estimate_text_step(cfg, batch_size=b, seq_len=n, **kw).peak_bytes

        for row in rows:
            budget = check_budget(row.card_gb * GB)
            k = _largest(lambda i, budget=budget: peak(1, sizes[i - 1]), budget, len(sizes))
            batch = _largest(lambda b: peak(b, chosen), budget, max_batch)
            row.by_quantization[quantization] = (sizes[k - 1] if k else None, batch)
