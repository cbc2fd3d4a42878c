"""The run folder contract: what a run leaves, and the rules for reusing a folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core.checkpoint import write_atomic
from lora_gui.engine.core.lock import RunDirError, acquire_run_folder, release_run_folder
from lora_gui.errors import clip

__all__ = ["RunDirError", "prepare_run_dir", "run_folder", "save_run_config", "load_run_config"]

RUN_FILES = ("adapter", "checkpoints", "metrics.jsonl", "events.jsonl", "memory.jsonl", "run.json",
             "config.json", "trackers.json", "tensorboard")


RUN_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
# the app's own entries beside the run folders: never a run name, so "delete run" or an
# overwrite can never reach them (hidden names: .launch, .queue; queue.json and its aside copies)
RESERVED_NAMES = ("uploads", "presets", "trackio", "queue.json")


def run_folder(root: Path, name: str) -> Path:
    """``root/name`` for a run name typed by a user: one path segment of letters, digits, '.',
    '_' or '-' (at most 100), never '.' or '..', so a run stays inside ``root``.

    Raises:
        RunDirError: naming the refused name.
    """
    name = str(name).strip()
    if not RUN_NAME.fullmatch(name) or name in (".", ".."):
        raise RunDirError(f"run name {clip(name)}: use one name of letters, digits, '.', '_' or '-' "
                          "(no '/', no '..', at most 100 characters)")
    lower = name.lower()
    if name.startswith(".") or any(lower == r or lower.startswith(f"{r}.") for r in RESERVED_NAMES):
        raise RunDirError(f"run name {clip(name)}: names starting with '.' and "
                          f"{', '.join(RESERVED_NAMES)} are the app's own folders; pick another")
    return Path(root) / name


def prepare_run_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Takes the folder's writer lock, then refuses a folder holding another run unless
    --resume or --overwrite says what to do. The lock is released by the caller's
    :func:`lora_gui.engine.core.lock.releases_run_folder` (here too when the folder is refused).
    """
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other")
    if resume and not (out / "config.json").is_file():
        raise RunDirError(f"{out}: nothing to resume (no config.json from an earlier run)")
    acquire_run_folder(out)  # before anything is written; refuses while another writer lives
    if resume:
        return
    holds_run = any((out / name).exists() for name in RUN_FILES)
    if holds_run and not overwrite:
        release_run_folder(out)
        raise RunDirError(f"{out}: holds another run; pass --resume to continue it or "
                          "--overwrite to replace it")
    if holds_run:
        for name in RUN_FILES:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    out.mkdir(parents=True, exist_ok=True)


def save_run_config(out: Path, cfg: RunConfig) -> None:
    write_atomic(out / "config.json", json.dumps(cfg.to_dict(), indent=1))


RESUMABLE_OVERRIDES = {"max_steps", "epochs", "checkpoint_every", "budget_gb"}


def load_run_config(out: Path, overrides: dict | None = None) -> RunConfig:
    """The config a run was started with; only settings that keep the data order may change."""
    path = out / "config.json"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(f"{out}: nothing to resume (no config.json from an earlier run)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not a readable run config ({err}); the folder was left as it "
                          "is") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: expected a JSON object of settings, got {type(saved).__name__}")
    changed = set(overrides or {}) - RESUMABLE_OVERRIDES
    if changed:
        raise ConfigError(f"--resume: cannot change {', '.join(sorted(changed))} of a started run "
                          f"(allowed: {', '.join(sorted(RESUMABLE_OVERRIDES))})")
    return apply_overrides(RunConfig(), {**saved, **(overrides or {})}, where=str(path))
