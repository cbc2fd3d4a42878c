"""A text run's step-time model (source: measured on the run's device) and the speed its plan
predicts, beside the peak (:mod:`lora_gui.memory.predict.step_time` holds the model itself).

The calibration builds the run's architecture with random weights (its time does not depend on
their values), attaches the run's adapter, turns on its chunked loss, and times forward and
backward passes (without checkpointing: a checkpointing run's recompute is added to the per-token
costs, :func:`with_recompute`); it is cached per machine and step settings, so the plan a front end
shows and the plan the run makes use the same coefficients.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from lora_gui.config import RunConfig
from lora_gui.data.batching import round_up
from lora_gui.memory.predict import step_time
from lora_gui.memory.predict.step_time import StepTimeModel

log = logging.getLogger(__name__)


def _step_settings(cfg: RunConfig, kw: dict[str, Any]) -> dict[str, Any]:
    """What changes a step's time and so keys its calibration (``kw``: the plan's step settings)."""
    keep = ("lora_rank", "attn_implementation", "loss_chunk", "dtype", "target_modules", "lean_backward",
            "quantization")  # checkpointing: scaled from the same calibration (with_recompute)
    return {**{k: kw[k] for k in keep}, "adapter": cfg.adapter, "lora_fused": cfg.lora_fused}


def _build(cfg: RunConfig, config: Any, device: str) -> torch.nn.Module | None:
    """The run's architecture with random weights and its adapter on ``device``; None (logged)
    for a quantized base or a model above the size a plan times
    (:data:`step_time.MAX_CALIBRATION_PARAMS`)."""
    from transformers import AutoModelForCausalLM

    from lora_gui.models.chunked_loss import enable_chunked_loss
    from lora_gui.models.precision import planned_weights_dtype
    from lora_gui.models.text import attach_lora

    if cfg.quantization != "none":  # a 4 / 8-bit base is not built here: its step is not timed
        log.info("step time: a %s base is not timed for a plan; the plan takes the largest micro-batch "
                 "that fits", cfg.quantization)
        return None
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    limit = step_time.largest_calibrated_params(device)
    if params > limit:
        log.info("step time: %s has %.0fM parameters, above the %.0fM a plan times on %s; the plan "
                 "takes the largest micro-batch that fits", cfg.model, params / 1e6, limit / 1e6, device)
        return None
    dtype = planned_weights_dtype(cfg.precision, device, text=True)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=cfg.resolved_attn_backend(),
                                             dtype=dtype)
    model.config.use_cache = False
    if cfg.resolved_loss_chunk():
        try:
            enable_chunked_loss(model, cfg.resolved_loss_chunk())
        except ValueError:
            pass  # the run keeps the full loss for this model too (models.text.load_model_for)
    # the adapter's shapes are what the time depends on: no initialisation pass (EVA, PiSSA...)
    return attach_lora(model, replace(cfg, lora_init="default")).to(device).train()


def counted(cfg: RunConfig, model: torch.nn.Module, device: str) -> dict[str, Any]:
    """The calibrated model's useful FLOPs per token and per attention pair (the count the run
    makes, :func:`lora_gui.models.flops.text_flops`) and the device's measured matmul peak in the
    dtype its matmuls use (about a second, once per process): what a predicted MFU needs."""
    from lora_gui.models.flops import compute_dtype, machine_peak, text_flops

    count = text_flops(model)
    mixed = cfg.precision if cfg.precision in ("bf16", "fp16") else "no"
    peak = machine_peak(device, compute_dtype(mixed, model))
    return {"flops": (count.linear_per_token, count.lora_per_token, count.attention_per_pair),
            "peak_flops_per_s": peak.flops_per_s if peak else None}


def step_time_model(cfg: RunConfig, config: Any, device: str,
                    step: dict[str, Any], calibrate: bool = True) -> StepTimeModel | None:
    """The run's step-time model on ``device`` (cached calibration, else measured now: a few
    seconds for a small model on a CPU); None when the model is too large to time for a plan
    or the device is not this machine's (a plan for a GPU made on a machine without one).
    ``config``: the model's config as the plan reads it; ``step``: the plan's step settings
    (:func:`lora_gui.memory.predict.run_plan.step_kwargs`); ``calibrate`` False: a stored
    calibration only (the instant estimate: nothing timed), else None."""
    if device == "cuda" and not torch.cuda.is_available():
        log.info("step time: no GPU here to time the step on; the plan takes the largest micro-batch")
        return None
    if isinstance(config, dict):  # not a text model's config
        return None
    key = step_time.cache_key(device, {"config": config.to_json_string(use_diff=False),
                                       **_step_settings(cfg, step)})
    built: list[torch.nn.Module | None] = []

    def measure() -> StepTimeModel | None:
        model = _build(cfg, config, device)
        built.append(model)
        if model is None:
            return None
        vocab = config.get_text_config().vocab_size
        gen = torch.Generator().manual_seed(0)

        def step(rows: int, length: int) -> None:
            ids = torch.randint(0, vocab, (rows, length), generator=gen).to(device)
            model(input_ids=ids, labels=ids).loss.backward()
            model.zero_grad(set_to_none=True)

        timed = step_time.calibrate(step, cfg.max_seq_len, device)
        return replace(timed, **counted(cfg, model, device),
                       host_round_trip_s_per_byte=step_time.host_round_trip_seconds_per_byte(device))

    try:
        timed = step_time.cached(key, measure if calibrate else None)
        if timed is None:
            return None
        # the offloaded layer inputs are hidden states in the weights' dtype
        return with_offload(with_recompute(timed, cfg, config), cfg, config, step["dtype"].itemsize)
    finally:
        if built and device == "cuda":
            built.clear()
            torch.cuda.empty_cache()


FORWARD_SHARE = 1 / 3  # a forward is about a third of a forward and backward (2 of 6 FLOPs a weight)


def with_recompute(model: StepTimeModel, cfg: RunConfig, config: Any) -> StepTimeModel:
    """The model for a run that checkpoints: its per-token costs grow by the forward of the
    checkpointed layers run again in the backward (:data:`FORWARD_SHARE` of a step per layer
    share); the calibration itself runs without checkpointing, so one calibration serves every
    ``checkpoint_layers``."""
    if not cfg.gradient_checkpointing:
        return model
    layers = getattr(config.get_text_config(), "num_hidden_layers", 0) or 1
    share = min(cfg.checkpoint_layers or layers, layers) / layers
    factor = 1 + FORWARD_SHARE * share
    return replace(model, per_token_s=model.per_token_s * factor,
                   per_token_pair_s=model.per_token_pair_s * factor,
                   source=f"{model.source}, x{factor:.2f} per token for recomputing "
                          f"{share:.0%} of the layers' forward")


def with_offload(model: StepTimeModel, cfg: RunConfig, config: Any, itemsize: int) -> StepTimeModel:
    """The model for a run that keeps its checkpointed layer inputs in host memory
    (``offload_checkpoints``): each checkpointed layer's input (hidden size x ``itemsize`` bytes
    a token) goes to the host in the forward and comes back for the recompute, at the measured
    round-trip rate. Counted as if no copy overlapped the compute (the run copies on a side
    stream, so the step is at most this slow): a plan never promises more speed than offloading
    gives. Unchanged without offload or without a measured rate (a CPU)."""
    rate = model.host_round_trip_s_per_byte
    if not (cfg.gradient_checkpointing and cfg.offload_checkpoints) or not rate:
        return model
    text = config.get_text_config()
    layers = text.num_hidden_layers or 1
    offloaded = min(cfg.checkpoint_layers or layers, layers)
    per_token = offloaded * text.hidden_size * itemsize * rate
    return replace(model, per_token_s=model.per_token_s + per_token,
                   source=f"{model.source}, + {per_token * 1e9:,.1f} ns per token for {offloaded} layer "
                          f"inputs to host memory and back at the measured {1 / rate / 1e9:,.1f} GB/s "
                          "round trip (no overlap counted: an upper bound on its cost)")


def predicted_speed(model: StepTimeModel | None, plan: Any, samples: int,
                    lengths: Sequence[int] | None, pad_multiple: int) -> dict[str, Any]:
    """run.json's and ``plan --json``'s predicted speed: tokens/s per bucket (the plan's) and for
    the run (each training sample in the bucket of its padded length, ``samples`` a step, the
    steps' predicted seconds summed), with the model's source. Padded tokens of forward and
    backward; a run's measured ``tokens_per_s`` counts its real tokens over whole steps."""
    if model is None or plan is None:
        return {"predicted_tokens_per_s": None, "speed_source": "no step-time model"}
    out: dict[str, Any] = {"speed_source": model.source, "step_time_model": model.to_json(),
                           "tokens_per_s_by_bucket": {str(b.bucket): b.tokens_per_s for b in plan.buckets},
                           "mfu_by_bucket": {str(b.bucket): b.mfu for b in plan.buckets},
                           "peak_flops_per_s": model.peak_flops_per_s}
    buckets = sorted((b for b in plan.buckets if b.micro_batch), key=lambda b: b.bucket)
    if not buckets:
        return out | {"predicted_tokens_per_s": None, "predicted_mfu": None}
    by_bucket: dict[int, list[int]] = {b.bucket: [] for b in buckets}
    for n in lengths or [buckets[-1].bucket]:
        width = round_up(n, pad_multiple)
        by_bucket[next((b.bucket for b in buckets if b.bucket >= width), buckets[-1].bucket)].append(
            min(n, buckets[-1].bucket))
    tokens = seconds = 0.0
    for b in buckets:
        if by_bucket[b.bucket]:
            steps = len(by_bucket[b.bucket]) / samples  # fractional: the share of steps in this bucket
            tokens += len(by_bucket[b.bucket]) * b.bucket
            seconds += steps * model.step_seconds(samples, b.micro_batch, b.bucket)
    out["predicted_tokens_per_s"] = tokens / seconds if seconds else None
    # MFU as the run measures it: useful FLOPs of the real tokens (padding is not useful work)
    useful = model.useful_flops([n for rows in by_bucket.values() for n in rows])
    out["predicted_mfu"] = (step_time.plausible_mfu(useful / seconds / model.peak_flops_per_s)
                            if useful and seconds and model.peak_flops_per_s else None)
    return out


def speed_report(prediction: dict[str, Any] | None, records: Sequence[dict[str, Any]],
                 measured_mfu: float | None = None) -> dict[str, Any]:
    """run.json's ``speed_report``: the plan's predicted padded tokens/s and MFU (forward and
    backward, source: the step-time model and its FLOP count over the measured matmul peak)
    beside the measured ones (padded tokens over the steps' wall time, optimizer updates
    included; ``measured_mfu``: the run's own, :func:`lora_gui.engine.core.speed.run_speed`)."""
    padded = sum(r["padded_tokens"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    predicted = (prediction or {}).get("predicted_tokens_per_s")
    measured = padded / seconds if seconds else None
    return {"speed_report": {
        "predicted_tokens_per_s": predicted,
        "predicted_source": (prediction or {}).get("speed_source", "no plan"),
        "measured_tokens_per_s": measured, "measured_source": "measured (padded tokens / step seconds)",
        "predicted_vs_measured": predicted / measured - 1 if predicted and measured else None,
        "predicted_mfu": (prediction or {}).get("predicted_mfu"), "measured_mfu": measured_mfu,
        "mfu_source": "useful FLOPs (real tokens) / seconds / measured matmul peak"}}
