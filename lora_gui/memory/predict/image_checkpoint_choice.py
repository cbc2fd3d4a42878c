"""Whether a checkpointing image run recomputes its denoiser's activations: the faster of
checkpointing on and off inside the budget (source: predicted memory, measured step time).

An SD 1.x / SDXL or SD3 / Flux run with ``gradient_checkpointing: true``, adaptive micro-batches
under a budget and ``batch_choice: fastest`` (the default) is planned twice: as it is set, and with
checkpointing off. Each plan gives its micro-batch per bucket, its whole peak (the encoding pass
included) and its predicted images/s over the run's own steps, from a step-time model timed on the
run's denoiser with that checkpointing (two calibrations, each cached per machine:
:func:`lora_gui.memory.predict.image_speed.image_step_time_model`). Checkpointing off wins when its
whole run fits the budget with at least one image a micro-batch in every bucket and it is predicted
faster: no recompute, at smaller micro-batches. Of equally fast plans the one that checkpoints wins
(the same speed for less memory).

Nothing is chosen (the run checkpoints as it says) without a budget, with a fixed batch per bucket,
with ``batch_choice`` largest or headroom, for a video run (its blocks' checkpointing is chosen by
``checkpoint_layers``), or when either plan states no speed (a denoiser above the size a plan
times, a plan for a GPU made on a machine without one). ``plan``, the dashboard and the run reach
this through :func:`lora_gui.memory.predict.image_run.image_run_prediction`, the one function they
share, and the run checkpoints what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lora_gui.config import RunConfig


@dataclass(frozen=True)
class ImageCheckpointChoice:
    """The plan's choice and the two plans it weighed.

    Attributes:
        checkpointing: the run recomputes its denoiser's activations (the setting as given).
        images_per_s: predicted images/s of the run with checkpointing on and off (None: off
            does not fit the budget).
        peak_bytes: the predicted peak of the run with checkpointing on and off.
        speed_source: where the seconds come from (each plan's step-time model).
    """

    checkpointing: bool
    images_per_s: dict[str, float | None]
    peak_bytes: dict[str, int | None]
    speed_source: dict[str, str]

    def applied(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` with the chosen checkpointing."""
        return replace(cfg, gradient_checkpointing=self.checkpointing)

    def to_json(self) -> dict[str, Any]:
        return {"gradient_checkpointing": self.checkpointing,
                "chosen_by": "the faster predicted plan that fits the budget",
                "predicted_images_per_s": self.images_per_s, "predicted_peak_bytes": self.peak_bytes,
                "speed_source": self.speed_source, "peak_source": "predicted (each plan traced)"}


def chooses_image_checkpointing(cfg: RunConfig, budget: int | None) -> bool:
    """Whether this run's plan weighs turning its checkpointing off (see the module doc)."""
    return (cfg.task == "image" and cfg.gradient_checkpointing and bool(budget)
            and cfg.batch_choice == "fastest" and cfg.resolved_image_batch() == "adaptive")


def fits(prediction: Any, budget: int) -> bool:
    """The prediction's whole run fits ``budget`` (bytes) with at least one image a micro-batch
    in every bucket (a plan that fits none of a bucket does not train it)."""
    plan = prediction.plan
    return (prediction.peak_bytes is not None and prediction.peak_bytes <= budget and plan is not None
            and plan.fits and all(b.micro_batch >= 1 for b in plan.buckets))


def choose(cfg: RunConfig, budget: int, as_set: Any, predict: Callable[[RunConfig], Any]) -> Any:
    """The faster of ``as_set`` (the run's prediction with checkpointing on) and ``predict`` of
    the run with checkpointing off (see the module doc), carrying the choice in its
    ``checkpoint_choice``; ``as_set`` unchanged (no choice recorded) when either states no speed
    or checkpointing on does not fit (the verdict is then the plan's own)."""
    on = (as_set.speed or {}).get("predicted_images_per_s")
    if not on or not fits(as_set, budget):
        return as_set
    without = predict(replace(cfg, gradient_checkpointing=False))
    off = None
    if fits(without, budget):
        off = (without.speed or {}).get("predicted_images_per_s")
        if not off:
            return as_set  # no speed to weigh it by: the run keeps its setting
    checkpointing = not (off and off > on)
    choice = ImageCheckpointChoice(
        checkpointing, {"on": on, "off": off}, {"on": as_set.peak_bytes, "off": without.peak_bytes},
        {"on": as_set.speed.get("speed_source", ""), "off": (without.speed or {}).get("speed_source", "")})
    chosen = as_set if checkpointing else without
    chosen.checkpoint_choice = choice
    return chosen


def choice_lines(choice: dict[str, Any]) -> list[str]:
    """The plan's text for the choice (``choice``: :meth:`ImageCheckpointChoice.to_json`)."""
    speed, on = choice["predicted_images_per_s"], choice["gradient_checkpointing"]
    off_text = (f"off {speed['off']:,.2f} images/s" if speed.get("off") else "off does not fit the budget")
    state = "on" if on else "off"
    return [f"  gradient checkpointing: {state}, the faster plan that fits the budget (on "
            f"{speed['on']:,.2f} images/s, {off_text}, predicted; set batch_choice to largest to keep "
            "it as set)"]
