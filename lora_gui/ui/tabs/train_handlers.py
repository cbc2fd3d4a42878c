"""Train tab handlers: form values (a dict keyed by setting name) -> engine calls -> what the page
shows. The prediction panel (the run's own plan, memory/predict: predict) is
:mod:`lora_gui.ui.tabs.train_prediction_handlers`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lora_gui.config import ConfigError, RunConfig, diff_from_defaults
from lora_gui.engine.core.rundir import RUN_FILES, load_run_config
from lora_gui.errors import clip
from lora_gui.ui import charts, common, forms, gpu_share, live
from lora_gui.ui.input_checks import one_line
from lora_gui.ui.run_status import status_line  # the status the timer shows (read here by tests)
from lora_gui.units import GB, gb

START_NEW, START_OVERWRITE, START_RESUME = "new", "overwrite", "resume"


def form_values(preset: str) -> dict[str, Any]:
    """Every setting's value for a preset (preset over the defaults); without a budget in the
    preset, the budget is this GPU's memory (or the simulated default without a GPU)."""
    values = common.preset_config(preset).to_dict()
    values["budget_gb"] = values["budget_gb"] or common.default_budget_gb()
    return values


def config_from_form(values: dict[str, Any]) -> tuple[RunConfig | None, dict[str, str]]:
    """(validated config, {setting: message}); messages go next to their fields."""
    return forms.validate(values)


def differs_from_preset(preset: str, values: dict[str, Any], card: str | None = None) -> str:
    """One line naming the settings that differ from the preset (a card's budget included when
    the budget is the card's)."""
    try:
        base = form_values(preset)
    except (ValueError, *common.USER_ERRORS):
        return ""
    card_budget = common.card_budget_gb(card)
    changed = []
    for name, value in values.items():
        if name not in base or _same(value, base[name]):
            continue
        if name == "budget_gb" and card_budget is not None and _same(value, card_budget):
            changed.append(f"budget_gb = {value:g} (card {card})")
            continue
        changed.append(f"{name} = {value!r}" if isinstance(value, str) else f"{name} = {value}")
    if not changed:
        return f"Settings as in the preset **{preset}**."
    return f"Differs from the preset **{preset}**: " + ", ".join(changed)


def _same(a: Any, b: Any) -> bool:
    """Form values equal as settings (a number field gives 8.0 for the preset's 8)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return (a if a is not None else "") == (b if b is not None else "")


def image_kind(task: str, model: str) -> str | None:
    """The image pipeline ('sd', 'sdxl', 'sd3', 'flux') of a built-in or local model, read from
    its model_index.json; None for text runs and for Hub ids (not looked up: no network), and
    then every image setting shows."""
    from lora_gui.errors import UserError
    from lora_gui.models.diffusion import BUILTIN_DIFFUSION_DIR, BUILTIN_DRAWING_DIR, pipeline_kind

    if task != "image" or not model:
        return None
    from lora_gui.ui import paths

    local = {"builtin": BUILTIN_DIFFUSION_DIR, "builtin:drawing": BUILTIN_DRAWING_DIR}.get(model)
    if local is None and not paths.is_allowed(model):  # the form marks the field when validated
        return None
    folder = Path(local if local is not None else Path(model).expanduser())
    if not (folder / "model_index.json").is_file():
        return None
    try:
        return pipeline_kind(str(folder))
    except (UserError, OSError, ValueError):
        return None


def check_processes(processes: Any, task: str) -> int:
    """The processes field: 1 to the GPU count, for text and image runs alike."""
    try:
        n = int(processes or 1)
    except (TypeError, ValueError):
        raise ConfigError(f"processes: {clip(processes)} is not a whole number") from None
    if n < 1 or (n > 1 and n > common.gpu_count()):
        raise ConfigError(f"processes: {n}; this machine shows {common.gpu_count()} GPU(s): "
                          f"use 1 to {max(1, common.gpu_count())}")
    return n


def holds_run(out: Path) -> bool:
    return out.is_dir() and any((out / name).exists() for name in RUN_FILES)


def start(run_name: str, processes: Any, values: dict[str, Any], how: str = START_NEW,
          sharing: str = gpu_share.REPLICATED) -> tuple[str, dict[str, str], bool]:
    """Start / Overwrite / Resume. Returns (message, {setting: message}, ask to confirm).
    ``sharing``: how several processes share the model (:mod:`lora_gui.ui.gpu_share`).

    A folder that holds another run is refused until the user picks overwrite or resume (as
    the CLI's --overwrite / --resume)."""
    try:
        out = common.runs_root() / common.check_run_name(run_name)
        if how == START_RESUME:
            cfg = load_run_config(out)
            n = check_processes(processes, cfg.task)
            parallel = gpu_share.parallel_from_form(n, sharing, "processes")
            gpu_share.check_for_run(parallel, cfg.task, cfg.quantization)
            job = common.MANAGER.start(cfg, out, resume=True, processes=n, fsdp=parallel.fsdp,
                                       offload=parallel.offload)
            return f"Resuming **{job.name}** → `{job.out}`", {}, False
        cfg, errors = config_from_form(values)
        if cfg is None:
            return "Error: not started; fix the setting marked ⚠ (nothing was written).", errors, False
        n = check_processes(processes, cfg.task)
        parallel = gpu_share.parallel_from_form(n, sharing, "processes")
        gpu_share.check_for_run(parallel, cfg.task, cfg.quantization)
        if how == START_NEW and holds_run(out):
            return (f"`{out}` holds another run. Overwrite it, resume it, or pick another run "
                    "name.", {}, True)
        job = common.MANAGER.start(cfg, out, overwrite=how == START_OVERWRITE, processes=n,
                                   fsdp=parallel.fsdp, offload=parallel.offload)
    except common.USER_ERRORS as err:
        return f"Error: {err}", {}, False
    on = f" on {parallel.label()} (accelerate launch)" if n > 1 else ""
    return f"Started **{job.name}** ({cfg.task}){on} → `{job.out}`", {}, False


def stop() -> str:
    return common.MANAGER.stop()


def save_as_preset(name: str, values: dict[str, Any], note: str = "") -> str:
    """Writes the form's settings that differ from the defaults as presets/NAME.yaml."""
    import yaml

    from lora_gui.ui.tabs.presets_handlers import save_preset

    cfg, errors = config_from_form(values)
    if cfg is None:
        return "Error: " + "; ".join(errors.values())
    comment = (note or "").strip() or "Saved from the Train tab."
    body = yaml.safe_dump(diff_from_defaults(cfg), sort_keys=False) if diff_from_defaults(cfg) else ""
    text = f"# {comment}\n{body}"
    if not body:
        return "Error: these settings are the defaults; change one before saving a preset"
    return save_preset(name, text)


# -- live charts -------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


NO_TRAINING = "No training yet. Pick a preset and press Start."


def idle_status(job: Any) -> str:
    """The status while no training job is held: none yet, or other work (a comparison) running
    or ended, named, so the line never says "no training" beside a job the page just started."""
    if job is None:
        return NO_TRAINING
    state = "running" if job.running else job.status
    return f"No training yet: **{job.name}** ({job.kind}) is {state}; see its tab."


def status_text() -> str:
    """The status line as the next timer tick shows it (Start shows it at once)."""
    job = common.MANAGER.job
    if job is None or job.kind != "training":
        return idle_status(job)
    records, _ = job.snapshot()
    return _job_status(job, records)


CHARTS = live.SharedView(keep=8)  # the live charts of each job state, shared by every open page
TEXTS = live.SharedView()  # the events log and the sample pictures of each job state


def chart_keys(job: Any, smoothing: float) -> tuple[tuple, tuple]:
    """What the live charts depend on: (memory over time: the job, its counts of memory samples
    and phases, its planned peak; the per-step charts: the job, its count of records, planned
    peak and the smoothing). Counts only: O(1), whatever the run's length."""
    if job is None or job.kind != "training":
        return ("no job",), ("no job", smoothing)
    return ((id(job), job.started, len(job.samples), len(job.phases), job.predicted_bytes),
            (id(job), job.started, len(job.records), job.predicted_bytes, smoothing))


def _timeline(job: Any) -> tuple[charts.Spec]:
    """(memory over time,) of the job, as (traces, layout)."""
    if job is None or job.kind != "training":
        return (charts.timeline_spec([], []),)
    samples, phases = job.memory_snapshot()
    budget = int(job.cfg.budget_gb * GB) or None
    simulated = common.gpu_total_gb() is None
    return (charts.timeline_spec(samples, phases, budget, job.predicted_bytes, simulated),)


def _step_charts(job: Any, smoothing: float) -> tuple[charts.Spec, charts.Spec, charts.Spec]:
    """(peak per step, loss, throughput) of the job, each as (traces, layout)."""
    if job is None or job.kind != "training":
        empty: list[dict] = []
        return charts.memory_spec(empty), charts.loss_spec(empty), charts.throughput_spec(empty)
    records, _ = job.snapshot()
    budget = int(job.cfg.budget_gb * GB) or None
    return (charts.memory_spec(records, budget, job.predicted_bytes, common.gpu_total_gb() is None),
            charts.loss_spec(records, smoothing), charts.throughput_spec(records))


def _as_figures(part: str, key: tuple, specs: tuple) -> tuple:
    return tuple(charts.figure(*spec) for spec in specs)


def live_charts(smoothing: float = 0.0, finish: Callable[[str, tuple, tuple], Any] = _as_figures,
                ) -> tuple[tuple[tuple, Any], tuple[tuple, Any]]:
    """((key, ``finish("timeline", key, (memory over time,))``), (key, ``finish("steps", key, (peak
    per step, loss, throughput))``)) of the current job, each chart given to ``finish`` as (traces,
    layout) (by default made into Plotly figures). Each is built once per key for every page
    (``finish`` once too); the curves are extended by the new records only
    (lora_gui.ui.history) and downsampled to at most MAX_POINTS."""
    job = common.MANAGER.job
    smoothing = float(smoothing or 0.0)
    timeline_key, steps_key = chart_keys(job, smoothing)
    timeline = CHARTS.get(("timeline", timeline_key, finish),  # by finish too: figures or views
                          lambda: finish("timeline", timeline_key, _timeline(job)))
    steps = CHARTS.get(("steps", steps_key, finish),
                       lambda: finish("steps", steps_key, _step_charts(job, smoothing)))
    return (timeline_key, timeline), (steps_key, steps)


def live_status() -> tuple[str, str]:
    """(status line, events log) of the current job."""
    job = common.MANAGER.job
    if job is None or job.kind != "training":
        return idle_status(job), ""

    def log() -> str:
        events = list(job.events)  # a copy: the follower appends to it
        return "\n".join(time.strftime("%H:%M:%S ", time.localtime(e["time"])) + e["event"] for e in events)

    return _job_status(job, job.records), TEXTS.get(("log", id(job), len(job.events)), log)


def _job_status(job: Any, records: list[dict]) -> str:
    done = records[-1]["step"] if records else 0
    status = status_line(job, done, records=records)
    if job.predicted_bytes:
        status += f" · planned peak {gb(job.predicted_bytes)} (predicted)"
    if job.error:
        status += f"\n\nError: {one_line(job.error)}"
    if job.summary and job.status in ("completed", "stopped", "out_of_memory"):
        s = job.summary
        status += (f"\n\nAdapter: `{s['adapter']}` · eval loss {_fmt(s['eval_loss'], '.3f')} "
                   f"(base {_fmt(s['base_eval_loss'], '.3f')}) · steps {s['steps']} · peak "
                   f"{gb(s['peak_bytes'] or None)} ({s['memory_source']})")
        if s.get("message"):
            status += f"\n\n{s['message']}"
    return status


def poll(smoothing: float = 0.0) -> tuple[Any, Any, Any, Any, str, str]:
    """The timer's tick: figures and status of the current training job (full history, so a
    reloaded page re-attaches with everything; long histories are downsampled)."""
    (_, (timeline,)), (_, (step_peak, loss, throughput)) = live_charts(smoothing)
    return (timeline, step_peak, loss, throughput, *live_status())


SAMPLE_SUFFIXES = (".png", ".mp4")  # an image run's pictures, a video run's clips (the gallery plays them)


def sample_gallery() -> list[str]:
    """Samples of the current training job (runs/NAME/samples/*.png, or a video run's *.mp4),
    listed again only when the folder changed."""
    job = common.MANAGER.job
    if job is None or job.kind != "training":
        return []
    folder = job.out / "samples"
    try:
        stamp = folder.stat().st_mtime_ns
    except OSError:
        return []
    return TEXTS.get(("samples", id(job), stamp),
                     lambda: sorted(str(p) for p in folder.iterdir() if p.suffix in SAMPLE_SUFFIXES))


UPLOAD_DIR = Path("runs") / "uploads"


def use_upload(file_path: str | None) -> tuple[str | None, str]:
    """Copies an uploaded data file under runs/uploads/; returns (new data value or None, message)."""
    import shutil

    from lora_gui.data.text import DataError, load_documents

    if not file_path:
        return None, "Error: no file was uploaded"
    src = Path(file_path)
    if src.stat().st_size == 0:
        return None, f"Error: {src.name} is empty"
    try:
        docs = load_documents(src)
    except DataError as err:
        return None, f"Error: {err}"
    from lora_gui.errors import cut
    from lora_gui.ui.paths import free_upload_name

    dest, same = free_upload_name(common.runs_root() / "uploads", src)
    if not same:  # never over an earlier upload: a new name when the contents differ
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    kept = " (the same file was uploaded before)" if same else (
        f" (saved as {dest.name}: an earlier upload has that name)" if dest.name != src.name else "")
    return str(dest), f"Uploaded {cut(src.name)}: {len(docs)} documents{kept}"
