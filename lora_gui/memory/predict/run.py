"""A run's predicted peak, one call for every entry point (source: predicted).

:func:`predict` is what ``python -m lora_gui plan``, the dashboard's Plan and Train tabs and the
Compare tab's predicted rows call; it runs the very functions the run calls when it starts
(:func:`text_memory_plan` for text, :func:`lora_gui.memory.predict.image_run.image_run_prediction`
for UNets and DiTs) on the same inputs: the run's real data, and the model's shapes from its
config files (an image pipeline is built on the meta device; no weights are read). The figure a
front end shows is therefore the figure the run will log. :func:`estimate` is the instant
closed-form estimate a form shows while :func:`predict` works.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lora_gui.config import RunConfig
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.parallel import Parallel
from lora_gui.memory.predict.trace import TraceResult
from lora_gui.units import GB, gb

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    """What the planner says about a run (source: predicted).

    Attributes:
        peak_bytes: the run's predicted peak per GPU (CUDA overheads included on 'cuda').
        device: the device the prediction is for.
        how: 'plan' (the run's own function) or 'estimate' (closed form, instant).
        caps: micro-batch cap per bucket (tokens, or latent pixels for images).
        plan: the per-bucket plan under the budget (None without one, or for fixed batches).
        step: the trace (or estimate) of the peak micro-batch, with its breakdown.
        bucket_batches: (bucket, micro-batch) rows for a table.
        train_peak_bytes: image runs: the training steps alone, the caching pass apart.
        figures: what run.json's ``prediction`` holds (kernel, micro-batch, ...).
    """

    peak_bytes: int
    device: str
    how: str
    caps: dict[int, int] = field(default_factory=dict)
    plan: planner.Plan | None = None
    step: TraceResult | None = None
    bucket_batches: list[tuple[str, int]] = field(default_factory=list)
    train_peak_bytes: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)


# -- the text run's own function ---------------------------------------------------------------
def text_memory_plan(cfg: RunConfig, source: str | None, budget: int | None, device: str,
                     parallel: Parallel | None = None, lengths: list[int] | None = None,
                     added_tokens: int | None = None, samples: Sequence[Any] | None = None,
                     ) -> tuple[dict[int, int], TraceResult, planner.Plan | None, dict[str, Any]]:
    """Text run: caps per length bucket under the budget (bucketed batching only), the trace of
    the worst micro-batch the run will execute on its real data (:func:`predict_text_run` of
    :mod:`lora_gui.memory.predict.run_predict`), the plan (None without a budget or with fixed/packed
    batches) and the prediction's figures (peak, device, kernel, micro-batch).

    Args:
        lengths: token lengths of the training samples (the run passes them; the form lets the
            planner read and tokenize the data as the run will).
        added_tokens: embedding rows the run added for a chat template's tokens (the run passes
            them with ``lengths``; the form lets the planner read them from the data).
        samples: the training samples (the run passes them; ``lora_init`` eva's pass reads the
            first batches of them; the form lets the planner read them from the data).
    """
    from lora_gui.memory.predict import run_plan, run_predict
    from lora_gui.memory.predict.checkpoint_choice import choose_checkpoint_layers, chooses_checkpointing
    from lora_gui.memory.runtime.guard import BatchCaps

    depth, weights = None, lengths  # checkpointing without a layer count: the run's depth, chosen alike
    if budget and chooses_checkpointing(cfg):
        if weights is None and source is not None:  # the run weighs the depths by its samples' lengths
            weights = run_predict.data_lengths(cfg, source)[0]
        depth = choose_checkpoint_layers(cfg, source, budget, device, parallel, weights)
        cfg = depth.applied(cfg) if depth is not None else cfg
    if cfg.lora_init == "eva" and samples is None and lengths is None and source is not None:
        samples, tokenizer_len, chat = run_predict.train_samples(cfg, source)  # once: steps and EVA
        lengths = [len(s) for s in samples]
        if added_tokens is None:
            added_tokens = run_predict.added_rows(run_plan.model_config_for(cfg, source), tokenizer_len, chat)
    caps, plan = BatchCaps(), None
    if budget and cfg.resolved_batching() == "bucketed":
        plan = run_plan.plan_run(cfg, budget, device, source, parallel=parallel)
        caps.caps = {int(b.bucket): max(1, b.micro_batch) for b in plan.buckets}
    pred = run_predict.predict_text_run(cfg, device, source, lengths=lengths, parallel=parallel,
                                        caps=caps, added_tokens=added_tokens)
    figures = pred.to_json()
    if plan is not None:  # the speed the plan predicts, beside its peak
        from lora_gui.memory.predict.run_speed import predicted_speed, step_time_model

        per_rank = max(1, -(-cfg.batch_size // (parallel.world_size if parallel else 1)))
        timing = step_time_model(cfg, run_plan.model_config_for(cfg, source), device,
                                 run_plan.step_kwargs(cfg, device))  # cached by plan_run
        figures |= predicted_speed(timing, plan, per_rank, weights, cfg.pad_multiple)
    if depth is not None:
        figures["checkpointing"] = depth.to_json()
    # FSDP: the lora_init pass runs on the main process before sharding, over the whole base
    resident = {**pred.step.breakdown, "frozen_weights": pred.step.info.get(
        "frozen_whole_bytes", pred.step.breakdown.get("frozen_weights", 0))}
    return caps.caps, pred.step, plan, with_init_peak(cfg, source, device, figures, resident, samples,
                                                      added_tokens)


def with_init_peak(cfg: RunConfig, source: str | None, device: str, figures: dict[str, Any],
                   breakdown: dict[str, int] | None = None, samples: Sequence[Any] | None = None,
                   added_tokens: int | None = None) -> dict[str, Any]:
    """A ``lora_init`` pass runs before the first step: PiSSA's SVD and OLoRA's QR (traced with
    peft's code), LoftQ's fit to each 4-bit layer's rounding error (the step's resident 4-bit
    weights and adapter from ``breakdown``, plus the largest layer's pass traced), CorDA's
    covariances and decompositions (closed form, init_trace) and EVA's forwards over the run's
    first batches with peft's incremental SVD hooks (traced, eva_trace; ``samples``: the training
    samples, else read from the data): its peak is ``init_peak_bytes``, and the run's peak when
    it is above the steps' (``step_peak_bytes`` then keeps the steps' figure)."""
    from lora_gui.memory.predict import init_trace
    from lora_gui.memory.predict.run_plan import step_kwargs
    from lora_gui.memory.predict.run_predict import model_config_for
    from lora_gui.memory.predict.trace_build import as_dtype

    if cfg.lora_init not in (*init_trace.DECOMPOSING_INITS, "corda", "loftq", "eva"):
        return figures
    kw = step_kwargs(cfg, device)
    args = dict(dtype=as_dtype(kw["dtype"]), target_modules=kw["target_modules"], spec=kw["adapter"],
                device=device)
    config = model_config_for(cfg, source)
    if cfg.lora_init == "corda":
        init = init_trace.corda_peak_bytes(config, tokens=cfg.max_seq_len, **args)
    elif cfg.lora_init == "loftq":
        resident = (breakdown or {}).get("frozen_weights", 0) + (breakdown or {}).get("lora_params", 0)
        init = init_trace.loftq_peak_bytes(config, resident_bytes=resident, **args)
    elif cfg.lora_init == "eva":
        from lora_gui.memory.predict.eva_trace import eva_peak_bytes, plan_batches

        batches, added = plan_batches(cfg, source, samples, added_tokens)
        init = eva_peak_bytes(config, batches=batches, attn_implementation=kw["attn_implementation"],
                              loss_chunk=kw["loss_chunk"], added_tokens=added, **args)
    else:
        init = init_trace.init_peak_bytes(config, **args)
    figures["init_peak_bytes"] = init
    if init > figures["peak_bytes"]:
        log.info("the %s initialisation (%s) is this run's predicted peak, above its steps "
                 "(%s)", cfg.lora_init, gb(init), gb(figures["peak_bytes"]))
        figures["step_peak_bytes"], figures["peak_bytes"] = figures["peak_bytes"], init
    return figures


# -- every entry point --------------------------------------------------------------------------
def run_device() -> str:
    """Where a run started here trains: 'cuda' when torch sees a GPU, else 'cpu'."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def predict(cfg: RunConfig, budget_bytes: int | None = None, device: str | None = None, *,
            processes: int = 1, fsdp: bool = False, offload: bool = False) -> Prediction:
    """The plan the run will make when it starts (same function, same inputs; no weights loaded).

    Args:
        cfg: the run's settings.
        budget_bytes: the budget the run would enforce (default: its own ``budget_gb``; None
            or 0 there: no budget, no caps).
        device: 'cuda' or 'cpu' (default: where a run started here trains).
        processes: data-parallel processes (the prediction is per GPU); fsdp: shard the frozen
            weights over them (text); offload: FSDP's shards in host memory (GPUs).

    Raises:
        UserError: the model or data cannot be read (the message names it).
        ValueError / NotImplementedError: the planner cannot trace this model.
    """
    device = device or run_device()
    if budget_bytes is None:
        budget_bytes = int(cfg.budget_gb * GB) or None  # as the engines read budget_gb
    if cfg.task == "image":
        return _predict_image(cfg, budget_bytes, device, processes)
    if cfg.task == "video":
        return _predict_video(cfg, budget_bytes, device, processes)
    from lora_gui.models.text import resolve_model_source

    parallel = Parallel(processes, fsdp, offload) if processes > 1 or fsdp else None
    source = _text_source(cfg, resolve_model_source)
    caps, step, plan, figures = text_memory_plan(cfg, source, budget_bytes, device, parallel)
    if plan is None and budget_bytes:  # fixed or packed batches: the buckets are shown, not applied
        from lora_gui.memory.predict.run_plan import plan_run

        plan = plan_run(cfg, budget_bytes, device, source, parallel=parallel)
    step.info["prediction"] = figures
    init = figures.get("init_peak_bytes", 0)  # a lora_init pass before step 1 must fit the budget too
    if budget_bytes and plan is not None and init > budget_bytes:
        plan = replace(plan, fits=False, min_bytes_needed=max(plan.min_bytes_needed, init),
                       message=f"does not fit: the lora_init {cfg.lora_init} pass before the first step "
                               f"needs {init / GB:.2f} GB")
    rows = [(str(k), v) for k, v in sorted(caps.items())]
    # the run's whole peak: a lora_init pass before step 1 when it is above the steps (figures)
    return Prediction(figures.get("peak_bytes", step.peak_bytes), device, "plan", caps, plan, step, rows,
                      figures=figures)


def _text_source(cfg: RunConfig, resolve: Any) -> str | None:
    """The model's source for the data's tokenizer, or None for a bundled architecture name."""
    from lora_gui.memory.predict.model_configs import bundled_models

    return None if cfg.model in bundled_models() else resolve(cfg.model)


def _predict_image(cfg: RunConfig, budget: int | None, device: str, processes: int) -> Prediction:
    """The image run's own plan on its pipeline built on the meta device and its real data."""
    from lora_gui.data.image_batches import latent_tokens, load_image_data
    from lora_gui.memory.predict.image_run import image_run_prediction
    from lora_gui.models.diffusion import image_model_for_run
    from lora_gui.models.precision import planned_weights_dtype

    dtype = planned_weights_dtype(cfg.precision, device)
    data = load_image_data(cfg)
    model = image_model_for_run(cfg, dtype, weights=False)
    planned = image_run_prediction(cfg, model, data, budget, torch.device(device), dtype, processes)
    if planned.peak_bytes is None:
        raise ValueError(f"the planner cannot trace {cfg.model} (see the log)")
    used = sorted(set(data.buckets), key=lambda b: b[0] * b[1])
    rows = [(f"{w}x{h}", planned.caps.caps.get(latent_tokens((w, h)),
                                              min(cfg.batch_size, data.buckets.count((w, h)))))
            for w, h in used]
    figures = planned.figures(device) or {}
    planned.step.info["prediction"] = figures
    plan = planned.plan
    encoding = planned.step.info.get("encoding_pass_bytes", 0)
    if budget and plan is not None and (encoding > budget or plan.fits and planned.peak_bytes > budget):
        what = ("encoding the pictures (the VAE and text encoders on the device, and the denoiser "
                "too unless the latents are cached)" if encoding > budget else "the run")
        need = encoding if encoding > budget else planned.peak_bytes
        plan = replace(plan, fits=False, min_bytes_needed=max(plan.min_bytes_needed, need),
                       message=f"does not fit: {what} needs {need / GB:.2f} GB")
    return Prediction(planned.peak_bytes, device, "plan", dict(planned.caps.caps), plan, planned.step,
                      rows, train_peak_bytes=planned.train_peak_bytes, figures=figures)


def _predict_video(cfg: RunConfig, budget: int | None, device: str, processes: int) -> Prediction:
    """The video run's own plan (its pipeline on the meta device and its real clips), or for a
    bundled config (``wan2.1-t2v-14b``...) the step of one clip bucket at the run's size."""
    from lora_gui.data.video_batches import clip_tokens
    from lora_gui.memory.predict import video_run

    config = video_run.bundled_video_config(cfg.model)
    if config is not None:
        planned = video_run.plan_video_shape(cfg, config, budget, device)
        rows = [(str(planned.step.info["bucket"]), planned.step.info["batch_size"])]
    else:
        from lora_gui.data.video_batches import load_video_data
        from lora_gui.models.diffusion import image_model_for_run
        from lora_gui.models.precision import planned_weights_dtype

        dtype = planned_weights_dtype(cfg.precision, device)
        model = image_model_for_run(cfg, dtype, weights=False)
        data = load_video_data(cfg, model.info["geometry"])
        planned = video_run.video_run_prediction(cfg, model, data, budget, torch.device(device), dtype,
                                                 processes)
        rows = [("x".join(map(str, b)), planned.caps.caps.get(clip_tokens(b), min(cfg.batch_size,
                                                                                 data.buckets.count(b))))
                for b in sorted(set(data.buckets))]
    figures = planned.figures(device) or {}
    planned.step.info["prediction"] = figures
    return Prediction(planned.peak_bytes, device, "plan", dict(planned.caps.caps), None, planned.step,
                      rows, train_peak_bytes=planned.train_peak_bytes, figures=figures)


def estimate(cfg: RunConfig, device: str | None = None) -> Prediction:
    """Instant closed-form estimate of the run's largest micro-batch (a form shows it while
    :func:`predict` computes the plan)."""
    from lora_gui.memory.predict import run_plan
    from lora_gui.memory.predict.image_run_plan import estimated_image_step

    device = device or run_device()
    step = estimated_image_step(cfg, device) if cfg.task == "image" else run_plan.estimated_step(cfg, device)
    return Prediction(step.peak_bytes, device, "estimate", step=step)


def longest(cfg: RunConfig, budget_bytes: int, device: str | None = None, **text_options: Any) -> Any:
    """The longest ``max_seq_len`` that fits (text: a
    :class:`~lora_gui.memory.predict.longest_text.Longest` with the switches it needs; options of
    :func:`~lora_gui.memory.predict.longest_text.longest_text`), or the largest resolution at batch 1
    and the largest batch at the run's resolution (image: a dict)."""
    device = device or run_device()
    if cfg.task == "image":
        from lora_gui.memory.predict.longest_image import longest_image

        return longest_image(cfg, budget_bytes, device)
    if cfg.task == "video":  # the longest clip (frames) at the run's size, the largest size at its frames
        from lora_gui.memory.predict.longest_video import video_limits

        return video_limits(cfg, budget_bytes, device)
    from lora_gui.memory.predict.longest_text import longest_text

    return longest_text(cfg, budget_bytes, device, **text_options)


def fewest_checkpointed_layers(cfg: RunConfig, budget_bytes: int, device: str | None = None,
                               processes: int = 1, now: Prediction | None = None
                               ) -> tuple[int, Prediction] | None:
    """(N, its prediction): the fewest first decoder layers (a text run) or transformer blocks (a
    video run) a checkpointing run can checkpoint (``checkpoint_layers``) with its plan
    (:func:`predict`, the run's own) still under ``budget_bytes`` and the same micro-batch in every
    bucket; the later ones then keep their activations and skip their recompute. None when the run
    does not checkpoint, is an image run, or no fewer than it checkpoints now fit. One plan per
    probe, about log2(layers) of them; ``now``: the run's plan as it stands, when the caller has it."""
    if cfg.task == "image" or not cfg.gradient_checkpointing:
        return None
    now = now or predict(cfg, budget_bytes, device, processes=processes)
    if now.figures.get("checkpointing"):  # the plan chose its depth already (the fastest that fits)
        return None
    layers = checkpointable_layers(cfg)
    low, high, best = 1, min(cfg.checkpoint_layers or layers, layers) - 1, None
    while low <= high:  # fewer checkpointed layers: a higher peak or smaller micro-batches
        mid = (low + high) // 2
        pred = predict(replace(cfg, checkpoint_layers=mid), budget_bytes, device, processes=processes)
        if pred.peak_bytes <= budget_bytes and pred.bucket_batches == now.bucket_batches:
            best, high = (mid, pred), mid - 1
        else:
            low = mid + 1
    return best


def checkpointable_layers(cfg: RunConfig) -> int:
    """How many units ``checkpoint_layers`` counts: a text model's decoder layers, a video
    transformer's blocks (its config's ``num_layers``: Wan and LTX-Video alike), from the config
    alone (no weights read)."""
    if cfg.task == "video":
        from lora_gui.memory.predict.video_run import shape_config

        return int(shape_config(cfg).get("num_layers", 0))
    from lora_gui.memory.predict.model_configs import load_model_config
    from lora_gui.memory.predict.run_plan import model_config_for

    return int(getattr(load_model_config(model_config_for(cfg)).get_text_config(), "num_hidden_layers", 0))
