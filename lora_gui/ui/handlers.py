"""Thin UI handlers: form values -> engine calls -> what the page shows. No training logic here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.text import DataError
from lora_gui.engine.jobs import JobBusyError, JobManager
from lora_gui.engine.rundir import RunDirError, load_run_config
from lora_gui.memory.meter import GB
from lora_gui.models.text import ModelError
from lora_gui.presets import list_presets, load_config
from lora_gui.ui import charts

RUNS_ROOT = Path("runs")
USER_ERRORS = (ConfigError, DataError, ModelError, RunDirError, JobBusyError)
FORM_KEYS = ("model", "data", "max_seq_len", "budget_gb", "mode", "batching", "gradient_checkpointing")
MANAGER = JobManager()  # one job per server process, shared by every page that attaches


def preset_names() -> list[str]:
    return [p.stem for p in list_presets()]


def gpu_total_gb() -> float | None:
    """Total memory of the first GPU in GB, or None without one."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GB
    return None


def budget_label() -> str:
    total = gpu_total_gb()
    if total is None:
        return "VRAM budget (GB) — simulated: no GPU here, the tracker enforces it on CPU (0 = none)"
    return f"VRAM budget (GB) — GPU has {total:.1f} GB (0 = none)"


def form_defaults(preset: str) -> list[Any]:
    """The form values a preset sets (preset file over the defaults)."""
    cfg = load_config(preset)
    return [getattr(cfg, key) for key in FORM_KEYS]


def build_config(preset: str, *values: Any) -> RunConfig:
    """Preset + form values -> validated RunConfig; bad values raise ConfigError naming the field."""
    overrides = dict(zip(FORM_KEYS, values))
    if overrides["budget_gb"] is None or overrides["budget_gb"] < 0:
        raise ConfigError(f"budget_gb: {overrides['budget_gb']} must be 0 (none) or a positive number")
    for key in ("max_seq_len",):
        if overrides[key] is not None:
            overrides[key] = int(overrides[key])
    data = str(overrides["data"]).strip()
    if not data:
        raise ConfigError("data: empty; use 'builtin' or a file path")
    if not data.startswith("builtin") and not Path(data).is_file():
        raise DataError(f"data: {data} not found")
    return load_config(preset, overrides)


def start(preset: str, out_name: str, *values: Any, resume: bool = False) -> str:
    """Starts (or resumes) a job; returns the message shown next to the buttons."""
    try:
        out = RUNS_ROOT / (out_name.strip() or preset)
        cfg = load_run_config(out) if resume else build_config(preset, *values)
        job = MANAGER.start(cfg, out, resume=resume, overwrite=not resume)
    except USER_ERRORS as err:
        return f"Error: {err}"
    return f"{'Resuming' if resume else 'Started'} **{job.name}** → `{job.out}`"


def stop() -> str:
    return MANAGER.stop()


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def poll() -> tuple[Any, Any, Any, str, str]:
    """Called by the page's timer: figures and status of the current job (full history)."""
    job = MANAGER.job
    if job is None:
        empty: list[dict] = []
        return (charts.memory_figure(empty), charts.loss_figure(empty), charts.throughput_figure(empty),
                "No job yet. Pick a preset and press Start.", "")
    records, events = job.snapshot()
    budget = int(job.cfg.budget_gb * GB) or None
    figs = (charts.memory_figure(records, budget, simulated_budget=gpu_total_gb() is None),
            charts.loss_figure(records), charts.throughput_figure(records))
    total = job.cfg.max_steps or None
    done = records[-1]["step"] if records else 0
    elapsed = time.time() - job.started
    eta = ""
    if total and done:
        eta = f", ETA {elapsed / done * (total - done):.0f} s"
    status = f"**{job.name}**: {job.status} ({job.phase}), step {done}" + (f"/{total}" if total else "") + eta
    if job.error:
        status += f"\n\nError: {job.error}"
    if job.summary and job.status in ("completed", "stopped"):
        s = job.summary
        status += (f"\n\nAdapter: `{s['adapter']}` · eval loss {_fmt(s['eval_loss'], '.3f')} "
                   f"(base {_fmt(s['base_eval_loss'], '.3f')}) · steps {s['steps']} · peak "
                   f"{_fmt(s['peak_bytes'] and s['peak_bytes'] / 2**20, '.0f')} MiB ({s['memory_source']})")
    log = "\n".join(time.strftime("%H:%M:%S ", time.localtime(e["time"])) + e["event"] for e in events)
    return (*figs, status, log)


def bundled_model_names() -> list[str]:
    from lora_gui.memory.model_configs import bundled_models

    return [m for m in bundled_models() if "unet" not in m]  # image models join with the image engine


def plan(preset: str, model: str, max_seq_len: float, budget_gb: float, device: str,
         checkpointing: bool) -> tuple[Any, str, list[list[Any]], list[list[Any]]]:
    """Plan tab: breakdown figure, verdict, bucket table and card table (source: predicted)."""
    from lora_gui.memory import planner, run_plan

    empty: list[list[Any]] = []
    try:
        cfg = load_config(preset, {"model": model, "max_seq_len": int(max_seq_len or 0),
                                   "gradient_checkpointing": bool(checkpointing)})
        budget = planner.check_budget((budget_gb or 0) * GB)
        result, step = run_plan.plan_and_predict(cfg, budget, device, confirm=False)
        rows = planner.what_fits_where(run_plan.model_config_for(cfg), chosen=cfg.max_seq_len,
                                       **run_plan.step_kwargs(cfg, device))
    except (ValueError, *USER_ERRORS) as err:
        return charts.breakdown_figure({}, {}), f"Error: {err}", empty, empty
    verdict = "Fits" if result.fits else "Does not fit"
    text = (f"**{verdict}** — {result.message}\n\nPredicted peak at the run's largest micro-batch: "
            f"**{step.peak_bytes / 2**20:,.0f} MiB** (source: predicted, {device})")
    for sug in result.suggestions:
        text += f"\n- {sug.switch}: {sug.peak_bytes / 2**20:,.0f} MiB{' — fits' if sug.fits else ''}"
    table = [[b.bucket, b.micro_batch, b.grad_accum, round(b.peak_bytes / 2**20)] for b in result.buckets]
    card_rows = [[r.card_gb, r.longest or "nothing fits", r.batch_at_chosen] for r in rows]
    return charts.breakdown_figure(step.breakdown, step.cuda_overheads, budget), text, table, card_rows
