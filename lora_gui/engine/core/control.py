"""How a caller steers and watches a run: the one object the CLI, the dashboard's job and the
compare rows hand to the engine. The engine calls the listeners; it never calls the UI."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainControl:
    """A stop request and listeners for step records, events (phases, checkpoints,
    out-of-memory recoveries) and memory samples."""

    stop: threading.Event = field(default_factory=threading.Event)
    on_record: Callable[[dict[str, Any]], None] | None = None
    on_event: Callable[[dict[str, Any]], None] | None = None
    on_sample: Callable[[dict[str, Any]], None] | None = None

    def emit(self, event: dict[str, Any]) -> None:
        if self.on_event:
            self.on_event(event)

    def phase(self, name: str) -> None:
        """Marks the start of a phase: loading, caching, training, evaluating, saving, sampling."""
        self.emit({"event": "phase", "phase": name, "time": time.time()})
