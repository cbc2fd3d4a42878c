"""What ``plan`` prints for a video run: the predicted peak of the run's largest micro-batch
(source: predicted, :func:`lora_gui.memory.predict.video_run.video_run_prediction`), what the
caching pass and block swap add, the breakdown at the peak and the verdict against the budget."""

from __future__ import annotations

from typing import Any

from lora_gui.config import RunConfig
from lora_gui.units import gb


def video_plan_lines(cfg: RunConfig, pred: Any, budget: Any) -> list[str]:
    """What `plan` prints for a video run (``pred``: a :class:`lora_gui.memory.predict.run.Prediction`)."""
    step = pred.step
    bucket = "x".join(str(v) for v in step.info.get("bucket", ()))
    lines = [f"Predicted peak of the video run on {pred.device} (source: predicted, {cfg.model}, largest "
             f"micro-batch {step.info.get('batch_size')} clip(s) of {bucket} px x frames, "
             f"{step.info.get('video_tokens', 0):,} video tokens): {gb(pred.peak_bytes)}"]
    if step.info.get("encoding_pass_bytes"):
        encoding = step.info["encoding_pass_bytes"]
        lines.append(f"  training steps alone: {gb(pred.train_peak_bytes)}; the caching pass "
                     f"(VAE and text encoder on the device): {gb(encoding)}")
    if step.info.get("blocks_to_swap"):
        lines.append(f"  block swap: the last {step.info['blocks_to_swap']} transformer blocks' frozen "
                     f"weights in host memory (RAM): {gb(step.info.get('host_bytes', 0))} of RAM needed, "
                     "one block's copy at a time on the device (counted above)")
    lines.append("  breakdown at the peak: " + ", ".join(
        f"{k} {gb(v)}" for k, v in step.breakdown.items() if v))
    if budget is None:
        lines.append("\nNo budget to judge against: the peak above is what the run will hold")
    else:
        verdict = "fits" if pred.peak_bytes <= budget.bytes else "does not fit"
        lines.append(f"\nBudget {budget.label()}: {verdict}")
    lines += [f"  {name:>14}  micro-batch {batch}" for name, batch in pred.bucket_batches]
    return lines
