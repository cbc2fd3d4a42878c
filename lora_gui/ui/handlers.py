"""Thin UI handlers: form values -> engine calls -> what the page shows. No training logic here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.images import ImageDataError
from lora_gui.data.text import DataError
from lora_gui.engine.core.rundir import RunDirError, load_run_config, run_folder
from lora_gui.engine.jobs import JobBusyError, JobManager
from lora_gui.memory.meter import GB
from lora_gui.models.text import ModelError
from lora_gui.presets import list_presets, load_config
from lora_gui.ui import charts

RUNS_ROOT = Path("runs")
USER_ERRORS = (ConfigError, DataError, ImageDataError, ModelError, RunDirError, JobBusyError)
FORM_KEYS = ("model", "data", "max_seq_len", "budget_gb", "mode", "batching", "gradient_checkpointing",
             "attention", "window", "global_tokens", "precision", "quantization", "optimizer")
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
        return "VRAM budget (GB) — simulated: no GPU here, the tracker enforces it on CPU"
    return f"VRAM budget (GB) — this GPU has {total:.1f} GB"


SIMULATED_BUDGET_GB = 2.0  # default simulated VRAM budget on a machine without a GPU


def default_budget_gb() -> float:
    """The detected GPU's total memory, or the simulated default without a GPU."""
    total = gpu_total_gb()
    return round(total, 1) if total is not None else SIMULATED_BUDGET_GB


def form_defaults(preset: str) -> list[Any]:
    """The form values a preset sets (preset file over the defaults); the budget defaults to the
    GPU's memory (or a simulated budget) when the preset sets none."""
    cfg = load_config(preset)
    values = {key: getattr(cfg, key) for key in FORM_KEYS}
    values["budget_gb"] = cfg.budget_gb or default_budget_gb()
    return [values[key] for key in FORM_KEYS]


def build_config(preset: str, *values: Any) -> RunConfig:
    """Preset + form values -> validated RunConfig; bad values raise ConfigError naming the field."""
    overrides = dict(zip(FORM_KEYS, values))
    if overrides["budget_gb"] is None or overrides["budget_gb"] <= 0:
        raise ConfigError(f"budget_gb: {overrides['budget_gb']} — enter the VRAM budget in GB (> 0), "
                          "e.g. your card's memory")
    for key in ("max_seq_len", "window", "global_tokens"):
        if overrides[key] is not None:
            overrides[key] = int(overrides[key])
    data = str(overrides["data"]).strip()
    if not data:
        raise ConfigError("data: empty; use 'builtin' or a file path")
    if not data.startswith("builtin") and not (Path(data).is_file() or Path(data).is_dir()):
        raise DataError(f"data: {data} not found")
    return load_config(preset, overrides)


def predict(preset: str, *values: Any) -> str:
    """The predicted peak for the form as it stands (closed-form estimate: instant)."""
    from lora_gui.memory import run_plan

    try:
        cfg = build_config(preset, *values)
        device = "cuda" if gpu_total_gb() is not None else "cpu"
        if cfg.task == "image":
            from lora_gui.memory.image_run_plan import estimated_image_step

            step = estimated_image_step(cfg, device)
            how = "UNet trace" if cfg.resolved_attn_backend() == "eager" else "trace-calibrated UNet estimate"
        else:
            step, how = run_plan.estimated_step(cfg, device), "closed-form estimate"
    except (ValueError, *USER_ERRORS) as err:
        return f"Predicted peak: not available ({err})"
    budget = int(cfg.budget_gb * GB)
    verdict = ""
    if budget:
        verdict = " — fits the budget" if step.peak_bytes <= budget else " — **above the budget**"
    return (f"Predicted peak: **{step.peak_bytes / 2**20:,.0f} MiB** (source: predicted, {how} "
            f"for {device}; largest micro-batch){verdict}")


def gpu_count() -> int:
    """GPUs this machine shows torch (the Train tab's processes field appears above one)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_processes(processes: Any) -> int:
    """The processes field as a whole number from 1 to the GPU count (ConfigError otherwise)."""
    n = int(processes or 1)
    if n < 1 or (n > 1 and n > gpu_count()):
        raise ConfigError(f"processes: {n}; this machine shows {gpu_count()} GPU(s): "
                          f"use 1 to {max(1, gpu_count())}")
    return n


def start(preset: str, out_name: str, *values: Any, resume: bool = False, processes: Any = 1) -> str:
    """Starts (or resumes) a job; returns the message shown next to the buttons. With
    ``processes`` > 1 the job is an ``accelerate launch`` on that many local GPUs."""
    try:
        n = check_processes(processes)
        out = run_folder(RUNS_ROOT, out_name.strip() or preset)  # one name inside runs/
        cfg = load_run_config(out) if resume else build_config(preset, *values)
        job = MANAGER.start(cfg, out, resume=resume, overwrite=not resume, processes=n)
    except USER_ERRORS as err:
        return f"Error: {err}"
    on = f" on {n} GPUs (accelerate launch)" if n > 1 else ""
    return f"{'Resuming' if resume else 'Started'} **{job.name}**{on} → `{job.out}`"


def start_with_processes(processes: Any, task: str, preset: str, out_name: str, *values: Any,
                         resolution: Any = None) -> str:
    """Start button with the processes field (shown only where more than one GPU is visible)."""
    if task == "text" and int(processes or 1) > 1:
        return start(preset, out_name, *values, processes=processes)
    return start_task(task, preset, out_name, *values, resolution=resolution)


def start_task(task: str, preset: str, out_name: str, *values: Any, resolution: Any = None) -> str:
    """Start button: the form as it stands, for the chosen task (image: at ``resolution`` px)."""
    try:
        out = run_folder(RUNS_ROOT, out_name.strip() or preset)  # one name inside runs/
        cfg = build_config(preset, *values)
        extra: dict[str, Any] = {"task": task}
        if task == "image" and resolution:
            extra["resolution"] = int(resolution)
        from lora_gui.config import apply_overrides

        cfg = apply_overrides(cfg, extra, where="form")
        job = MANAGER.start(cfg, out, overwrite=True)
    except USER_ERRORS as err:
        return f"Error: {err}"
    return f"Started **{job.name}** ({cfg.task}) → `{job.out}`"


def preset_task(preset: str) -> tuple[str, int]:
    """The task and resolution a preset sets (the Train tab follows the preset)."""
    cfg = load_config(preset)
    return cfg.task, cfg.resolution


def task_preset(task: str, preset: str) -> str:
    """A preset for the task the user picked: the current one when it fits, else the demo one."""
    if load_config(preset).task == task:
        return preset
    names = preset_names()
    wanted = "image-512" if task == "image" else "text-demo"
    return wanted if wanted in names else preset


def sample_gallery() -> list[str]:
    """Sample pictures of the current job (runs/NAME/samples/*.png), newest run only."""
    job = MANAGER.job
    if job is None:
        return []
    return sorted(str(p) for p in (job.out / "samples").glob("*.png"))


UPLOAD_DIR = Path("runs") / "uploads"


def use_upload(file_path: str | None) -> tuple[Any, str]:
    """Copies an uploaded data file under runs/uploads/ and points the data field at it."""
    import shutil

    import gradio as gr

    if not file_path:
        return gr.update(), "Error: no file was uploaded"
    src = Path(file_path)
    if src.stat().st_size == 0:
        return gr.update(), f"Error: {src.name} is empty"
    try:
        from lora_gui.data.text import load_documents

        docs = load_documents(src)
    except DataError as err:
        return gr.update(), f"Error: {err}"
    UPLOAD_DIR.mkdir(parents=True, exist_ok=True)
    dest = UPLOAD_DIR / src.name
    shutil.copyfile(src, dest)
    return str(dest), f"Uploaded {src.name}: {len(docs)} documents"


def stop() -> str:
    return MANAGER.stop()


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _progress(done: int, total: int | None, elapsed: float) -> str:
    """A text progress bar with ETA (the measured seconds per step so far)."""
    if not total:
        return f"step {done}"
    filled = round(20 * done / total)
    eta = f", ETA {elapsed / done * (total - done):.0f} s" if done else ""
    return f"`{'█' * filled}{'░' * (20 - filled)}` step {done}/{total}{eta}"


def poll() -> tuple[Any, Any, Any, Any, str, str]:
    """Called by the page's timer: figures and status of the current job (full history, so a
    reloaded page re-attaches with everything)."""
    job = MANAGER.job
    if job is None:
        empty: list[dict] = []
        return (charts.memory_timeline(empty, []), charts.memory_figure(empty), charts.loss_figure(empty),
                charts.throughput_figure(empty), "No job yet. Pick a preset and press Start.", "")
    records, events = job.snapshot()
    samples, phases = job.memory_snapshot()
    budget = int(job.cfg.budget_gb * GB) or None
    simulated = gpu_total_gb() is None
    figs = (charts.memory_timeline(samples, phases, budget, job.predicted_bytes, simulated),
            charts.memory_figure(records, budget, job.predicted_bytes, simulated),
            charts.loss_figure(records), charts.throughput_figure(records))
    done = records[-1]["step"] if records else 0
    train_start = next((t for name, t in phases if name == "training"), job.started)
    status = (f"**{job.name}**: {job.status} ({job.phase}) · "
              f"{_progress(done, job.total_steps, time.time() - train_start)}")
    if job.error:
        status += f"\n\nError: {job.error}"
    if job.summary and job.status in ("completed", "stopped", "out_of_memory"):
        s = job.summary
        status += (f"\n\nAdapter: `{s['adapter']}` · eval loss {_fmt(s['eval_loss'], '.3f')} "
                   f"(base {_fmt(s['base_eval_loss'], '.3f')}) · steps {s['steps']} · peak "
                   f"{_fmt(s['peak_bytes'] and s['peak_bytes'] / 2**20, '.0f')} MiB ({s['memory_source']})")
        if s.get("message"):
            status += f"\n\n{s['message']}"
    log = "\n".join(time.strftime("%H:%M:%S ", time.localtime(e["time"])) + e["event"] for e in events)
    return (*figs, status, log)


def bundled_model_names() -> list[str]:
    from lora_gui.memory.model_configs import bundled_models

    return bundled_models()


IMAGE_PLAN_RESOLUTIONS = (512, 768, 1024, 1280, 1536)


def _plan_image(model: str, resolution: int, budget: int, device: str, checkpointing: bool):
    """Plan tab for a UNet config: trace at the resolution, batch per resolution, card table."""
    import torch

    from lora_gui.memory import planner
    from lora_gui.memory.model_configs import load_model_config
    from lora_gui.memory.trace import trace_unet_step

    if resolution % 64 or not 512 <= resolution <= 1536:
        raise ConfigError(f"resolution: {resolution} must be 512-1536 in steps of 64")
    unet = load_model_config(model)
    step_kw = {"gradient_checkpointing": checkpointing, "device": device,
               "dtype": torch.bfloat16 if device == "cuda" else torch.float32}
    step = trace_unet_step(unet, batch_size=1, resolution=resolution, **step_kw)
    result = planner.plan_image(unet, budget, IMAGE_PLAN_RESOLUTIONS, **step_kw)
    rows = planner.what_fits_where(unet, chosen=resolution, **step_kw)
    return result, step, rows


def plan(preset: str, model: str, max_seq_len: float, budget_gb: float, device: str,
         checkpointing: bool, resolution: float = 1024, quantization: str = "none",
         optimizer: str = "auto") -> tuple[Any, str, list[list[Any]], list[list[Any]]]:
    """Plan tab: breakdown figure, verdict, bucket table and card table (source: predicted)."""
    from lora_gui.memory import planner, run_plan, run_predict
    from lora_gui.memory.model_configs import is_unet_config, load_model_config

    empty: list[list[Any]] = []
    try:
        if model in bundled_model_names() and is_unet_config(load_model_config(model)):
            budget = planner.check_budget((budget_gb or 0) * GB)
            result, step, rows = _plan_image(model, int(resolution or 0), budget, device, bool(checkpointing))
            return _plan_outputs(result, step, rows, budget, device, "batch 1 at this resolution")
    except (ValueError, *USER_ERRORS) as err:
        return charts.breakdown_figure({}, {}), f"Error: {err}", empty, empty
    try:
        cfg = load_config(preset, {"model": model, "max_seq_len": int(max_seq_len or 0),
                                   "gradient_checkpointing": bool(checkpointing),
                                   "quantization": quantization, "optimizer": optimizer})
        budget = planner.check_budget((budget_gb or 0) * GB)
        result, step = run_predict.plan_and_predict(cfg, budget, device, confirm=False)
        rows = planner.what_fits_where(run_plan.model_config_for(cfg), chosen=cfg.max_seq_len,
                                       **run_plan.step_kwargs(cfg, device))
    except (ValueError, *USER_ERRORS) as err:
        return charts.breakdown_figure({}, {}), f"Error: {err}", empty, empty
    return _plan_outputs(result, step, rows, budget, device, "the run's largest micro-batch")


def _plan_outputs(result, step, rows, budget: int, device: str, shape: str):
    verdict = "Fits" if result.fits else "Does not fit"
    text = (f"**{verdict}** — {result.message}\n\nPredicted peak at {shape}: "
            f"**{step.peak_bytes / 2**20:,.0f} MiB** (source: predicted, {device})")
    for sug in result.suggestions:
        text += f"\n- {sug.switch}: {sug.peak_bytes / 2**20:,.0f} MiB{' — fits' if sug.fits else ''}"
    table = [[b.bucket, b.micro_batch, b.grad_accum, round(b.peak_bytes / 2**20)] for b in result.buckets]
    card_rows = [[r.card_gb, r.longest or "nothing fits", r.batch_at_chosen,
                  *(f"{fit[0] or '-'} / {fit[1]}" for fit in r.by_gpus.values()),
                  *([f"{fit[0] or '-'} / {fit[1]}" for fit in r.by_quantization.values()]
                    or ["-"] * 3)] for r in rows]
    return charts.breakdown_figure(step.breakdown, step.cuda_overheads, budget), text, table, card_rows


def read_preset(name: str) -> str:
    """The preset's YAML text, or a starting point for a new preset."""
    from lora_gui.presets import PRESET_DIR

    path = PRESET_DIR / f"{Path(str(name)).stem}.yaml"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    return "# What this preset is for.\nmax_steps: 100\n"


def save_preset(name: str, text: str) -> str:
    """Validates the YAML (known keys, ranges) and writes presets/NAME.yaml; never a bad file."""
    import re

    import yaml

    from lora_gui.config import apply_overrides
    from lora_gui.engine.core.checkpoint import write_atomic
    from lora_gui.presets import PRESET_DIR

    stem = str(name or "").strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", stem):
        return f"Error: name {stem!r}: use letters, digits, '.', '_' or '-'"
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        return f"Error: {stem}.yaml is not valid YAML: {err}"
    if not isinstance(data, dict) or not data:
        return f"Error: {stem}.yaml must be a mapping of setting: value with at least one setting"
    if not text.lstrip().startswith("#"):
        return f"Error: {stem}.yaml must start with a comment that says what the preset is for"
    try:
        apply_overrides(RunConfig(), data, where=f"{stem}.yaml")
    except ConfigError as err:
        return f"Error: {err}"
    write_atomic(PRESET_DIR / f"{stem}.yaml", text if text.endswith("\n") else text + "\n")
    return f"Saved presets/{stem}.yaml"


def benchmark_table() -> str:
    """The measured text comparison table from docs/BENCHMARKS.md (first table in the file)."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md"
    if not doc.is_file():
        return "docs/BENCHMARKS.md is missing."
    lines = doc.read_text(encoding="utf-8").splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("| mode")), None)
    if first is None:
        return "No measured table in docs/BENCHMARKS.md yet."
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return "\n".join(table)


# -- Compare tab (issue 7) ------------------------------------------------------------------------
COMPARE_TABLE_COLUMNS = ("question", "data", "mode", "seq_len", "status", "batch_size", "peak MiB",
                         "memory_source", "predicted MiB", "real tokens/s", "eval_loss", "message")
_COMPARE: dict[str, Any] = {"thread": None, "stop": None, "out": None, "error": None}


def _compare_table(rows: list[dict[str, Any]]) -> list[list[Any]]:
    def mib(v: int | None) -> float | None:
        return round(v / 2**20, 1) if v else None

    return [[r["question"], r["data"], r["mode"], r.get("seq_len") or r.get("resolution"), r.get("status"),
             r.get("batch_size"), mib(r.get("peak_bytes")), r.get("memory_source"),
             mib(r.get("predicted_peak_bytes")),
             round(r.get("real_tokens_per_s") or r.get("images_per_s") or 0, 1) or None,
             r.get("eval_loss"), r.get("message")] for r in rows]


def load_compare(path: str, data: str = "corpus", size: str | None = None) -> tuple:
    """Figures and table from a compare.json: (message, memory bars, speed bars, waterfall, table)."""
    from lora_gui.engine.compare.results import load_results

    try:
        rows = load_results(Path(path or "runs/cmp"))["rows"]
    except ConfigError as err:
        return f"Error: {err}", None, None, None, []
    kinds = sorted({r["data"] for r in rows})
    data = data if data in kinds else (kinds[0] if kinds else data)
    sizes = sorted({r.get("seq_len") or r.get("resolution") for r in rows if r["data"] == data})
    chosen = sizes[-1] if sizes else None
    if size and str(size).isdigit() and int(size) in sizes:
        chosen = int(size)
    message = (f"{len(rows)} rows from {path} ({data} data; sources: "
               f"{', '.join(sorted({str(r.get('memory_source')) for r in rows}))}).")
    running = _COMPARE["thread"] is not None and _COMPARE["thread"].is_alive()
    if running:
        message += " A comparison is running: press Load again for new rows."
    elif _COMPARE["error"]:
        message += f" Last run failed: {_COMPARE['error']}"
    return (message, charts.compare_bars(rows, "memory", data), charts.speed_bars(rows, data),
            charts.ablation_waterfall(rows, data, chosen), _compare_table(rows))


def start_compare(preset: str, seq_lens: str, steps: float, out: str) -> str:
    """Runs `compare` in a background thread (one at a time, never beside a training job)."""
    import threading

    from lora_gui.engine.compare.spec import CompareSettings
    from lora_gui.engine.compare.text_rows import run_comparison

    if _COMPARE["thread"] is not None and _COMPARE["thread"].is_alive():
        return f"Error: a comparison is already running (into {_COMPARE['out']})"
    if MANAGER.job is not None and MANAGER.job.running:
        return f"Error: a training job is running ({MANAGER.job.name}); stop it first"
    try:
        lengths = [int(x) for x in str(seq_lens).split(",") if x.strip()]
        settings = CompareSettings(seq_lens=lengths, steps=int(steps or 0)).validate()
        cfg = load_config(preset)
    except ValueError as err:
        return f"Error: {err}"
    stop = threading.Event()
    target = Path(out or "runs/cmp")

    def work() -> None:
        try:
            run_comparison(cfg, settings, target, stop=stop)
            _COMPARE["error"] = None
        except Exception as err:  # shown by the next Load; the thread must not die silently
            _COMPARE["error"] = f"{type(err).__name__}: {err}"

    _COMPARE.update(thread=threading.Thread(target=work, daemon=True, name="compare"), stop=stop,
                    out=target, error=None)
    _COMPARE["thread"].start()
    return f"Comparing into {target} (rows appear in {target / 'compare.json'} one by one)"


def stop_compare() -> str:
    if _COMPARE["thread"] is None or not _COMPARE["thread"].is_alive():
        return "no comparison is running"
    _COMPARE["stop"].set()
    return "stopping after the current row (rows written so far are kept; run again to resume)"
