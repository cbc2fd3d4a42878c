"""Experiment trackers (``report_to``): every metrics.jsonl record forwarded to TensorBoard,
trackio, MLflow or Weights & Biases through accelerate's tracker classes, from the main process.

- Offline by default: TensorBoard writes ``<run>/tensorboard`` (or ``<tracker_dir>/<run>``).
  trackio keeps one SQLite store for many runs (its dashboard compares them) and reads its
  folder once per process, at import: the store is ``<tracker_dir>/trackio``, else
  ``TRACKIO_DIR``, else ``trackio/`` beside the run folder (``runs/trackio`` for ``runs/NAME``).
  MLflow and W&B only log where the user set them up (``MLFLOW_TRACKING_URI``; ``wandb login``
  or ``WANDB_MODE=offline``).
- :func:`check_trackers` runs before the run starts: a missing package or login is one line.
- ``<run>/trackers.json`` keeps where each tracker writes and its run id, so a resumed run
  continues the same tracker run (TensorBoard drops the steps after the resumed checkpoint).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import netrc
import os
import sys
from pathlib import Path
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.engine.core.checkpoint import write_atomic
from lora_gui.errors import UserError

log = logging.getLogger(__name__)

TRACKER_FILE = "trackers.json"
PROJECT = "lora_gui"  # trackio / W&B project and MLflow experiment the runs are logged under
PACKAGES = {"tensorboard": "tensorboard", "trackio": "trackio", "mlflow": "mlflow", "wandb": "wandb"}
SKIPPED_KEYS = ("step", "time")  # the step is the x axis; wall time is the trackers' own


class TrackerError(UserError, RuntimeError):
    """A tracker named in report_to cannot log (package missing, not logged in)."""


def _wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_trackers(cfg: RunConfig) -> None:
    """Refuses, in one line, a tracker of ``report_to`` whose package or set-up is missing.

    Raises:
        TrackerError: naming the tracker and what to install or set.
    """
    for name in cfg.trackers():
        package = PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise TrackerError(f"report_to: {name} needs the {package} package "
                               f"(pip install {package}), or drop it from report_to")
        if name == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
            raise TrackerError("report_to: mlflow needs MLFLOW_TRACKING_URI (your MLflow server, or "
                               "a local store such as sqlite:///mlflow.db)")
        if name == "wandb" and not _wandb_logged_in():
            raise TrackerError("report_to: wandb is not logged in; run `wandb login` (or set "
                               "WANDB_API_KEY, or WANDB_MODE=offline to log locally)")


def tracker_root(cfg: RunConfig, out: Path) -> Path:
    """Where TensorBoard and trackio data go: ``tracker_dir`` or the run folder."""
    return Path(cfg.tracker_dir).expanduser() if cfg.tracker_dir else Path(out)


def read_tracker_info(out: Path) -> dict[str, Any]:
    """``trackers.json`` of a run ({} when it logged to no tracker or the file is unreadable)."""
    try:
        info = json.loads((Path(out) / TRACKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def open_commands(info: dict[str, Any]) -> list[str]:
    """Per tracker: where its data is and the command that opens it (for the Runs tab)."""
    lines = []
    for name, entry in info.items():
        where = entry.get("dir") or entry.get("uri") or ""
        command = {"tensorboard": f"tensorboard --logdir {where}",
                   "trackio": f"TRACKIO_DIR={where} trackio show --project {entry.get('project')}",
                   "mlflow": f"mlflow ui --backend-store-uri {where}",
                   "wandb": f"wandb sync {where}" if entry.get("offline") else entry.get("url", "")}[name]
        lines.append(f"{name}: {where} -> {command}" if where else f"{name}: {command}")
    return lines


def _flat_config(values: dict[str, Any]) -> dict[str, Any]:
    """Hyperparameters as the trackers take them: bool, int, float or str."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in values.items()}


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    """A record's numbers; a per-rank list becomes ``key/0``, ``key/1``..."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in SKIPPED_KEYS or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out[key] = value
        elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            out.update({f"{key}/{i}": v for i, v in enumerate(value)})
    return out


_TRACKIO_DIR_SET: str | None = None  # the TRACKIO_DIR this module set (not the user's)


def _trackio_dir(cfg: RunConfig, out: Path) -> Path:
    """The trackio store of this run. trackio reads its folder once, at import: set it before
    that; a process that already writes elsewhere (the dashboard's earlier run under another
    folder) keeps writing there, and trackers.json records where."""
    global _TRACKIO_DIR_SET
    users = os.environ.get("TRACKIO_DIR") if os.environ.get("TRACKIO_DIR") != _TRACKIO_DIR_SET else None
    if cfg.tracker_dir:
        wanted = Path(cfg.tracker_dir).expanduser() / "trackio"
    else:
        wanted = Path(users or Path(out).parent / "trackio")
    if "trackio" not in sys.modules:
        os.environ["TRACKIO_DIR"] = _TRACKIO_DIR_SET = str(wanted)
    from trackio import utils

    if Path(utils.TRACKIO_DIR).resolve() != wanted.resolve():
        log.warning("trackio already writes to %s in this process; this run logs there too",
                    utils.TRACKIO_DIR)
    return Path(utils.TRACKIO_DIR)


def _build(name: str, cfg: RunConfig, out: Path, old: dict[str, Any],
           purge_step: int | None) -> tuple[Any, dict]:
    """One accelerate tracker, started, and what trackers.json keeps about it."""
    from accelerate import tracking

    run_name = Path(out).name
    root = tracker_root(cfg, out)
    if name == "tensorboard":
        folder = root / "tensorboard" if not cfg.tracker_dir else root / run_name
        tracker = tracking.TensorBoardTracker(folder.name, folder.parent, purge_step=purge_step)
        info = {"dir": str(folder)}
    elif name == "trackio":
        folder = _trackio_dir(cfg, out)
        tracker = tracking.TrackioTracker(PROJECT, name=old.get("name", run_name),
                                          resume="allow" if old else "never",  # never: a new run
                                          auto_log_cpu=False, auto_log_gpu=False)
        info = {"dir": str(folder), "project": PROJECT}
    elif name == "mlflow":
        tracker = tracking.MLflowTracker(PROJECT, run_id=old.get("run_id"), run_name=run_name)
        info = {"uri": os.environ.get("MLFLOW_TRACKING_URI", "")}
    else:
        tracker = tracking.WandBTracker(PROJECT, name=run_name, id=old.get("id"), resume="allow",
                                        dir=str(root))
        info = {"offline": os.environ.get("WANDB_MODE") == "offline"}
    tracker.start()
    if name == "trackio":
        info["name"] = tracker.run.name
    elif name == "mlflow":
        info["run_id"] = tracker.active_run.info.run_id
    elif name == "wandb":
        info.update(id=tracker.run.id, url=tracker.run.url or "", dir=str(tracker.run.dir))
    return tracker, info


def closing_values(summary: dict[str, Any]) -> dict[str, Any]:
    """The figures a run logs at its last step: held-out losses (text and image runs)."""
    return {k: summary.get(k) for k in ("eval_loss", "eval_loss_full_attention", "base_eval_loss")}


class Trackers:
    """The run's started trackers; :meth:`record` is the sink of metrics.jsonl."""

    def __init__(self, trackers: dict[str, Any]) -> None:
        self.trackers = trackers

    def log(self, values: dict[str, Any], step: int) -> None:
        """Numbers of ``values`` at ``step`` to every tracker. A tracker that fails (a server
        gone, a full disk) is dropped with a warning; training goes on."""
        scalars = _scalars(values)
        if scalars:
            for name, tracker in list(self.trackers.items()):
                try:
                    tracker.log(scalars, step=step)
                except Exception as err:  # a tracker's failure must not cost the run
                    log.warning("%s stopped logging at step %d: %s", name, step, err)
                    del self.trackers[name]

    def record(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl record (loss, lr, tokens or images per second, peak memory...)."""
        self.log(record, record["step"])

    def images(self, paths: list[Path], step: int) -> None:
        """Sample pictures (PNG files) to the trackers that take images."""
        if not paths:
            return
        import numpy as np
        from PIL import Image

        pictures = {f"samples/{i}": np.asarray(Image.open(p).convert("RGB")) for i, p in enumerate(paths)}
        for name, tracker in self.trackers.items():
            if name == "tensorboard":
                tracker.log_images({k: v[None] for k, v in pictures.items()}, step=step, dataformats="NHWC")
            elif name == "wandb":
                tracker.log_images({k: [v] for k, v in pictures.items()}, step=step)
            elif name == "trackio":
                import trackio

                tracker.log({k: trackio.Image(str(p)) for k, p in zip(pictures, paths)}, step=step)

    def finish(self, values: dict[str, Any], step: int) -> None:
        """Logs the run's closing figures (eval loss...) and closes every tracker."""
        self.log(values, step)
        for name, tracker in self.trackers.items():
            try:
                tracker.finish()
            except Exception as err:  # a tracker that fails to close must not lose the run
                log.warning("%s: could not close the tracker run: %s", name, err)


def open_trackers(cfg: RunConfig, out: Path, step: int, resume: bool, is_main: bool,
                  extra_config: dict[str, Any] | None = None) -> Trackers | None:
    """Starts the trackers of ``report_to`` on the main process; None when there are none.

    A fresh run stores its config (plus ``extra_config``) as hyperparameters; a resumed run
    reopens the tracker runs named in trackers.json and continues after ``step``.
    """
    names = cfg.trackers()
    if not names or not is_main:
        return None
    old = read_tracker_info(out) if resume else {}
    # TensorBoard drops the events of earlier writers from this step on: past the checkpoint a
    # resumed run restarts from, everything for a fresh run (a replaced run in tracker_dir)
    purge = step + 1 if resume and step else 0
    trackers, info = {}, {}
    for name in names:
        trackers[name], info[name] = _build(name, cfg, out, old.get(name, {}), purge)
        if not old.get(name):
            trackers[name].store_init_configuration(_flat_config({**cfg.to_dict(), **(extra_config or {})}))
    write_atomic(Path(out) / TRACKER_FILE, json.dumps(info, indent=1))
    log.info("logging to %s", ", ".join(open_commands(info)))
    return Trackers(trackers)
