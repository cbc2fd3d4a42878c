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

Nothing is chosen (the run checkpoints every layer, as it says) without a step-time model for the
device (a plan for a GPU made where there is none), with ``batch_choice`` largest or headroom,
with ``offload_checkpoints`` (the long-context path keeps every layer checkpointed), or when no
depth fits the budget. ``plan``, the dashboard and the run call :func:`choose_checkpoint_layers`
with the same inputs, and the run checkpoints what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.parallel import Parallel


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
    """

    layers: int
    of_layers: int
    tokens_per_s: float
    every_layer_tokens_per_s: float | None
    depths: tuple[tuple[int, float, int], ...]
    source: str

    def applied(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` with this depth: every layer as an explicit count, none as checkpointing off."""
        return with_depth(cfg, self.layers, self.of_layers)

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint_layers": self.layers, "decoder_layers": self.of_layers,
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
    depths: list[tuple[int, float, int]] = []
    source_text = ""
    for layers in range(of_layers, -1, -1):
        depth_cfg = with_depth(cfg, layers, of_layers)
        step = step_kwargs(depth_cfg, device)
        timing = step_time_model(depth_cfg, config, device, step)  # one calibration, every depth
        if timing is None:
            return None
        source_text = timing.source  # the last, depth 0, is the calibration's own: no recompute
        plan = planner.plan_text(config, budget, buckets, effective_batch=per_rank, max_batch=per_rank,
                                 confirm=False, parallel=parallel, step_time=timing,
                                 batch_choice="fastest", **step)
        if not all(b.micro_batch for b in plan.buckets):
            continue
        speed = predicted_speed(timing, plan, per_rank, lengths, cfg.pad_multiple)["predicted_tokens_per_s"]
        if speed:
            depths.append((layers, speed, max(b.peak_bytes for b in plan.buckets)))
    if not depths:
        return None
    fastest = max(s for _, s, _ in depths)
    # of depths within rounding of the fastest, the deepest: the same speed for the least memory
    chosen = max((d for d in depths if d[1] >= fastest * (1 - 1e-9)), key=lambda d: d[0])
    every = next((s for k, s, _ in depths if k == of_layers), None)
    return CheckpointChoice(chosen[0], of_layers, chosen[1], every, tuple(depths), source_text)
