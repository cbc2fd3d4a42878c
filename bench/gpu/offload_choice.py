"""The plan's offload choice on a card (``python -m bench.gpu.check --sections offload``).

A text run that checkpoints without a layer count, under a budget, with the fastest micro-batch
choice, may keep its checkpointed layer inputs in host memory when that is the fastest way to fit
(:mod:`lora_gui.memory.predict.checkpoint_choice`); the step-time model prices the copies at the
host link's round-trip rate the calibration timed, with no overlap counted. What this measures,
on a Llama-3.2-1B-shaped model (the demo's 4,096-token vocabulary, random bf16 weights saved to a
temporary folder: nothing is downloaded), batch 1 at 8,192 tokens:

1. ``plan``: the plan under a roomy budget (every candidate's predicted tokens/s and estimated
   peak: every layer checkpointed on the card, and offloaded).
2. ``offloaded``: the real run under a budget between the two peaks, where only the offloaded
   plan fits: whether the run offloaded, its measured peak (``torch.cuda.max_memory_allocated``,
   the run's own figure) against the budget and its plan, and its predicted against measured
   tokens/s (run.json's ``speed_report``).
3. ``on the card``: the same run with every layer checkpointed and nothing offloaded (a layer
   count of its own: no choice) under the roomy budget, so that the measured cost of offloading
   (the ratio of the two speeds) stands beside the predicted one.

On a CPU (``--smoke``) host and device are one memory: the plan never offloads there, and the rows
say so; the smoke run plans and runs row 3 on a tiny model (the code path, not the figures).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.presets import load_config
from lora_gui.units import GB

WORDS = ("the cat sat on a mat while river light moved over stone and small birds sang "
         "near old trees in quiet morning air").split()


def _documents(folder: Path, docs: int, words: int) -> Path:
    """``docs`` documents of ``words`` words each (longer than the run's tokens: every sample
    is cut to the longest bucket), blank-line separated, as the text loader reads them."""
    rng = random.Random(0)
    path = folder / "long-docs.txt"
    text = "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(docs))
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _run(cfg: RunConfig, folder: Path, name: str) -> dict[str, Any]:
    """One short run through the real engine; the figures this section reports from its summary."""
    from lora_gui.engine.text.train import train_text

    summary = train_text(cfg, folder / name, overwrite=True, progress=False)
    chosen = (summary.get("prediction") or {}).get("checkpointing") or {}
    speed = summary.get("speed_report") or {}
    return {"row": name, "budget_bytes": int(cfg.budget_gb * GB),
            "offload_checkpoints": chosen.get("offload_checkpoints", cfg.offload_checkpoints),
            "checkpoint_layers": chosen.get("checkpoint_layers", cfg.checkpoint_layers),
            "peak_bytes": summary.get("peak_bytes"), "memory_source": summary.get("memory_source"),
            "predicted_peak_bytes": summary.get("predicted_peak_bytes"),
            "predicted_tokens_per_s": speed.get("predicted_tokens_per_s"),
            "measured_tokens_per_s": speed.get("measured_tokens_per_s"),
            "speed_source": speed.get("predicted_source")}


def check_offload_choice(smoke: bool = False) -> list[dict[str, Any]]:
    """The section's rows (see the module doc)."""
    from bench.gpu.peers import LLAMA_1B_SMALL_VOCAB, TINY, model_folder
    from bench.gpu.step_measure import PLAN_ONLY
    from lora_gui.memory.predict.checkpoint_choice import choose_checkpoint_layers

    if PLAN_ONLY[0]:  # nothing to plan ahead: the choice needs the card's own calibration
        return []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = Path(tempfile.mkdtemp(prefix="gpu-offload-"))
    try:
        model_dir = model_folder(TINY if smoke else LLAMA_1B_SMALL_VOCAB, folder / "model", device)
        tokens = 128 if smoke else 8192
        roomy_gb = 4.0 if smoke else 60.0
        data = _documents(folder, 4 if smoke else 6, tokens)
        cfg = apply_overrides(load_config("text-demo"), {
            "model": str(model_dir), "data": str(data), "eval_fraction": 0.0, "max_seq_len": tokens,
            "batch_size": 1, "gradient_checkpointing": True, "checkpoint_layers": 0,
            "batch_choice": "fastest", "precision": "auto", "max_steps": 2 if smoke else 6, "epochs": 1,
            "monitor_hz": 0.0, "checkpoint_every": 1_000_000, "budget_gb": roomy_gb})
        lengths = [tokens] * 4
        roomy = choose_checkpoint_layers(cfg, str(model_dir), int(roomy_gb * GB), device, None, lengths)
        plan_row: dict[str, Any] = {"row": "plan", "device": device,
                                    "choice": roomy.to_json() if roomy else None}
        rows = [plan_row]
        # every layer checkpointed on the card, nothing offloaded: a layer count of its own, no choice
        on_card = _run(apply_overrides(cfg, {"checkpoint_layers": roomy.of_layers if roomy else 1}),
                       folder, "on the card")
        every = next((p for k, _, p in roomy.depths if k == roomy.of_layers), None) if roomy else None
        if roomy is None or roomy.offloaded is None or every is None:
            plan_row["note"] = ("no offload candidate: a CPU (host and device are one memory)"
                                if device == "cpu" else
                                "no offload candidate: the host link was not timed or nothing fits")
            return rows + [on_card]
        budget = (roomy.offloaded[1] + every) // 2  # only the offloaded plan fits under it
        plan_row["budget_between_bytes"] = [roomy.offloaded[1], every]
        offloaded = _run(apply_overrides(cfg, {"budget_gb": budget / GB}), folder, "offloaded")
        for kind in ("measured", "predicted"):
            mine, theirs = offloaded[f"{kind}_tokens_per_s"], on_card[f"{kind}_tokens_per_s"]
            offloaded[f"{kind}_speed_vs_on_card"] = mine / theirs if mine and theirs else None
        if offloaded["peak_bytes"]:
            offloaded["within_budget"] = offloaded["peak_bytes"] <= offloaded["budget_bytes"]
        return rows + [offloaded, on_card]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The section's table for gpu_check.md: each run's choice, peak against its budget, speeds."""
    from bench.common import markdown_table

    plan = rows[0]
    out = ["## Offloading checkpointed layer inputs: the plan's choice on this device", ""]
    if plan.get("note"):
        out += [plan["note"], ""]
    runs = [r for r in rows[1:] if "budget_bytes" in r]
    mib = 2**20
    table = [[r["row"], r["offload_checkpoints"], f"{r['budget_bytes'] / mib:,.0f}",
              f"{(r['peak_bytes'] or 0) / mib:,.0f}", f"{(r['predicted_peak_bytes'] or 0) / mib:,.0f}",
              f"{r['predicted_tokens_per_s'] or 0:,.0f}", f"{r['measured_tokens_per_s'] or 0:,.0f}"]
             for r in runs]
    out += markdown_table(["run", "offloaded", "budget MiB", "peak MiB (measured)", "planned MiB",
                           "predicted tokens/s", "measured tokens/s"], table).splitlines()
    return out + [""]
