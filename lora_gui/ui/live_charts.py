"""The run's live charts, updated in place on each page: a tick's answer carries only the points a
page does not hold yet.

The server builds each chart once per state of the job for every page (:class:`ChartView`, from
the plain trace and layout dicts of lora_gui.ui.charts) and remembers, per page, what that page
holds (:class:`PageCursors`): per chart the state it was sent, and per curve the generation and
the count of its points that stay as they are (lora_gui.ui.history). A page's answer then holds,
per chart that changed, either the points after those it holds (``keep`` points kept, the rest
replaced) or, for a page that holds nothing (opened or reloaded mid-run) or a curve whose
downsampling changed, the whole chart once. The page keeps its Plotly charts and redraws them
with the new points (:data:`PAGE_SCRIPT`). No gradio here.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from lora_gui.ui.charts import STABLE

SIGNIFICANT = 6  # digits sent per number: far more than a chart shows (steps stay exact to 1e6)


def numbers(values: Any) -> list[float | None]:
    """JSON-ready numbers: NaN (a gap in the line) as null, each to SIGNIFICANT digits."""
    out: list[float | None] = []
    for v in np.asarray(values, dtype=float).tolist():
        out.append(None if math.isnan(v) else float(f"{v:.{SIGNIFICANT}g}"))
    return out


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=float)


class ChartView:
    """One chart at one state of the job, the same for every page: its layout, and per trace its
    settings, points and (for a growing curve) generation and stable point count."""

    def __init__(self, version: Hashable, traces: list[dict[str, Any]], layout: dict[str, Any]) -> None:
        self.version = version
        self.layout = _json(layout)
        self.metas = [_json({k: v for k, v in t.items() if k not in ("x", "y", STABLE)}) for t in traces]
        self.xs = [np.asarray(t["x"], dtype=float) for t in traces]
        self.ys = [np.asarray(t["y"], dtype=float) for t in traces]
        stable = [t.get(STABLE) for t in traces]  # None: sent whole when the chart changes
        self.gens = tuple(None if s is None else s[0] for s in stable)
        self.stables = tuple(0 if s is None else min(s[1], len(x)) for s, x in zip(stable, self.xs))
        self._full: str | None = None

    @property
    def cursor(self) -> tuple:
        """What a page holds once it has this chart."""
        return (self.version, self.layout, tuple(self.metas), self.gens, self.stables)

    def full(self) -> str:
        """The whole chart as JSON (made once per state, whichever page asks first)."""
        if self._full is None:
            traces = ",".join(f'{meta[:-1]}{"," if len(meta) > 2 else ""}"x":{_json(numbers(x))},'
                              f'"y":{_json(numbers(y))}}}'
                              for meta, x, y in zip(self.metas, self.xs, self.ys))
            self._full = f'{{"full":1,"layout":{self.layout},"traces":[{traces}]}}'
        return self._full

    def delta(self, held: tuple | None) -> str | None:
        """JSON of what a page holding ``held`` (an earlier :attr:`cursor`) needs; None when it
        holds this state already."""
        if held == self.cursor:
            return None
        if held is None or held[2] != tuple(self.metas) or held[3] != self.gens:
            return self.full()
        parts = []
        for x, y, gen, had in zip(self.xs, self.ys, self.gens, held[4]):
            keep = had if gen is not None else 0  # a line without a generation: sent whole
            parts.append(f'{{"keep":{keep},"x":{_json(numbers(x[keep:]))},"y":{_json(numbers(y[keep:]))}}}')
        layout = f'"layout":{self.layout},' if held[1] != self.layout else ""
        return f'{{{layout}"traces":[{",".join(parts)}]}}'


class _Page:
    __slots__ = ("seq", "held")

    def __init__(self, seq: int, held: dict[str, tuple]) -> None:
        self.seq, self.held = seq, held


def seen_seq(seen: Any) -> int:
    """The answer number a page says it applied last (its charts' value, ``"seen N"``); 0 when
    it says nothing readable (it then gets every chart whole)."""
    text = str(seen or "")
    if text.startswith("seen "):
        try:
            return int(text[5:])
        except ValueError:
            return 0
    return 0


class PageCursors:
    """What each page (by gradio's session hash) holds of each chart, tied to the number of the
    answer that gave it: a page that says it applied another answer (one lost, or two ticks
    crossing) is sent every chart whole. The ``keep`` most recent pages are remembered."""

    def __init__(self, keep: int = 256) -> None:
        self._lock = threading.Lock()
        self._pages: OrderedDict[str, _Page] = OrderedDict()
        self.keep = keep

    def answer(self, page: str | None, seen: Any, views: Mapping[str, ChartView]) -> str | None:
        """The JSON answer for ``page`` (None: it holds every chart as it is now). ``"after"``
        names the answer the page must have applied for the parts that are not whole."""
        with self._lock:
            known = self._pages.get(page) if page is not None else None
        held = known.held if known is not None and known.seq == seen_seq(seen) else {}
        parts = []
        for chart_id, view in views.items():
            part = view.delta(held.get(chart_id))
            if part is not None:
                parts.append(f'"{chart_id}":{part}')
        if not parts:
            return None
        after, seq = (known.seq if held else None), 1
        if page is not None:
            with self._lock:  # numbered here: two answers of one page built at once differ
                latest = self._pages.get(page)
                seq = (latest.seq if latest is not None else 0) + 1
                self._pages[page] = _Page(seq, {chart_id: view.cursor for chart_id, view in views.items()})
                self._pages.move_to_end(page)
                while len(self._pages) > self.keep:
                    self._pages.popitem(last=False)
        return f'{{"seq":{seq},"after":{_json(after)},"charts":{{{",".join(parts)}}}}}'
