"""A text comparison: its rows filled by real runs through the engine, or by the planner alone."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.data.text import DataError
from lora_gui.engine.compare.data import CompareData, data_stats, prepare_data
from lora_gui.engine.compare.results import Comparison, resume_rows, write_results
from lora_gui.engine.compare.spec import (
    MAX_SPEED_BATCH,
    SPEED_BUDGET_HEADROOM,
    CompareSettings,
    RowSpec,
    budget_gb,
    iter_specs,
    mode_overrides,
    modes_for,
)
from lora_gui.engine.core.lock import holds_run_folder
from lora_gui.memory.runtime.meter import GB
from lora_gui.models.text import ModelError

log = logging.getLogger(__name__)
PRECISION_NAMES = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}
SWITCHES = ("batching", "attn_backend", "attention", "gradient_checkpointing", "loss_chunk",
            "token_budget", "pad_multiple")


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _predicted_peak(cfg: RunConfig, device: str, batch: int, seq_len: int) -> int:
    from lora_gui.memory.predict import run_plan

    return run_plan.predicted_step(cfg, device, batch_size=batch, seq_len=seq_len).peak_bytes


def _largest_fixed_batch(cfg: RunConfig, device: str, seq_len: int, budget: int, most: int) -> int:
    """Largest batch (<= most) whose traced peak at the full length fits the budget; 0: none."""
    if _predicted_peak(cfg, device, 1, seq_len) > budget:
        return 0
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _predicted_peak(cfg, device, mid, seq_len) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _speed_budget(base: RunConfig, device: str, seq_len: int) -> int:
    """The speed question's budget: budget_gb when set, else traditional's need at batch_size."""
    if base.budget_gb:
        return int(base.budget_gb * GB)
    trad = apply_overrides(base, {"max_seq_len": seq_len, **mode_overrides("traditional", seq_len,
                                                                           base.batch_size, base)})
    return int(_predicted_peak(trad, device, base.batch_size, seq_len) * SPEED_BUDGET_HEADROOM)


def _optimized_speed(base: RunConfig, device: str, seq_len: int, budget: int, median: int,
                     most: int) -> tuple[dict[str, Any], int]:
    """Optimized under the budget: checkpointing only if needed; batch = the planner's at the
    bucket of the median sample."""
    from lora_gui.memory.predict import run_plan
    from lora_gui.memory.predict.checkpoint_choice import choose_checkpoint_layers

    over = {**mode_overrides("optimized", seq_len, most, base), "gradient_checkpointing": False}
    cfg = apply_overrides(base, {"max_seq_len": seq_len, "batch_size": most, **over})
    if _predicted_peak(cfg, device, 1, seq_len) > budget:
        cfg = apply_overrides(cfg, {"gradient_checkpointing": True})
        depth = choose_checkpoint_layers(cfg, None, budget, device)  # as the run would choose, said outright
        cfg = depth.applied(cfg) if depth is not None else cfg
        over |= {"gradient_checkpointing": cfg.gradient_checkpointing,
                 "checkpoint_layers": cfg.checkpoint_layers, "offload_checkpoints": cfg.offload_checkpoints}
    plan = run_plan.plan_run(cfg, budget, device)
    caps = {int(b.bucket): b.micro_batch for b in plan.buckets}
    bucket = min((n for n in caps if n >= median), default=max(caps))
    return over, max(1, caps[bucket])


def _spec(cmp: Comparison, question: str, data: str, seq_len: int, mode: str, device: str,
          stats: tuple[int, int]) -> tuple[RowSpec, int]:
    """The row's overrides and batch: same work (memory) or largest batch under the budget (speed)."""
    base = cmp.base
    batch = base.batch_size
    budget = int(base.budget_gb * GB) or None
    over = mode_overrides(mode, seq_len, batch, base)
    if question == "speed":
        budget = _speed_budget(base, device, seq_len)
        most = max(1, min(MAX_SPEED_BATCH, stats[1] // cmp.settings.steps))  # samples the data has
        if mode == "optimized":
            over, batch = _optimized_speed(base, device, seq_len, budget, stats[0], most)
        else:  # one fixed batch for the length
            cfg = apply_overrides(base, {"max_seq_len": seq_len, **over})
            batch = max(1, _largest_fixed_batch(cfg, device, seq_len, budget, most))
            over = mode_overrides(mode, seq_len, batch, base)
    return RowSpec(question, data, mode, seq_len, over, budget), batch


def _step_stats(folder: Path) -> tuple[int | None, float | None]:
    """(largest micro-batch, steady-state real tokens/s) of a run, from its metrics.jsonl.

    Tokens/s leaves the first step out when there are more: it carries one-off costs (kernel
    selection, first allocations) that every row pays once and that would swamp short rows.
    """
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return None, None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    micro = max((math.ceil(r["batch_size"] / r["micro_batches"]) for r in records), default=None)
    steady = records[1:] if len(records) > 1 else records
    seconds = sum(r["seconds"] for r in steady)
    return micro, (sum(r["real_tokens"] for r in steady) / seconds if seconds else None)


def _base_row(spec: RowSpec, batch: int, cfg: RunConfig, measure: str) -> dict[str, Any]:
    switches = {k: getattr(cfg, k) for k in SWITCHES}
    if cfg.attention == "windowed":
        switches.update(window=cfg.window, global_tokens=cfg.global_tokens)
    return {"question": spec.question, "data": spec.data, "mode": spec.mode, "seq_len": spec.seq_len,
            "resolution": None, "status": "ok", "message": "", "batch_size": batch, "micro_batch": None,
            "steps": None, "samples": None, "peak_bytes": None, "memory_source": None,
            "predicted_peak_bytes": None, "budget_bytes": spec.budget_bytes, "real_tokens": None,
            "padded_tokens": None, "real_tokens_per_s": None, "images_per_s": None,
            "final_loss": None, "eval_loss": None, "eval_loss_full_attention": None,
            "attention": cfg.attention, "precision": None, "measure": measure,
            "train_seconds": None, "oom_recovered": 0, "switches": switches}


def _run_row(cmp: Comparison, spec: RowSpec, batch: int, data: CompareData, precision: str | None,
             device: str) -> dict[str, Any] | None:
    """Trains one row through train_text; None when the comparison was stopped meanwhile."""
    from lora_gui.engine import train
    from lora_gui.engine.core.control import TrainControl

    extra = {"precision": precision} if precision else {}
    cfg = apply_overrides(cmp.base, {
        "data": str(data.path), "eval_fraction": data.eval_fraction, "max_seq_len": spec.seq_len,
        "batch_size": batch, "max_steps": 0, "epochs": 1, "checkpoint_every": 1_000_000,
        "monitor_hz": 0.0, "budget_gb": budget_gb(spec.budget_bytes), **extra, **spec.overrides})
    row = _base_row(spec, batch, cfg, "measured")
    control = TrainControl()
    first_oom: dict[str, Any] = {}

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "oom" and not first_oom:
            first_oom.update(event)
            if spec.mode != "optimized":  # fixed-batch modes do not split: the row is an OOM
                control.stop.set()

    def on_record(_record: dict[str, Any]) -> None:
        if cmp.stop.is_set():
            control.stop.set()

    control.on_event, control.on_record = on_event, on_record
    folder = cmp.out / "runs" / spec.folder
    try:
        summary = train(cfg, folder, overwrite=True, control=control, progress=False)
    except (ConfigError, DataError, ModelError) as err:
        return {**row, "status": "error", "message": str(err)}
    if cmp.stop.is_set() and summary["status"] == "stopped":
        return None
    micro, steady_tokens_per_s = _step_stats(folder)
    row.update(steps=summary["steps"], samples=summary["train_samples"], micro_batch=micro,
               precision=PRECISION_NAMES.get(summary["precision"], summary["precision"]),
               memory_source=summary["memory_source"], train_seconds=summary["train_seconds"],
               oom_recovered=sum(1 for e in summary["oom_events"] if "new_cap" in e))
    if first_oom and (spec.mode != "optimized" or summary["status"] == "out_of_memory"):
        n = first_oom["micro_batch"]
        need = _predicted_peak(cfg, device, n, first_oom["seq_len"])
        note = "" if need > spec.budget_bytes else " (the prediction assumes unpadded rows; padding " \
            "masks cost more, e.g. SDPA's math kernel on CPU)"
        return {**row, "status": "oom", "predicted_peak_bytes": need,
                "message": f"OOM at batch {n}: predicted need {need / GB:.3f} GB, budget "
                           f"{spec.budget_bytes / GB:.3f} GB{note}"}
    row.update({k: summary[k] for k in ("peak_bytes", "predicted_peak_bytes", "real_tokens",
                                        "padded_tokens", "final_loss", "eval_loss",
                                        "eval_loss_full_attention")})
    row.update(real_tokens_per_s=steady_tokens_per_s,
               real_tokens_per_s_all_steps=summary["real_tokens_per_s"])
    return row


def measured_rows(cmp: Comparison) -> None:
    """Every (length, data, question, mode) row as a real training run; resumes done rows."""
    from lora_gui.models.text import load_tokenizer, resolve_model_source

    settings, base = cmp.settings, cmp.base
    device = _device()
    tokenizer = load_tokenizer(resolve_model_source(base.model))
    # One precision for every row, so rows differ only by their switches: 'auto' is resolved by
    # the first row's own probe and then fixed.
    precision = None if base.precision == "auto" else base.precision
    specs = list(iter_specs(settings))
    data: dict[tuple[str, int, int], CompareData] = {}
    stats: dict[tuple[str, int], tuple[int, int]] = {}
    with tqdm(total=len(specs), disable=not cmp.progress, unit="row") as bar:
        for question, kind, seq_len, mode in specs:
            if cmp.stop.is_set():
                return
            precision = precision or next((r["precision"] for r in cmp.rows if r.get("precision")), None)
            bar.set_postfix_str(f"{question} {kind} {seq_len} {mode}")
            if f"{question}|{kind}|{mode}|{seq_len}" not in cmp.done():
                if (kind, seq_len) not in stats:
                    stats[kind, seq_len] = data_stats(base, kind, seq_len, tokenizer)
                spec, batch = _spec(cmp, question, kind, seq_len, mode, device, stats[kind, seq_len])
                n_train = settings.steps * batch
                if (kind, seq_len, n_train) not in data:
                    data[kind, seq_len, n_train] = prepare_data(base, kind, seq_len, n_train,
                                                                settings.eval_samples, cmp.out / "data",
                                                                tokenizer)
                row = _run_row(cmp, spec, batch, data[kind, seq_len, n_train], precision, device)
                if row is None:
                    return
                cmp.add(row)
            bar.update(1)


def predicted_rows(cmp: Comparison) -> None:
    """The memory question from the planner alone (full-length samples), labelled predicted."""
    from lora_gui.memory.predict import run_plan

    settings, base = cmp.settings, cmp.base
    device = _device() if settings.device == "auto" else settings.device
    for seq_len in settings.seq_lens:
        for mode in modes_for("memory", settings.ablations):
            spec = RowSpec("memory", "full", mode, seq_len,
                           mode_overrides(mode, seq_len, base.batch_size, base), None)
            if spec.key in cmp.done() or cmp.stop.is_set():
                continue
            cfg = apply_overrides(base, {"max_seq_len": seq_len, **spec.overrides})
            row = _base_row(spec, base.batch_size, cfg, "predicted")
            try:
                step = run_plan.predicted_step(cfg, device)
            except (ValueError, NotImplementedError, RuntimeError) as err:
                cmp.add({**row, "status": "error", "message": f"no prediction: {err}"})
                continue
            cmp.add({**row, "micro_batch": step.info.get("batch_size"), "peak_bytes": step.peak_bytes,
                     "predicted_peak_bytes": step.peak_bytes, "memory_source": "predicted",
                     "device": device, "breakdown": step.breakdown})


@holds_run_folder("out")  # one writer per folder, as a training run
def run_comparison(base: RunConfig, settings: CompareSettings, out: str | Path, *,
                   overwrite: bool = False, stop: threading.Event | None = None,
                   on_row: Callable[[dict[str, Any]], None] | None = None,
                   progress: bool = False) -> dict[str, Any]:
    """Fills (or resumes) ``out/compare.json`` and ``compare.csv``; returns {settings, rows}.

    Args:
        base: the run settings every row starts from (preset + --set); each mode overrides only
            its switches, the length, the data file and the batch.
        settings: lengths, steps, questions, data kinds, ablations, measured or predicted.
        out: output folder (compare.json, compare.csv, data/, runs/).
        overwrite: start again instead of resuming rows already in out/compare.json.
        stop: set it to stop after the row in progress (rows written so far are kept).
        on_row: called with every new row.
    """
    if settings.measure == "predicted":  # the planner knows shapes, not documents or speed
        settings.questions, settings.data_kinds = ["memory"], ["full"]
    settings.validate()
    if base.task != "text":
        raise ConfigError(f"task: compare --seq-lens runs text presets; {base.task!r} needs --resolutions")
    cmp = Comparison(base, settings, Path(out), stop or threading.Event(), on_row, progress)
    cmp.rows = resume_rows(cmp.out, cmp.saved_settings(), overwrite)
    if settings.measure == "predicted":
        predicted_rows(cmp)
    else:
        measured_rows(cmp)
    write_results(cmp.out, cmp.saved_settings(), cmp.rows)
    return {"settings": cmp.saved_settings(), "rows": cmp.rows}
