"""What the benchmarks repeat: the order of the arms in each round, pinning torch's threads (and the
process's cores), results files stamped with the commit and planner fingerprint that made them, and
Markdown tables.

Imports nothing heavy at module level, so a bench that only writes tables needs no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench.docs.meta import ROOT, stamp
from bench.docs.render import grid

RESULTS = ROOT / "bench" / "results"  # every committed results file lives under this folder

T = TypeVar("T")


def round_order(arms: Sequence[T], round_index: int) -> list[T]:
    """The arms in the order round ``round_index`` (from 0) runs them: as given in even rounds,
    reversed in odd ones, so no arm always runs first or always follows the same one (a machine
    that warms up or gets busier during a round would otherwise favour one arm)."""
    return list(arms) if round_index % 2 == 0 else list(arms)[::-1]


def pin_threads(threads: int = 1, cpus: Iterable[int] | None = None) -> None:
    """Runs torch's CPU ops on ``threads`` threads (1: one core's work, the steadiest timing on a
    shared machine) and, when ``cpus`` is given, this process on those cores only (as ``taskset
    -c``; Linux only)."""
    import torch  # here, not at the top: the table-only benches run without torch

    torch.set_num_threads(threads)
    if cpus is not None:
        os.sched_setaffinity(0, set(cpus))


def stamped(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with ``meta`` first: the commit and planner fingerprint of this working tree
    (``bench.docs`` refuses a results file without them), then any ``meta`` the body brings."""
    rest = {k: v for k, v in body.items() if k != "meta"}
    return {"meta": {**stamp(), **body.get("meta", {})}, **rest}


def write_results(path: str | Path, body: dict[str, Any], indent: int = 1) -> Path:
    """Writes ``body`` as JSON to ``path`` with its stamp (:func:`stamped`), creating the folder;
    values JSON cannot hold (paths, dtypes) are written as their ``str``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stamped(body), indent=indent, default=str) + "\n", encoding="utf-8")
    return path


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table, the same form the docs pages use (a ``|`` inside a cell is escaped)."""
    return grid(list(columns), [[str(c) for c in row] for row in rows])
