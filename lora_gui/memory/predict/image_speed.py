"""An image run's step-time model (source: measured on the run's device) and the images/s and
MFU its plan predicts beside the peak; the text path's counterpart is
:mod:`lora_gui.memory.predict.run_speed` (same cache, same matmul peak, same rule for MFU).

The model of one micro-batch of ``rows`` images of a bucket (width x height px)::

    seconds = overhead_s + rows * per_image_s[bucket]

``overhead_s`` is what a forward and backward of the denoiser cost whatever their size (Python,
kernel launches, the adapter's small matmuls); ``per_image_s`` the cost of one more image at that
resolution, measured at the bucket itself (a UNet's convolutions grow with the pixels, its
attention and a DiT's with their square: one formula in the pixels would fit neither well).

The calibration builds the run's denoiser from its config with random weights (its time does not
depend on their values), attaches the run's adapter with the engine's own code, sets its attention
kernel and checkpointing, and times the run's loss (:func:`lora_gui.models.denoise.unet_loss`)
forward and backward on random inputs of the run's shapes: 1 image and the run's micro-batch
(at most :data:`MAX_CALIBRATION_IMAGES`) at up to :data:`MAX_TIMED_BUCKETS` of the buckets the
run trains (the smallest, the largest and one between, by pixels); a bucket not timed takes the
per-image cost of its neighbours by pixels (linear between them, proportional beyond). It is
cached per machine and step settings with the text calibrations (:func:`step_time.cached`), so
``plan`` and the run that follows read the same coefficients.

Useful FLOPs of a step: the run's own count (:func:`lora_gui.models.denoise.step_flops`: the
denoiser's forward, activation gradients and adapter weight gradients of one image, counted on
fake tensors, times the step's images; no frozen weight's gradient, no checkpointing recompute,
no VAE or text encoder), made on the calibrated model at each timed bucket. MFU is those FLOPs
over the predicted seconds over the device's measured matmul peak, and is left out above 1 (the
peak was measured while the machine was busier than during the timing).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from lora_gui.config import RunConfig
from lora_gui.memory.predict import step_time

log = logging.getLogger(__name__)

MAX_TIMED_BUCKETS = 3  # buckets timed: the smallest, the largest and the middle one by pixels
MAX_CALIBRATION_IMAGES = 8  # images of the larger timed micro-batch (the run's, at most this)
# useful FLOPs a whole calibration may time (every timed step together): a small denoiser can
# still be slow at a high resolution (the built-in UNet, 1.1M parameters, spends 130 GFLOP on one
# 768 px image, its attention over 96 x 96 latents: 16-38 s on a 2-core CPU), so the work is
# bounded, not only the parameters. A CPU step of a small denoiser reaches ~2-10 GFLOP/s
# (measured: the drawing model at 64 px, ~5% of a 34 GFLOP/s matmul peak): 100 GFLOP is
# 10-50 s there; a GPU is a thousand times faster
MAX_CALIBRATION_FLOPS = {"cpu": 1e11, "cuda": 1e15}

Bucket = tuple[int, int]  # (width, height) px


def bucket_name(bucket: Bucket) -> str:
    return f"{bucket[0]}x{bucket[1]}"


def _parse(name: str) -> Bucket:
    w, h = name.split("x")
    return int(w), int(h)


def _by_area(table: dict[str, float | None], bucket: Bucket) -> float | None:
    """``table``'s value at ``bucket``, else linear in pixels between the timed buckets on either
    side, proportional to the pixels beyond them (None: no value in the table)."""
    name = bucket_name(bucket)
    if table.get(name) is not None:
        return table[name]
    known = sorted((_parse(n)[0] * _parse(n)[1], v) for n, v in table.items() if v is not None)
    if not known:
        return None
    area = bucket[0] * bucket[1]
    below = [(a, v) for a, v in known if a <= area]
    above = [(a, v) for a, v in known if a >= area]
    if below and above and above[0][0] != below[-1][0]:
        (a0, v0), (a1, v1) = below[-1], above[0]
        return v0 + (v1 - v0) * (area - a0) / (a1 - a0)
    a, v = below[-1] if below else above[0]
    return v * area / a


@dataclass(frozen=True)
class ImageStepTimeModel:
    """Seconds of one micro-batch's forward and backward of an image run (see the module doc).

    Attributes:
        overhead_s: seconds per micro-batch whatever its size.
        per_image_s: seconds per image, by timed bucket ('WxH').
        device: 'cpu' or 'cuda'.
        source: how the coefficients were had ('calibrated on ...' or 'cached calibrated on ...').
        points: the timed (rows, width, height, seconds).
        flops_per_image: useful FLOPs of one image's step by timed bucket (None: not counted).
        peak_flops_per_s: the device's measured matmul peak in the step's compute dtype (FLOP/s).
    """

    overhead_s: float
    per_image_s: dict[str, float]
    device: str
    source: str
    points: tuple[tuple[int, int, int, float], ...] = ()
    flops_per_image: dict[str, int | None] = field(default_factory=dict)
    peak_flops_per_s: float | None = None

    def seconds(self, rows: int, bucket: Bucket) -> float:
        """Predicted seconds of one micro-batch of ``rows`` images of ``bucket``."""
        return self.overhead_s + rows * (_by_area(self.per_image_s, bucket) or 0.0)

    def step_seconds(self, images: int, micro_batch: int, bucket: Bucket) -> float:
        """Predicted seconds of ``images`` images cut into micro-batches of at most ``micro_batch``."""
        full, rest = divmod(images, max(1, micro_batch))
        return full * self.seconds(micro_batch, bucket) + (self.seconds(rest, bucket) if rest else 0.0)

    def flops(self, bucket: Bucket) -> float | None:
        """Useful FLOPs of one image's step at ``bucket`` (counted, or by pixels between counts)."""
        return _by_area(self.flops_per_image, bucket)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "points": [list(p) for p in self.points]}

    @classmethod
    def from_json(cls, row: dict[str, Any], source: str | None = None) -> ImageStepTimeModel:
        return cls(row["overhead_s"], dict(row["per_image_s"]), row["device"], source or row["source"],
                   tuple(tuple(p) for p in row["points"]), dict(row.get("flops_per_image") or {}),
                   row.get("peak_flops_per_s"))


def fit(points: Sequence[tuple[int, int, int, float]], device: str, source: str) -> ImageStepTimeModel:
    """The coefficients from timed micro-batches (rows, width, height, seconds): per bucket a line
    in the rows; the overhead is the median of their intercepts (0 when noise makes it negative,
    or when each bucket was timed at one size only), and each bucket's per-image cost the mean of
    ``(seconds - overhead) / rows`` over its points.

    Raises:
        ValueError: no points, or a point that is not (rows >= 1, width, height >= 1, seconds > 0).
    """
    if not points:
        raise ValueError("image step time: no timed point")
    by_bucket: dict[str, list[tuple[int, float]]] = {}
    for rows, w, h, seconds in points:
        if rows < 1 or w < 1 or h < 1 or not seconds > 0:
            raise ValueError(f"image step time: a timed point must be (rows >= 1, width, height >= 1, "
                             f"seconds > 0), got {(rows, w, h, seconds)}")
        by_bucket.setdefault(bucket_name((w, h)), []).append((rows, seconds))
    intercepts = []
    for timed in by_bucket.values():
        if len({r for r, _ in timed}) > 1:
            xs, ys = [float(r) for r, _ in timed], [s for _, s in timed]
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            intercepts.append(my - slope * mx)
    overhead = max(0.0, statistics.median(intercepts)) if intercepts else 0.0
    per_image = {name: statistics.fmean(max(0.0, s - overhead) / r for r, s in timed) or 1e-12
                 for name, timed in by_bucket.items()}
    return ImageStepTimeModel(overhead, per_image, device, source, tuple(points))


def timed_buckets(buckets: Sequence[Bucket]) -> list[Bucket]:
    """At most :data:`MAX_TIMED_BUCKETS` of ``buckets``: the smallest, the largest and the middle
    one by pixels (every one when there are that few)."""
    ordered = sorted(set(buckets), key=lambda b: (b[0] * b[1], b))
    if len(ordered) <= MAX_TIMED_BUCKETS:
        return ordered
    return [ordered[0], ordered[len(ordered) // 2], ordered[-1]]


# ------------------------------------------------------------------- the run's own denoiser, timed


def _denoiser_params(model: Any) -> int:
    return sum(p.numel() for p in model.unet.parameters())


def _mixed(cfg: RunConfig, device: str) -> str:
    """accelerate's mixed precision the run gets on ``device`` (a CPU 'auto' stays float32)."""
    from lora_gui.models.precision import choose_precision

    return choose_precision(cfg.precision, torch.device(device))


def _build(cfg: RunConfig, model: Any, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """The run's denoiser from its config with random weights, the run's adapter (the engine's
    :func:`attach_unet_lora`), attention kernel and checkpointing, on ``device`` in training mode."""
    from dataclasses import replace as copy_with

    from lora_gui.models.diffusion import attach_unet_lora, set_attention_backend

    with torch.device(device):
        denoiser = type(model.unet).from_config(dict(model.unet.config))
    torch.nn.Module.to(denoiser, dtype)
    attach_unet_lora(denoiser, copy_with(cfg, lora_init="default"))
    set_attention_backend(denoiser, cfg.resolved_attn_backend(), cfg.image_window)
    if cfg.gradient_checkpointing:
        denoiser.enable_gradient_checkpointing()
    return denoiser.to(device).train()


def _inputs(model: Any, rows: int, bucket: Bucket, dtype: torch.dtype, device: str) -> tuple:
    """Random inputs of the run's shapes for ``rows`` images of ``bucket``: float32 latents and
    noise, prompt embeddings in the weights' dtype (with SDXL's pooled embedding and time ids,
    or an SD3 / Flux pooled one), integer timestep draws (as :func:`image_noise` gives them)."""
    from lora_gui.models import dit
    from lora_gui.models.diffusion import Encoded

    conf = dict(model.unet.config)
    factor = dit.vae_factor(model.vae.config.block_out_channels)
    latents = (rows, int(model.vae.config.latent_channels), bucket[1] // factor, bucket[0] // factor)
    pooled = time_ids = None
    if dit.is_dit_kind(model.kind):
        tokens, width = int(model.info["text_tokens"]), int(conf.get("joint_attention_dim", 4096))
        if conf.get("pooled_projection_dim"):
            pooled = torch.randn(rows, int(conf["pooled_projection_dim"]), dtype=dtype, device=device)
    else:
        width = conf["cross_attention_dim"]
        width = int(max(width) if isinstance(width, (list, tuple)) else width)
        tokens = int(model.tokenizers[0].model_max_length)
        if model.kind == "sdxl":
            pooled = torch.randn(rows, int(model.text_encoders[-1].config.projection_dim), dtype=dtype,
                                 device=device)
            time_ids = torch.randn(rows, 6, dtype=dtype, device=device)
    enc = Encoded(torch.randn(latents, device=device), torch.randn(rows, tokens, width, dtype=dtype,
                                                                   device=device), pooled, time_ids)
    draws = torch.randint(0, model.noise_scheduler.config.num_train_timesteps, (rows,), device=device)
    return enc, torch.randn(latents, device=device), draws


def _why_not(cfg: RunConfig, model: Any, device: str) -> str | None:
    """Why this run's step is not timed for a plan (None: it is)."""
    if device == "cuda" and not torch.cuda.is_available():
        return "no GPU here to time the step on"
    if model.kind in ("wan", "ltx"):
        return "video runs are not timed for a plan"
    params, limit = _denoiser_params(model), step_time.largest_calibrated_params(device)
    if params > limit:
        return (f"the denoiser's {params / 1e6:,.0f}M parameters are above the {limit / 1e6:,.0f}M a "
                f"plan times on {device}")
    return None


def image_step_time_model(cfg: RunConfig, model: Any, sizes: dict[Bucket, int], device: str,
                          dtype: torch.dtype, calibrate: bool = True,
                          ) -> tuple[ImageStepTimeModel | None, str]:
    """The run's step-time model on ``device`` (cached calibration, else measured now: seconds on a
    CPU for a small denoiser) and its source in words; (None, why) when it is not timed.

    Args:
        model: the run's :class:`lora_gui.models.diffusion.ImageModel` (its denoiser may be on the
            meta device: only its class and config are read).
        sizes: the largest micro-batch of each bucket the run trains ((width, height) px -> images).
        dtype: the frozen weights' dtype the run trains in.
        calibrate: False: a stored calibration only (nothing timed), else (None, 'not timed yet').
    """
    why = _why_not(cfg, model, device)
    if why:
        log.info("image step time: %s; the plan states no speed", why)
        return None, f"not timed: {why}"
    buckets = timed_buckets(list(sizes))
    rows = max(1, min(max(sizes.values()), MAX_CALIBRATION_IMAGES))
    mixed = _mixed(cfg, device)
    key = step_time.cache_key(device, {
        "image_denoiser": type(model.unet).__name__, "config": json_config(model.unet.config),
        "adapter": cfg.adapter, "lora_rank": cfg.lora_rank, "lora_alpha": cfg.lora_alpha,
        "lora_targets": cfg.lora_targets, "attention": cfg.resolved_attn_backend(),
        "image_window": cfg.image_window, "checkpointing": cfg.gradient_checkpointing,
        "lean_backward": cfg.resolved_lean_backward(), "dtype": str(dtype), "mixed": mixed,
        "buckets": [bucket_name(b) for b in buckets], "rows": rows, "kind": model.kind,
        "text_tokens": model.info.get("text_tokens")})

    def measure() -> ImageStepTimeModel:
        return _calibrate(cfg, model, buckets, rows, device, dtype, mixed)

    try:
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device == "cuda" else []):
            timed = step_time.cached(key, measure if calibrate else None, ImageStepTimeModel)
    except NotTimed as err:
        log.info("image step time: %s; the plan states no speed", err)
        return None, f"not timed: {err}"
    except (RuntimeError, ValueError, NotImplementedError) as err:  # speed is a report: no figure then
        log.warning("image step time: the calibration failed (%s); the plan states no speed", err)
        return None, f"not timed: the calibration failed ({err})"
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    if timed is None:
        return None, "not timed yet on this machine"
    return timed, timed.source


def json_config(config: Any) -> str:
    import json

    return json.dumps({k: v for k, v in dict(config).items() if not k.startswith("_")}, sort_keys=True,
                      default=str)


class NotTimed(Exception):
    """The step is too much work to time for a plan (the message says why)."""


def rows_within(counts: dict[str, int | None], rows: int, device: str) -> int:
    """The most images (``rows`` at most) of the larger timed micro-batch that keep the whole
    calibration (a warm-up and :data:`step_time.CALIBRATION_REPEATS` rounds of 1 and that many
    images at each timed bucket) within :data:`MAX_CALIBRATION_FLOPS` on ``device``; 1: only one
    image a bucket fits (no overhead told apart). Buckets without a count are not bounded.

    Raises:
        NotTimed: not even one image a bucket fits.
    """
    limit, runs = MAX_CALIBRATION_FLOPS.get(device, 0), step_time.CALIBRATION_REPEATS + 1
    one = sum(c for c in counts.values() if c)  # one image at every timed bucket
    if runs * one > limit:
        big = max(counts, key=lambda n: counts[n] or 0)
        raise NotTimed(f"timing the step at {big} ({counts[big] / 1e9:,.1f} GFLOP an image) is above the "
                       f"{limit / 1e9:,.0f} GFLOP a plan spends on {device}")
    best = 1
    for k in range(2, rows + 1):
        if runs * one * (1 + k) <= limit:
            best = k
    return best


def _calibrate(cfg: RunConfig, model: Any, buckets: list[Bucket], rows: int, device: str,
               dtype: torch.dtype, mixed: str) -> ImageStepTimeModel:
    """Counts one image's useful FLOPs at each bucket on the run's denoiser (random weights),
    then times its loss forward and backward at 1 and ``rows`` images of each bucket
    (:func:`step_time.time_steps`: a warm-up, then rounds of every shape), as many images as
    :func:`rows_within` allows.

    Raises:
        NotTimed: the calibration would be above :data:`MAX_CALIBRATION_FLOPS`.
    """
    from lora_gui.models.denoise import step_flops, unet_loss
    from lora_gui.models.flops import compute_dtype, machine_peak

    denoiser = _build(cfg, model, device, dtype)
    scheduler = model.noise_scheduler
    autocast = torch.autocast(device, dtype=torch.bfloat16 if mixed == "bf16" else torch.float16,
                              enabled=mixed in ("bf16", "fp16"))
    counts: dict[str, int | None] = {}
    for bucket in sorted(buckets, key=lambda b: -b[0] * b[1]):  # the largest first: the one to refuse
        enc, noise, draws = _inputs(model, 1, bucket, dtype, device)
        try:
            with autocast:
                counts[bucket_name(bucket)] = step_flops(denoiser, scheduler, enc, noise, draws)
        except Exception as err:  # noqa: BLE001 (a count is a report: the speed stands without it)
            log.warning("image step time: no FLOP count at %s: %s", bucket_name(bucket), str(err))
            counts[bucket_name(bucket)] = None
        rows_within(counts, 1, device)  # one image there is already too much work: stop counting
    rows = rows_within(counts, rows, device)

    def step(n: int, index: int) -> None:
        enc, noise, draws = _inputs(model, n, buckets[index], dtype, device)
        with autocast:
            loss = unet_loss(denoiser, scheduler, enc, noise, draws, reduction="sum")
        loss.backward()
        denoiser.zero_grad(set_to_none=True)

    shapes = [(n, i) for i in range(len(buckets)) for n in sorted({1, rows})]
    timed = step_time.time_steps(step, shapes, device)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    points = [(n, *buckets[i], seconds) for n, i, seconds in timed]
    out = fit(points, device, f"calibrated on {step_time.device_name(device)} ({when})")
    peak = machine_peak(device, compute_dtype(mixed, denoiser))
    return replace(out, flops_per_image=counts, peak_flops_per_s=peak.flops_per_s if peak else None)


# ----------------------------------------------------------------- the run's steps, predicted


def run_steps(cfg: RunConfig, buckets: list[Bucket]) -> list[tuple[Bucket, int]]:
    """(bucket, images) of every step the run trains (``max_steps``, else ``epochs`` epochs of
    the data layer's epoch plan), as :func:`lora_gui.data.image_batches.executed_bucket_sizes`
    walks them; the images of a whole step, every process's."""
    from lora_gui.data.image_batches import epoch_plan

    per_epoch = len(epoch_plan(cfg, buckets, 0))
    if not per_epoch:
        return []
    total = cfg.max_steps or per_epoch * cfg.epochs
    out = []
    for epoch in range(math.ceil(total / per_epoch)):
        for step in epoch_plan(cfg, buckets, epoch)[: total - epoch * per_epoch]:
            indices = step.micro_batches[0].indices
            out.append((buckets[indices[0]], len(indices)))
    return out


def predicted_image_speed(timing: ImageStepTimeModel | None, source: str, steps: list[tuple[Bucket, int]],
                          cap: Any, world_size: int = 1) -> dict[str, Any]:
    """run.json's and ``plan --json``'s predicted speed of an image run: images/s and MFU per
    bucket (a full step of the bucket) and for the run (its steps' images over their predicted
    seconds summed), with the model's source. ``cap(bucket)``: the largest micro-batch of a
    bucket (None: the whole share of a step in one); each of ``world_size`` processes trains
    ``ceil(images / world_size)`` of a step. Forward and backward only: a run's measured
    images/s counts its steps' wall time, optimizer updates included."""
    if timing is None:
        return {"predicted_images_per_s": None, "predicted_mfu": None, "speed_source": source}

    def seconds(bucket: Bucket, images: int) -> float:
        share = math.ceil(images / world_size)
        return timing.step_seconds(share, cap(bucket) or share, bucket)

    def mfu(flops: float | None, secs: float) -> float | None:
        if not flops or not secs or not timing.peak_flops_per_s:
            return None
        return step_time.plausible_mfu(flops / secs / (timing.peak_flops_per_s * world_size))

    largest: dict[Bucket, int] = {}
    for bucket, images in steps:
        largest[bucket] = max(largest.get(bucket, 0), images)
    by_bucket, mfu_by_bucket = {}, {}
    for bucket, images in sorted(largest.items()):
        secs, per_image = seconds(bucket, images), timing.flops(bucket)
        by_bucket[bucket_name(bucket)] = images / secs if secs else None
        mfu_by_bucket[bucket_name(bucket)] = mfu(per_image * images if per_image else None, secs)
    total_images = sum(n for _, n in steps)
    total_seconds = sum(seconds(b, n) for b, n in steps)
    counts = [timing.flops(b) for b, _ in steps]
    useful = sum(c * n for c, (_, n) in zip(counts, steps)) if counts and all(counts) else None
    return {"predicted_images_per_s": total_images / total_seconds if total_seconds else None,
            "predicted_mfu": mfu(useful, total_seconds), "speed_source": source,
            "images_per_s_by_bucket": by_bucket, "mfu_by_bucket": mfu_by_bucket,
            "peak_flops_per_s": timing.peak_flops_per_s, "step_time_model": timing.to_json()}


def image_speed_report(prediction: dict[str, Any] | None, records: Sequence[dict[str, Any]],
                       measured_mfu: float | None = None) -> dict[str, Any]:
    """run.json's ``speed_report`` of an image run: the plan's predicted images/s and MFU (forward
    and backward, source: the step-time model) beside the measured ones (the steps' images over
    their wall time, optimizer updates included; ``measured_mfu``: the run's own,
    :func:`lora_gui.engine.core.speed.run_speed`)."""
    def rate(rows: Sequence[dict[str, Any]]) -> float | None:
        seconds = sum(r["seconds"] for r in rows)
        return sum(r["images"] for r in rows) / seconds if seconds else None

    predicted = (prediction or {}).get("predicted_images_per_s")
    measured = rate(records)
    # a CPU run's memory tracker slows the steps it measures (the first of each shape) several
    # times over: the steps it left alone are the speed the step-time model predicts
    unmetered = [r for r in records if r.get("peak_bytes") is None]
    plain = rate(unmetered) if unmetered and len(unmetered) < len(records) else None
    return {"speed_report": {
        "predicted_images_per_s": predicted,
        "predicted_source": (prediction or {}).get("speed_source", "no plan"),
        "measured_images_per_s": measured, "measured_source": "measured (images / step seconds)",
        "predicted_vs_measured": predicted / measured - 1 if predicted and measured else None,
        "measured_images_per_s_unmetered": plain,
        "unmetered_source": "measured (the steps the memory tracker did not measure)" if plain else None,
        "predicted_vs_unmetered": predicted / plain - 1 if predicted and plain else None,
        "predicted_mfu": (prediction or {}).get("predicted_mfu"), "measured_mfu": measured_mfu,
        "mfu_source": "useful FLOPs of the denoiser's step / seconds / measured matmul peak"}}
