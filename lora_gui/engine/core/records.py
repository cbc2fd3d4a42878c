"""Metric records: one JSON object a line in metrics.jsonl, plus an in-memory copy that the
UI polls. The engine only appends; readers never call back into the engine."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


class RecordLog:
    """Append-only JSONL file with a thread-safe in-memory mirror."""

    def __init__(self, path: Path, keep_until_step: int | None = None, write: bool = True) -> None:
        """Opens ``path``; with ``keep_until_step`` (resume) drops records after that step.
        ``write=False``: in memory only (the ranks other than the main process of a launch)."""
        self.path = path
        self.write = write
        self._lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.sinks: list[Callable[[dict[str, Any]], None]] = []  # e.g. experiment trackers
        if not write:
            return
        if keep_until_step is not None and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    rec = json.loads(line)
                    if rec.get("step", 0) <= keep_until_step:
                        self.records.append(rec)
        text = "".join(json.dumps(r) + "\n" for r in self.records)
        path.write_text(text, encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        """Keeps ``record``, writes it (main process) and hands it to each sink."""
        with self._lock:
            self.records.append(record)
            if not self.write:
                return
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        for sink in self.sinks:
            sink(record)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Reads a metrics.jsonl / events.jsonl file (for charts and tests)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
