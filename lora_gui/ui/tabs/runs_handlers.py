"""Runs tab handlers: list the runs under runs/, open one's charts, overlay several, resume one,
delete one. Reads only the files a run leaves (config.json, run.json, metrics.jsonl,
memory.jsonl, events.jsonl, trackers.json)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from lora_gui.engine.core.lock import LOCK_FILE
from lora_gui.engine.core.records import read_records
from lora_gui.engine.core.rundir import RunDirError, load_run_config
from lora_gui.engine.core.runstate import folder_state
from lora_gui.engine.core.trackers import open_commands, read_tracker_info
from lora_gui.ui import charts, common
from lora_gui.ui.series import downsample, ema
from lora_gui.units import GB, gb_value

# "trained s": the training time run.json keeps, the same the Train tab's status shows at the end
RUN_COLUMNS = ("run", "status", "task", "mode", "peak GB", "peak source", "eval loss", "trained s",
               "why it failed")
OVERLAY_RUNS = (2, 4)  # how many runs an overlay compares


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}


def run_folders() -> list[Path]:
    root = common.runs_root()
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if (p / "config.json").is_file()),
                  key=lambda p: p.stat().st_mtime, reverse=True)


def _status(folder: Path, summary: dict[str, Any]) -> str:
    job = common.MANAGER.job
    if job is not None and job.running and job.out.resolve() == folder.resolve():
        return job.status
    if summary.get("status") and not (folder / LOCK_FILE).exists():
        return summary["status"]
    # no summary, or a writer lock: another process writes here now, or one died from outside
    return folder_state(folder).status


def _reason(folder: Path, status: str, summary: dict[str, Any]) -> str:
    """A failed run's reason in one line (run.json's error, else what the folder shows)."""
    if status != "failed":
        return ""
    text = summary.get("error") or folder_state(folder).message
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    while line.lower().startswith("error:"):
        line = line[len("error:"):].strip()
    # a file by its name (no folders): the row stays short enough to read
    return re.sub(r"(?:~|\.{1,2})?(?:/[^/\s:]+)+/(?=[^/\s:]+)", "", line)


def list_runs() -> list[list[Any]]:
    """One row per run folder, newest first (status, task, mode, peak with its source..., and
    a failed run's reason)."""
    rows = []
    for folder in run_folders():
        cfg, summary = _read_json(folder / "config.json"), _read_json(folder / "run.json")
        peak, status = summary.get("peak_bytes"), _status(folder, summary)
        rows.append([folder.name, status, cfg.get("task", "text"), cfg.get("mode"),
                     gb_value(peak) if peak else None, summary.get("memory_source"),
                     round(summary["eval_loss"], 4) if summary.get("eval_loss") is not None else None,
                     round(summary.get("train_seconds") or 0) or None, _reason(folder, status, summary)])
    return rows


def run_names() -> list[str]:
    return [p.name for p in run_folders()]


def _folder(name: str) -> Path:
    folder = common.runs_root() / common.check_run_name(name)
    if not (folder / "config.json").is_file():
        raise RunDirError(f"{folder}: not a run folder (no config.json)")
    return folder


def open_run(name: str, smoothing: float = 0.0) -> tuple[str, Any, Any, Any, Any]:
    """(message, memory per step, loss, throughput, memory over time) of one run."""
    try:
        folder = _folder(name)
    except common.USER_ERRORS as err:
        return f"Error: {err}", None, None, None, None
    records = read_records(folder / "metrics.jsonl")
    summary = _read_json(folder / "run.json")
    budget, predicted = summary.get("budget_bytes"), summary.get("predicted_peak_bytes")
    samples = read_records(folder / "memory.jsonl")
    phases = [(e["phase"], e["time"]) for e in read_records(folder / "events.jsonl")
              if e.get("event") == "phase"]
    text = f"**{name}**: {len(records)} steps, {_status(folder, summary)}"
    if not summary.get("status") or (folder / LOCK_FILE).exists():
        text += f"\n\n{folder_state(folder).message}"  # e.g. killed from outside: where to resume
    trackers = open_commands(read_tracker_info(folder))
    if trackers:  # report_to: where each tracker's data is and the command that opens it
        text += "\n\nExperiment trackers:\n" + "\n".join(f"- `{line}`" for line in trackers)
    return (text, charts.memory_figure(records, budget, predicted), charts.loss_figure(records, smoothing),
            charts.throughput_figure(records), charts.memory_timeline(samples, phases, budget, predicted))


def _line(name: str, records: list[dict], key: str, smoothing: float = 0.0, scale: float = 1.0,
          **extra: Any) -> go.Scatter:
    rows = [r for r in records if r.get(key) is not None]
    ys = [r[key] / scale for r in rows]
    if smoothing and ys:
        ys = ema(ys, smoothing)
    xs, ys = downsample([r["step"] for r in rows], ys)
    return go.Scatter(x=xs, y=ys, mode="lines", name=name, **extra)


def _overlay(runs: dict[str, list[dict]], key: str, title: str, unit: str, smoothing: float = 0.0,
             scale: float = 1.0) -> go.Figure:
    from lora_gui.ui import chart_style

    fig = go.Figure([_line(name, records, key, smoothing, scale) for name, records in runs.items()])
    axis = chart_style.MEMORY_AXIS if key == "peak_bytes" else {}
    rows = max(1, -(-len(runs) // 2))  # legend entries (run names), two a line
    fig.update_layout(**chart_style.legend_below({
        "title": chart_style.title(title), "xaxis": {"title": {"text": "step"}},
        "yaxis": {"title": {"text": unit}, **axis}, "height": 320 + 20 * rows,
        "margin": {"l": 55, "r": 20, "t": 40, "b": 40}}, rows))
    return fig


SPEED_KEYS = {"tokens_per_s": "tokens/s (text runs)", "images_per_s": "images/s (image runs)"}


def _speed_key(records: list[dict]) -> str | None:
    """The throughput column a run's records carry (text: tokens/s, image: images/s)."""
    return next((k for k in SPEED_KEYS for r in records if r.get(k) is not None), None)


def speed_overlay(runs: dict[str, list[dict]]) -> tuple[go.Figure, str]:
    """Every run's throughput curve, each in its own unit: text runs' tokens/s on the left axis,
    image runs' images/s on a right axis when both kinds are overlaid. Returns (figure, a note
    saying so, and naming any run without throughput records)."""
    keys = {name: _speed_key(records) for name, records in runs.items()}
    used = [k for k in SPEED_KEYS if k in keys.values()]
    fig = go.Figure()
    for name, records in runs.items():
        if keys[name] is not None:
            axis = "y2" if len(used) == 2 and keys[name] == used[1] else "y"
            fig.add_trace(_line(f"{name} ({SPEED_KEYS[keys[name]].split()[0]})", records, keys[name],
                                yaxis=axis))
    layout: dict[str, Any] = {"title": "Throughput", "xaxis_title": "step", "height": 320,
                              "yaxis_title": SPEED_KEYS[used[0]] if used else "",
                              "margin": {"l": 50, "r": 50, "t": 40, "b": 40}}
    notes = []
    if len(used) == 2:
        layout["yaxis2"] = {"title": {"text": SPEED_KEYS[used[1]]}, "overlaying": "y", "side": "right"}
        notes.append(f"throughput: {SPEED_KEYS[used[0]]} on the left axis, {SPEED_KEYS[used[1]]} "
                     "on the right (different units)")
    missing = [name for name, key in keys.items() if key is None]
    if missing:
        notes.append(f"no throughput recorded yet for {', '.join(missing)}")
    from lora_gui.ui import chart_style

    fig.update_layout(**chart_style.legend_below(layout, max(1, -(-len(runs) // 2))))
    return fig, "; ".join(notes)


def overlay(names: list[str] | None, smoothing: float = 0.0, most: int = OVERLAY_RUNS[1],
            ) -> tuple[str, Any, Any, Any]:
    """(message, memory, loss, throughput) with one line per run, for 2 to ``most`` runs (a
    sweep's overlay draws more than the picker's 4)."""
    names = list(names or [])
    low, high = OVERLAY_RUNS[0], most
    if not low <= len(names) <= high:
        return f"Error: pick {low} to {high} runs to overlay (picked {len(names)})", None, None, None
    try:
        runs = {n: read_records(_folder(n) / "metrics.jsonl") for n in names}
    except common.USER_ERRORS as err:
        return f"Error: {err}", None, None, None
    sources = sorted({str(r[-1].get("memory_source")) for r in runs.values() if r})
    speed, note = speed_overlay(runs)
    return (f"Overlay of {', '.join(names)}" + (f"\n\n{note[0].upper()}{note[1:]}." if note else ""),
            _overlay(runs, "peak_bytes", "Peak memory per step", f"GB ({', '.join(sources) or 'no data'})",
                     scale=GB),
            _overlay(runs, "loss", "Loss", "loss", smoothing), speed)


def resume_run(name: str) -> str:
    try:
        folder = _folder(name)
        job = common.MANAGER.start(load_run_config(folder), folder, resume=True)
    except common.USER_ERRORS as err:
        return f"Error: {err}"
    return f"Resuming **{job.name}** (follow it on the Train tab)"


def delete_run(name: str, confirmed: bool) -> str:
    """Deletes runs/NAME after the user confirmed; never the folder of the running job."""
    try:
        folder = _folder(name)
    except common.USER_ERRORS as err:
        return f"Error: {err}"
    if not confirmed:
        return f"Delete `{folder}` and everything in it (adapter, checkpoints, charts)? Confirm below."
    job = common.MANAGER.job
    if job is not None and job.running and job.out.resolve() == folder.resolve():
        return f"Error: {name} is running; stop it first"
    shutil.rmtree(folder)
    return f"Deleted `{folder}`"
