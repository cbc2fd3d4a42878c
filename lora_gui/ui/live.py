"""What the open pages share on each timer tick, so the server's work per tick grows with neither
the run's length nor the number of pages.

Every page of the dashboard shows the same job (one :class:`lora_gui.engine.jobs.manager.JobManager` per
server, fed from the run folder). A tick's charts depend only on the job's state (its counts of
records, samples and phases, and the page's smoothing), so they are built and serialised once per
change of that state and the same result is handed to every page (:class:`SharedView`); and a page
that already holds the current charts is sent nothing new (:class:`PageMemory`). No gradio here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class SharedView:
    """One value per key, built by whichever page asks first while the others wait for it; the
    ``keep`` newest keys stay (a few smoothing weights on screen at once)."""

    def __init__(self, keep: int = 4) -> None:
        self._lock = threading.Lock()
        self._values: OrderedDict[Hashable, Any] = OrderedDict()
        self.keep = keep
        self.builds = 0  # values built so far (the bench and tests read it)

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:  # pages ticking at once wait for one build instead of each building
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
            value = build()
            self.builds += 1
            self._values[key] = value
            while len(self._values) > self.keep:
                self._values.popitem(last=False)
            return value


class PageMemory:
    """What each page (by gradio's session hash) was last sent of each part, so an unchanged part
    is skipped; the ``keep`` most recent pages are remembered (a forgotten page is sent all)."""

    def __init__(self, keep: int = 256) -> None:
        self._lock = threading.Lock()
        self._sent: OrderedDict[tuple[str, str], Hashable] = OrderedDict()
        self.keep = keep

    def set(self, page: str | None, part: str, key: Hashable) -> None:
        """Remembers ``key`` for ``part`` of ``page`` (a page's own state, such as an open
        accordion)."""
        if page is not None:
            with self._lock:
                self._sent[(page, part)] = key
                self._sent.move_to_end((page, part))

    def get(self, page: str | None, part: str, default: Hashable = None) -> Hashable:
        with self._lock:
            return self._sent.get((page, part), default)

    def changed(self, page: str | None, part: str, key: Hashable) -> bool:
        """True (and ``key`` remembered) when ``page`` has not been sent ``key`` for ``part``."""
        if page is None:  # a call without a page (the HTTP API): always the whole answer
            return True
        with self._lock:
            slot = (page, part)
            if slot in self._sent and self._sent[slot] == key:
                self._sent.move_to_end(slot)
                return False
            self._sent[slot] = key
            self._sent.move_to_end(slot)
            while len(self._sent) > self.keep * 4:  # a few parts per page
                self._sent.popitem(last=False)
            return True
