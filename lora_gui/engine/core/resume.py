"""Resuming a run: the global sampler state, and refusing a checkpoint that does not belong.

The data order is a pure function of the sampler state ``(seed, epoch, global batch)`` and the
sample lengths, never of the number of processes: each rank takes its share of every global step
(:mod:`lora_gui.data.shard`). A checkpoint therefore stores the global step and what the order
depends on, and a run resumes at that step under any number of processes that can share the
global batch. What cannot be resumed is refused with a message, before anything in the folder
is written: a checkpoint whose data order no longer matches (the data file changed) or whose
adapter has other shapes (another model or LoRA config).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from peft import get_peft_model_state_dict

from lora_gui.config import ConfigError, RunConfig
from lora_gui.engine.core.checkpoint import latest_checkpoint, read_checkpoint

ORDER_KEYS = ("seed", "batch_size", "batching", "max_seq_len", "pad_multiple", "train_samples",
              "data_fingerprint")


def sampler_state(cfg: RunConfig, lengths: list[int]) -> dict[str, Any]:
    """What the global data order depends on (stored in every checkpoint's trainer state)."""
    digest = hashlib.sha1(",".join(map(str, lengths)).encode()).hexdigest()[:16]
    return {"seed": cfg.seed, "batch_size": cfg.batch_size, "batching": cfg.resolved_batching(),
            "max_seq_len": cfg.max_seq_len, "pad_multiple": cfg.pad_multiple,
            "train_samples": len(lengths), "data_fingerprint": digest}


def check_sampler(where: Path, saved: dict[str, Any] | None, now: dict[str, Any]) -> None:
    """Raises ConfigError naming what differs between the checkpoint's order and this run's."""
    if saved is None:  # checkpoints written before the sampler state was stored
        return
    changed = [k for k in ORDER_KEYS if k in saved and saved[k] != now[k]]
    if not changed:
        return
    detail = ", ".join(f"{k} {saved[k]!r} then, {now[k]!r} now" for k in changed)
    hint = (" (the data file changed since the run started; restore it or start a new run)"
            if {"train_samples", "data_fingerprint"} & set(changed) else "")
    raise ConfigError(f"{where}: checkpoint from an incompatible run: {detail}{hint}; nothing was "
                      "changed in the folder")


def check_adapter(where: Path, adapter: dict[str, Any], model) -> None:
    """Raises ConfigError when the checkpoint's LoRA tensors do not fit this run's model."""
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    saved = {k: tuple(v.shape) for k, v in adapter.items()}
    if saved == expected:
        return
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    wrong = sorted(k for k in set(saved) & set(expected) if saved[k] != expected[k])
    parts = [f"{len(missing)} LoRA tensors missing (e.g. {missing[0]})" if missing else "",
             f"{len(extra)} unknown (e.g. {extra[0]})" if extra else "",
             f"{wrong[0]} is {saved[wrong[0]]}, this model needs {expected[wrong[0]]}" if wrong else ""]
    raise ConfigError(f"{where}: checkpoint from an incompatible run (another model or LoRA "
                      f"config): {'; '.join(p for p in parts if p)}; nothing was changed in the folder")


def read_resume_checkpoint(out: Path, sampler: dict[str, Any], model) -> dict[str, Any] | None:
    """The newest checkpoint's contents after both checks, or None when there is none yet."""
    path = latest_checkpoint(out)
    if path is None:
        return None
    contents = read_checkpoint(path)
    check_sampler(path, contents["trainer"].get("sampler"), sampler)
    check_adapter(path, contents["adapter"], model)
    return contents
