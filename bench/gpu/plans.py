"""Plans for the GPU check, computed once on a CPU and carried to the GPU machine.

A lent GPU machine has minutes, not hours: the traces behind each row of ``bench.gpu.check``
(an 8B model at 90k tokens takes minutes to trace) are computed here first with
``python -m bench.gpu.check --plan-only --plans FILE`` and read back there with ``--plans FILE``.
The plans are the planner's own (the same functions, the same settings); the torch on the GPU
machine may be another version than the one that traced them, and the check's output says which
each side used. A key missing from the file is traced on the spot, and so is every key of a file
written by another version of the planner (``meta.planner``: a hash of lora_gui/memory/predict
and of lora_gui/models, whose layers the traces run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.docs.meta import stamp
from lora_gui.memory.predict.trace_result import TraceResult

log = logging.getLogger(__name__)
_PLANS: dict[str, Any] = {}
_META: dict[str, Any] = {}
_PACKAGE = Path(__file__).resolve().parents[2] / "lora_gui"
_PLANNED_BY = (_PACKAGE / "memory" / "predict", _PACKAGE / "models")  # the traces run both


def planner_fingerprint() -> str:
    """A hash of the prediction package's source and of the model layers its traces run (lean
    layers, autocast, fused LoRA, checkpointing): plans from other code are not this planner's."""
    digest = hashlib.sha256()
    for path in sorted(p for folder in _PLANNED_BY for p in folder.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


# the source this process runs (taken when it starts): a plan saved after the files changed must
# not carry the new files' fingerprint
_RUNNING = planner_fingerprint()
_COMMIT = stamp()["commit"]  # the commit checked out then (+dirty: its planner files were changed)


def load(path: Path) -> None:
    """Reads precomputed plans (``--plans``); keys not in the file are traced when asked."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("meta", {}).get("planner") != _RUNNING:
        log.warning("%s was written by another version of the planner: every plan is traced again", path)
        print(f"[gpu_plans] {path}: stale (planner changed since), tracing every plan again", flush=True)
        return
    _META.update(data.get("meta", {}))
    for key, value in data["plans"].items():
        _PLANS[key] = TraceResult(**value["trace"]) if "trace" in value else value["value"]


def save(path: Path) -> None:
    """Writes every plan computed or read so far, with the torch version that traced them."""
    plans = {key: ({"trace": dataclasses.asdict(v)} if isinstance(v, TraceResult) else {"value": v})
             for key, v in _PLANS.items()}
    meta = {"torch": _META.get("torch", torch.__version__), "planner": _RUNNING, "commit": _COMMIT}
    path.write_text(json.dumps({"meta": meta, "plans": plans}, indent=1, default=str), encoding="utf-8")


def traced_with() -> str:
    """The torch version the plans were traced with (this one's when none were read)."""
    return _META.get("torch", torch.__version__)


def planned(key: str, compute: Callable[[], Any]) -> Any:
    """The plan stored under ``key``, computed (and kept) when there is none. A value that is
    not a TraceResult must be JSON-serialisable."""
    if key not in _PLANS:
        _PLANS[key] = compute()
    return _PLANS[key]
