"""Plans for the GPU check, computed once on a CPU and carried to the GPU machine.

A lent GPU machine has minutes, not hours: the traces behind each row of ``bench.gpu_check``
(an 8B model at 90k tokens takes minutes to trace) are computed here first with
``python -m bench.gpu_check --plan-only --plans FILE`` and read back there with ``--plans FILE``.
The plans are the planner's own (the same functions, the same settings); the torch on the GPU
machine may be another version than the one that traced them, and the check's output says which
each side used. A key missing from the file is traced on the spot.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lora_gui.memory.predict.trace_result import TraceResult

_PLANS: dict[str, Any] = {}
_META: dict[str, Any] = {}


def load(path: Path) -> None:
    """Reads precomputed plans (``--plans``); keys not in the file are traced when asked."""
    data = json.loads(path.read_text(encoding="utf-8"))
    _META.update(data.get("meta", {}))
    for key, value in data["plans"].items():
        _PLANS[key] = TraceResult(**value["trace"]) if "trace" in value else value["value"]


def save(path: Path) -> None:
    """Writes every plan computed or read so far, with the torch version that traced them."""
    plans = {key: ({"trace": dataclasses.asdict(v)} if isinstance(v, TraceResult) else {"value": v})
             for key, v in _PLANS.items()}
    meta = {"torch": _META.get("torch", torch.__version__)}
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
