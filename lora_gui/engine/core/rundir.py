"""The run folder contract: what a run leaves, and the rules for reusing a folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core.checkpoint import write_atomic
from lora_gui.errors import UserError

RUN_FILES = ("adapter", "checkpoints", "metrics.jsonl", "events.jsonl", "memory.jsonl", "run.json",
             "config.json")


class RunDirError(UserError, ValueError):
    """The output folder cannot be used as asked; nothing in it was changed."""


def prepare_run_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuses a folder holding another run unless --resume or --overwrite says what to do."""
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other")
    holds_run = out.is_dir() and any((out / name).exists() for name in RUN_FILES)
    if resume:
        if not (out / "config.json").is_file():
            raise RunDirError(f"{out}: nothing to resume (no config.json from an earlier run)")
        return
    if holds_run and not overwrite:
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
    saved = json.loads((out / "config.json").read_text(encoding="utf-8"))
    changed = set(overrides or {}) - RESUMABLE_OVERRIDES
    if changed:
        raise ConfigError(f"--resume: cannot change {', '.join(sorted(changed))} of a started run "
                          f"(allowed: {', '.join(sorted(RESUMABLE_OVERRIDES))})")
    return apply_overrides(RunConfig(), {**saved, **(overrides or {})}, where=str(out / "config.json"))
