"""One report of a plan for both front ends: the budget a plan is judged against, the lines
``python -m lora_gui plan`` prints, the JSON it writes and the rows the dashboard's tables show.
Every figure is the planner's (source: predicted)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lora_gui.cards import card_by_name
from lora_gui.config import ConfigError, RunConfig
from lora_gui.memory.predict.planner import MAX_BUDGET_BYTES
from lora_gui.memory.predict.run import Prediction
from lora_gui.units import GB, MIB

DEFAULT_CARD = "24gb"  # without a card, a budget or a GPU here: a common 24 GB card


@dataclass(frozen=True)
class Budget:
    """The memory a plan is judged against: ``bytes`` and where the figure came from."""

    bytes: int
    source: str

    def label(self, per: str = "") -> str:
        """e.g. '4 GB per GPU (--budget-gb)', '25.76 GB (card 24gb: ...)'."""
        return f"{self.bytes / GB:,.4g} GB{per} ({self.source})"


def resolve_budget(cfg: RunConfig, budget_gb: float | None = None, card: str | None = None,
                   gpu_total_bytes: int | None = None, budget_from: str = "budget given") -> Budget:
    """The budget of a plan, in the order a user expects: a card picked by name, a budget typed
    in GB, the run's own ``budget_gb``, this machine's GPU, else a 24 GB card.

    Raises:
        ConfigError: an unknown card (the message lists the known ones) or a budget out of range.
    """
    if card:
        try:
            found = card_by_name(card)
        except ValueError as err:
            raise ConfigError(f"card: {err}") from None
        return Budget(found.total_bytes, f"card {found.name}: {found.label}")
    if budget_gb is not None:
        if not 0 < budget_gb * GB <= MAX_BUDGET_BYTES:  # also catches nan
            raise ConfigError(f"{budget_from} {budget_gb:g}: the budget must be more than 0 and at most "
                              f"{MAX_BUDGET_BYTES / GB:g} GB")
        return Budget(int(budget_gb * GB), budget_from)
    if cfg.budget_gb:
        return Budget(int(cfg.budget_gb * GB), "budget_gb setting")
    if gpu_total_bytes:
        return Budget(gpu_total_bytes, "this GPU")
    default = card_by_name(DEFAULT_CARD)
    return Budget(default.total_bytes, f"default: {default.label}, no GPU here")


def bucket_rows(pred: Prediction) -> list[list[Any]]:
    """[bucket, micro-batch, grad-accum, predicted peak MiB] per bucket of the plan."""
    if pred.plan is None:
        return []
    return [[b.bucket, b.micro_batch, b.grad_accum, round(b.peak_bytes / MIB)] for b in pred.plan.buckets]


def plan_json(pred: Prediction) -> dict[str, Any]:
    """The `plan --json` object: peak, breakdown, fits, batch per bucket, overheads (per GPU)."""
    step, plan = pred.step, pred.plan
    out = {"world_size": step.info.get("world_size", 1), "fsdp": step.info.get("fsdp", False),
           "allreduce_bucket_bytes": step.info.get("allreduce_bucket_bytes", 0),
           "peak_bytes": pred.peak_bytes, "traced_peak_bytes": step.traced_peak_bytes,
           "train_peak_bytes": pred.train_peak_bytes,
           "breakdown": step.breakdown, "cuda_overheads": step.cuda_overheads,
           "host_bytes": step.info.get("host_bytes", 0),  # long-context switches: host memory
           "device": step.device, "source": "predicted", "kernel": step.info.get("kernel"),
           "prediction": pred.figures or step.info.get("prediction")}
    if plan is not None:
        out.update({"fits": plan.fits, "budget_bytes": plan.budget_bytes, "message": plan.message,
                    "batch_by_bucket": {str(k): v for k, v in plan.batch_by_bucket.items()},
                    "buckets": [asdict(b) for b in plan.buckets],
                    "suggestions": [asdict(s) for s in plan.suggestions]})
    return out


def text_plan_lines(cfg: RunConfig, pred: Prediction, budget: Budget, parallel_label: str) -> list[str]:
    """What `plan` prints for a text run."""
    step = pred.step
    lines = [f"Predicted peak of one training step on {pred.device}, per GPU with {parallel_label} "
             f"(source: predicted, fake-tensor trace of {cfg.model}): {step.peak_bytes / MIB:,.0f} MiB"]
    figures = pred.figures
    if figures:
        data = "the run's real data" if figures["from_data"] else "worst case, no data to read"
        lines.append(f"  peak micro-batch: {figures['batch_size']} x {figures['seq_len']} tokens, mask "
                     f"{figures['mask']}, attention kernel on {pred.device}: {figures['kernel']} ({data})")
    lines += [f"  {name:<18} {nbytes / MIB:>10,.1f} MiB" for name, nbytes in step.breakdown.items()]
    lines += [f"  + {name:<16} {nbytes / MIB:>10,.1f} MiB  (CUDA-only overhead, not in the trace)"
              for name, nbytes in step.cuda_overheads.items() if nbytes]  # none when planning for a CPU
    if step.info.get("world_size", 1) > 1:
        lines.append(f"  (noted, not in the peak: LoRA gradient all-reduce bucket "
                     f"{step.info['allreduce_bucket_bytes'] / MIB:,.1f} MiB after backward; DDP-style "
                     "buckets of 25 MB)")
    return lines + _budget_lines(pred, budget, "bucket (tokens)", 15, " per GPU")


def image_plan_lines(cfg: RunConfig, pred: Prediction, budget: Budget) -> list[str]:
    """What `plan` prints for an image run."""
    step = pred.step
    lines = [f"Predicted peak of the image run on {pred.device} (source: predicted, the run's own plan of "
             f"{cfg.model} at {cfg.resolution} px): {pred.peak_bytes / MIB:,.0f} MiB"]
    if pred.train_peak_bytes is not None:
        lines.append(f"  training steps alone: {pred.train_peak_bytes / MIB:,.0f} MiB (largest micro-batch: "
                     f"{step.info.get('batch_size') or '?'} image(s), traced)")
    if step.info.get("encoding_pass_bytes"):
        lines.append("  (the larger of the training step and the caching pass, which holds the VAE and "
                     "text encoders on the device, and the denoiser too unless latents are cached: "
                     f"{step.info['encoding_pass_bytes'] / MIB:,.0f} MiB)")
    if pred.plan is None:
        verdict = "fits" if pred.peak_bytes <= budget.bytes else "does not fit"
        lines.append(f"\nBudget {budget.label()}: {verdict} (fixed batch per bucket)")
        lines += [f"  {bucket:>13}  micro-batch {batch}" for bucket, batch in pred.bucket_batches]
        return lines
    return lines + _budget_lines(pred, budget, "bucket (h, w)", 13)


def _budget_lines(pred: Prediction, budget: Budget, bucket_title: str, width: int,
                  per: str = "") -> list[str]:
    plan = pred.plan
    if plan is None:
        verdict = "fits" if pred.peak_bytes <= budget.bytes else "does not fit"
        return [f"\nBudget {budget.label(per)}: {verdict}"]
    lines = [f"\nBudget {budget.label(per)}: {plan.message}",
             f"  {bucket_title:>{width}}  micro-batch  grad-accum  predicted peak MiB"]
    lines += [f"  {b.bucket!s:>{width}}  {b.micro_batch:>11}  {b.grad_accum:>10}  "
              f"{b.peak_bytes / MIB:>18,.0f}" for b in plan.buckets]
    lines += [f"  try {s.switch}: {s.peak_bytes / MIB:,.0f} MiB (saves "
              f"{s.saving_bytes / MIB:,.0f} MiB){' -> fits' if s.fits else ''}" for s in plan.suggestions]
    return lines
