"""Atomic checkpoints: a crash or Ctrl-C at any moment leaves the last good checkpoint intact.

Layout under ``<run>/checkpoints/``: ``step-00000040/`` folders (adapter weights, optimizer and
scheduler state, RNG state, trainer state) and a ``latest`` file naming the newest complete one.
A checkpoint is written into a hidden temp folder, fsynced, renamed into place (atomic on POSIX),
and only then is ``latest`` replaced (write temp + ``os.replace``, also atomic). Older
checkpoints beyond ``keep`` are removed after that, never before.

A checkpoint is read without unpickling objects: ``state.pt`` holds only tensors, numbers, text,
lists, tuples and dicts (the optimizer's and scheduler's state dicts and the RNG states), and is
loaded with ``torch.load(weights_only=True)``, torch's allow-list of exactly those types. A run
folder copied in from elsewhere cannot run code on Resume: a file holding anything else is
refused with a message. Checkpoints written before this rule hold the same types and load as
they are (nothing to convert).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from lora_gui.errors import UserError

LATEST = "latest"


class CheckpointError(UserError, ValueError):
    """A checkpoint's file holds something other than a checkpoint's data; the message names it."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replaces a small text file atomically (temp file in the same folder + os.replace)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def lora_state_dict(model) -> dict[str, torch.Tensor]:
    """The adapter's tensors in peft's naming, read from the trainable parameters only (under
    FSDP the full ``model.state_dict()`` would touch every sharded frozen weight), plus a frozen
    ``lora_A`` (LoRA-FA keeps A at its random init: a resume must get the same A back)."""
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad or ".lora_A." in n}
    from peft import get_peft_model_state_dict  # peft loads transformers: ~6 s, only when saving

    return get_peft_model_state_dict(model, state_dict=trainable)


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, trainer_state: dict,
                    keep: int = 2) -> Path:
    """Writes checkpoint ``step`` atomically and points ``latest`` at it."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-step-{step:08d}-"))
    adapter = {k: v.detach().cpu().contiguous() for k, v in lora_state_dict(model).items()}
    save_file(adapter, tmp / "adapter.safetensors")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng_state()}, tmp / "state.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1), encoding="utf-8")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # re-saving the same step (resume then stop at once): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    write_atomic(root / LATEST, final.name)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):  # left by a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    pointer = run_dir / "checkpoints" / LATEST
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text(encoding="utf-8").strip()
    return path if (path / "trainer_state.json").is_file() else None


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's contents: ``adapter`` tensors, ``state`` (optimizer, scheduler, RNG) and
    ``trainer`` state (read once by the main process, then broadcast to the other ranks)."""
    return {"adapter": load_file(path / "adapter.safetensors"),
            "state": read_state(path / "state.pt"),
            "trainer": json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))}


def read_state(path: Path) -> dict[str, Any]:
    """``state.pt`` (optimizer, scheduler, RNG) read with torch's allow-list of plain types.

    Raises:
        CheckpointError: the file holds other objects (they are never built: no code runs).
    """
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path}: holds objects other than tensors, numbers and text, so it is not read (reading "
            "it could run code); resume from an earlier checkpoint or start the run again") from None
    if not isinstance(state, dict) or not {"optimizer", "scheduler", "rng"} <= set(state):
        raise CheckpointError(f"{path}: not a checkpoint's training state (optimizer, scheduler, RNG)")
    return state


def restore_training_state(contents: dict[str, Any], optimizer, scheduler) -> dict:
    """Optimizer, scheduler and RNG state from :func:`read_checkpoint`; returns the trainer state."""
    optimizer.load_state_dict(contents["state"]["optimizer"])
    scheduler.load_state_dict(contents["state"]["scheduler"])
    set_rng_state(contents["state"]["rng"])
    return contents["trainer"]


def load_checkpoint(path: Path, model, optimizer, scheduler) -> dict:
    """Restores adapter, optimizer, scheduler and RNG state; returns the trainer state."""
    contents = read_checkpoint(path)
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, contents["adapter"])
    return restore_training_state(contents, optimizer, scheduler)
