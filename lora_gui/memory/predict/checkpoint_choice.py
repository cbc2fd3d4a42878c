"""How many decoder layers a checkpointing text run recomputes: the depth that trains fastest
inside the budget (source: predicted memory, measured step time).

A text run with ``gradient_checkpointing: true`` and no ``checkpoint_layers`` of its own, under a
budget, with bucketed batches and ``batch_choice: fastest`` (the default), lets its plan choose
how many of the first decoder layers to checkpoint, from all of them down to none. A layer left
out skips its recompute (a forward of the layer again in the backward: about a third of its
forward and backward, :data:`~lora_gui.memory.predict.run_speed.FORWARD_SHARE`) but keeps its
activations, which can cut the micro-batches that fit. For every depth the closed-form estimate
gives the micro-batch per length bucket (:func:`planner.plan_text` without traces: well under a
millisecond an estimate) and the device's step-time model their seconds; the depth with the
highest predicted tokens/s over the run's own sample lengths wins, and of equally fast depths the
deepest (it holds the least memory). The run's plan then traces the chosen depth like any other.

On a GPU whose host link the calibration timed, one more candidate: every layer checkpointed with
its input kept in host memory (``offload_checkpoints``), which frees the checkpointed inputs of
every layer but one on the card and costs their round trip to the host
(:func:`~lora_gui.memory.predict.run_speed.with_offload`, no overlap counted). It wins only when
it is the fastest that fits: when it alone fits, or when the larger micro-batches it lets fit
outrun the copies, and only when the inputs fit the host memory free now. Of equally fast
candidates the one without offload wins. Not on a CPU: host and device are the same memory there.

Nothing is chosen (the run checkpoints every layer, as it says) without a step-time model for the
device (a plan for a GPU made where there is none), with ``batch_choice`` largest or headroom,
with ``offload_checkpoints`` set by the user (every layer stays checkpointed and offloaded), or
when nothing fits the budget. ``plan``, the dashboard and the run call :func:`choose_checkpoint_layers`
with the same inputs, and the run checkpoints what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.parallel import Parallel
from lora_gui.memory.runtime.host import host_available_bytes


@dataclass(frozen=True)
class CheckpointChoice:
    """The chosen depth and what each depth was predicted to do.

    Attributes:
        layers: the first decoder layers the run checkpoints (0: none, checkpointing off).
        of_layers: the model's decoder layers.
        tokens_per_s: the chosen depth's predicted padded tokens/s over the run's lengths.
        every_layer_tokens_per_s: the same for every layer checkpointed (what the setting alone
            would train at); None when that depth does not fit.
        depths: (layers, predicted tokens/s, estimated peak bytes of the longest bucket's
            micro-batch) of every depth whose plan fits, deepest first.
        source: where the seconds come from (the step-time model's source).
        offload: the chosen depth keeps the checkpointed layer inputs in host memory.
        offloaded: (predicted tokens/s, estimated peak bytes) of every layer checkpointed and
            offloaded, when that was a candidate (a GPU with a timed host link) and fits.
    """

    layers: int
    of_layers: int
    tokens_per_s: float
    every_layer_tokens_per_s: float | None
    depths: tuple[tuple[int, float, int], ...]
    source: str
    offload: bool = False
    offloaded: tuple[float, int] | None = None

    def applied(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` with this depth: every layer as an explicit count, none as checkpointing off,
        and the checkpointed inputs in host memory or not."""
        return replace(with_depth(cfg, self.layers, self.of_layers), offload_checkpoints=self.offload)

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint_layers": self.layers, "decoder_layers": self.of_layers,
                "offload_checkpoints": self.offload,
                "offloaded_predicted_tokens_per_s": self.offloaded[0] if self.offloaded else None,
                "offloaded_estimated_peak_bytes": self.offloaded[1] if self.offloaded else None,
                "chosen_by": "the fastest predicted depth that fits the budget",
                "predicted_tokens_per_s": self.tokens_per_s,
                "every_layer_predicted_tokens_per_s": self.every_layer_tokens_per_s,
                "depths": [{"checkpoint_layers": k, "predicted_tokens_per_s": s, "estimated_peak_bytes": p}
                           for k, s, p in self.depths],
                "speed_source": self.source, "peak_source": "estimated (closed form); the plan traces "
                                                           "the chosen depth"}


def chooses_checkpointing(cfg: RunConfig) -> bool:
    """Whether this run's plan picks its checkpointed layers (see the module doc)."""
    return (cfg.task == "text" and cfg.gradient_checkpointing and not cfg.checkpoint_layers
            and not cfg.offload_checkpoints and cfg.batch_choice == "fastest"
            and cfg.resolved_batching() == "bucketed")


def with_depth(cfg: RunConfig, layers: int, of_layers: int) -> RunConfig:
    """``cfg`` checkpointing its first ``layers`` decoder layers of ``of_layers``."""
    if layers <= 0:
        return replace(cfg, gradient_checkpointing=False, checkpoint_layers=0)
    return replace(cfg, gradient_checkpointing=True, checkpoint_layers=min(layers, of_layers))


def offloaded_bytes(plan: planner.Plan, config: Any, itemsize: int) -> int:
    """Host bytes of every layer's checkpointed input at the plan's largest micro-batch (layers x
    rows x tokens x hidden x ``itemsize``, as :mod:`lora_gui.memory.predict.long_estimate` counts
    them)."""
    text = config.get_text_config()
    tokens = max((b.micro_batch * b.bucket for b in plan.buckets), default=0)
    return text.num_hidden_layers * tokens * text.hidden_size * itemsize


def choose_checkpoint_layers(cfg: RunConfig, source: str | None, budget: int | None, device: str,
                             parallel: Parallel | None = None, lengths: Sequence[int] | None = None,
                             ) -> CheckpointChoice | None:
    """The depth this run checkpoints (see the module doc), or None when the plan does not choose.

    Args:
        cfg: the run's settings (a CPU run: with the precision it trains in).
        source: the model's folder (None: a bundled architecture name).
        budget: the plan's budget in bytes, per GPU.
        device: 'cuda' or 'cpu'.
        parallel: data-parallel processes and FSDP (each takes batch_size / N rows a step).
        lengths: the training samples' token lengths (the run's weighting of its buckets; None:
            the longest bucket alone, as the plan's predicted speed counts it).
    """
    from lora_gui.memory.predict.run_plan import model_config_for, step_kwargs, text_buckets
    from lora_gui.memory.predict.run_speed import predicted_speed, step_time_model

    if not budget or not chooses_checkpointing(cfg):
        return None
    config = model_config_for(cfg, source)
    if isinstance(config, dict):
        return None
    of_layers = int(getattr(config.get_text_config(), "num_hidden_layers", 0) or 0)
    if of_layers < 1:
        return None
    per_rank = max(1, -(-cfg.batch_size // (parallel.world_size if parallel else 1)))
    buckets = text_buckets(cfg)

    def speed_and_peak(run: RunConfig) -> tuple[Any, tuple[float, int] | None]:
        """The step-time model of ``run`` and its (predicted tokens/s, estimated peak) when every
        bucket fits the budget (and, offloaded, its inputs fit the free host memory)."""
        step = step_kwargs(run, device)
        timing = step_time_model(run, config, device, step)  # one calibration, every candidate
        if timing is None:
            return None, None
        plan = planner.plan_text(config, budget, buckets, effective_batch=per_rank, max_batch=per_rank,
                                 confirm=False, parallel=parallel, step_time=timing,
                                 batch_choice="fastest", **step)
        if not all(b.micro_batch for b in plan.buckets):
            return timing, None
        if run.offload_checkpoints and offloaded_bytes(plan, config, step["dtype"].itemsize) > (
                host_available_bytes() or 0):
            return timing, None  # host memory too short to hold the inputs: not a candidate
        speed = predicted_speed(timing, plan, per_rank, lengths, cfg.pad_multiple)["predicted_tokens_per_s"]
        return timing, (speed, max(b.peak_bytes for b in plan.buckets)) if speed else None

    depths: list[tuple[int, float, int]] = []
    timing = None
    for layers in range(of_layers, -1, -1):
        timing, fits = speed_and_peak(with_depth(cfg, layers, of_layers))
        if timing is None:
            return None
        if fits:
            depths.append((layers, *fits))
    source_text = timing.source  # the last, depth 0, is the calibration's own: no recompute
    offloaded = None
    if device == "cuda" and timing.host_round_trip_s_per_byte:  # the host link was timed: a GPU
        every_offloaded = replace(with_depth(cfg, of_layers, of_layers), offload_checkpoints=True)
        offloaded = speed_and_peak(every_offloaded)[1]
    if not depths and not offloaded:
        return None
    every = next((s for k, s, _ in depths if k == of_layers), None)
    fastest = max([s for _, s, _ in depths] + ([offloaded[0]] if offloaded else []))
    within = [d for d in depths if d[1] >= fastest * (1 - 1e-9)]  # within rounding of the fastest
    if not within:  # only offloading reaches the fastest speed (or fits at all)
        return CheckpointChoice(of_layers, of_layers, offloaded[0], every, tuple(depths), source_text,
                                offload=True, offloaded=offloaded)
    # of equally fast depths the deepest: the same speed for the least memory
    chosen = max(within, key=lambda d: d[0])
    return CheckpointChoice(chosen[0], of_layers, chosen[1], every, tuple(depths), source_text,
                            offloaded=offloaded)
