"""The few lines ``train`` ends with: how the run ended, where the adapter is, the loss and the
held-out loss against the base model's, the peak memory with what measured it, and the time.
``train --json`` prints the whole summary (run.json without the settings) instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lora_gui.units import gb


def duration_text(seconds: float) -> str:
    """57.2 -> '57 s'; 252 -> '4 min 12 s'; 3725 -> '1 h 02 min'."""
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _headline(summary: dict[str, Any], wall_seconds: float | None, resume_hint: str) -> list[str]:
    steps, status = summary.get("steps", 0), summary.get("status")
    step_word = "step" if steps == 1 else "steps"
    timing, trained = "", summary.get("train_seconds")
    if wall_seconds is not None:
        timing = f" in {duration_text(wall_seconds)}"
        if trained and trained > wall_seconds:  # a resumed run: its steps before this session too
            timing += f" ({duration_text(trained)} of training steps, earlier sessions included)"
        elif trained:
            timing += f" ({duration_text(trained)} of training steps)"
    elif trained:
        timing = f" in {duration_text(trained)} of training steps"
    if status == "completed":
        return [f"Training completed: {steps} {step_word}{timing}."]
    if status == "stopped":
        return [f"Training stopped after {steps} {step_word}{timing}; {resume_hint}."]
    reason = f": {summary['message']}" if summary.get("message") else ""
    what = "ran out of memory" if status == "out_of_memory" else f"ended ({status})"
    return [f"Training {what} after {steps} {step_word}{timing}{reason}"]


def _eval_line(summary: dict[str, Any]) -> str | None:
    """The held-out loss against the base model's (lower is better), with the change."""
    tuned, base = summary.get("eval_loss"), summary.get("base_eval_loss")
    if tuned is None and base is None:
        return None
    pictures = summary.get("eval_images") is not None  # an image run
    held = summary.get("eval_images") if pictures else summary.get("eval_samples")
    on = f" on {held:,} held-out {'pictures' if pictures else 'samples'}" if held else ""
    line = f"{_loss(tuned)}{on}; the base model {_loss(base)}"
    if tuned is not None and base:
        change = tuned - base
        line += f" ({change:+.4f}, {change / base:+.1%})"
    if summary.get("eval_loss_full_attention") is not None:
        line += f"; with full attention {_loss(summary['eval_loss_full_attention'])}"
    return line


def _preference_line(summary: dict[str, Any]) -> str | None:
    """Held-out pairs where the chosen answer is the likelier one, trained and base."""
    tuned = summary.get("eval_likelihood_accuracy")
    if tuned is None:
        return None
    base = summary.get("base_eval_likelihood_accuracy")
    pairs = summary.get("eval_pairs")
    on = f" of {pairs} held-out pairs" if pairs else ""
    return (f"the chosen answer is the likelier one in {tuned:.0%}{on}"
            + ("" if base is None else f" (the base model: {base:.0%})"))


def _memory_line(summary: dict[str, Any]) -> str:
    """The peak with what measured it (tracker on a CPU, cuda_allocator on a GPU), how many steps
    it covers, and the planned peak beside it."""
    peak, source = summary.get("peak_bytes"), summary.get("memory_source") or "unknown"
    if peak is None:
        return f"not measured ({source})"
    line = f"{gb(peak)} ({source}"
    if summary.get("steps_measured") is not None:
        measured, skipped = summary["steps_measured"], summary.get("steps_not_measured") or 0
        line += f", {measured} of {measured + skipped} steps measured"
    line += ")"
    if summary.get("step_peak_bytes") is not None:  # the adapter's initialisation was higher
        line += f", at the adapter's initialisation; training steps {gb(summary['step_peak_bytes'])}"
    if summary.get("cache_peak_bytes") and summary.get("train_peak_bytes") is not None \
            and summary["cache_peak_bytes"] > summary["train_peak_bytes"]:
        line += (f", while caching latents and embeddings; training steps "
                 f"{gb(summary['train_peak_bytes'])}")
    if (summary.get("world_size") or 1) > 1:
        line += f", the largest of {summary['world_size']} processes"
    predicted = summary.get("predicted_peak_bytes")
    if predicted:
        line += f"; planned {gb(predicted)} ({predicted / peak - 1:+.1%})"
    budget = summary.get("budget_bytes")
    if budget:
        line += f"; budget {budget / 1e9:,.2f} GB"
    return line


def summary_lines(summary: dict[str, Any], out: Path, wall_seconds: float | None = None,
                  prog: str = "lora-gui") -> list[str]:
    """The short human summary of a finished ``train`` (``summary``: what train() returned,
    run.json's contents; ``wall_seconds``: the command's own time, loading and evaluation
    included)."""
    resume = f"continue with: {prog} train --resume {out}"
    lines = _headline(summary, wall_seconds, resume)
    rows: list[tuple[str, str | None]] = []
    adapter = summary.get("adapter")
    if adapter and Path(adapter).is_dir():
        rows.append(("adapter", adapter))
        if summary.get("kohya_adapter"):
            rows.append(("kohya file", summary["kohya_adapter"]))
    elif adapter:
        rows.append(("adapter", f"not saved ({adapter} is missing)"))
    last = summary.get("final_loss")
    rows.append(("loss", None if last is None else f"{last:.4f} at the last step"))
    rows.append(("eval loss", _eval_line(summary)))
    rows.append(("preference", _preference_line(summary)))
    rows.append(("peak memory", _memory_line(summary)))
    if summary.get("real_tokens_per_s"):
        rows.append(("speed", f"{summary['real_tokens_per_s']:,.0f} tokens/s"))
    elif summary.get("images_per_s"):
        rows.append(("speed", f"{summary['images_per_s']:,.2f} pictures/s"))
    rows.append(("details", f"{out / 'run.json'} ('train --json' prints them)"))
    width = max(len(name) for name, value in rows if value is not None)
    lines += [f"  {name + ':':<{width + 1}} {value}" for name, value in rows if value is not None]
    return lines
