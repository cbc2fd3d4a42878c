"""How the dashboard's charts are laid out so people can read them in a narrow column: legends
below the plot (a legend beside a 400 px chart leaves the plot a sliver), titles short enough
for the chart's width, memory axes from zero with plain GB ticks, and a budget far above the
data named in a note instead of drawn as a line that flattens the curve onto the axis.
No gradio here (plain dicts for plotly layouts)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lora_gui.units import gb

# A budget (or card) more than this many times the highest figure drawn is not drawn as a line:
# at 24 GB against a 490 MiB curve, the curve would use 2% of the chart's height.
FAR_ABOVE = 3.0
# the legend at the figure's bottom edge (container coordinates), under the x axis's title
LEGEND_BELOW = {"orientation": "h", "x": 0, "xanchor": "left", "yref": "container", "y": 0,
                "yanchor": "bottom", "font": {"size": 11}}
TITLE_FONT = {"size": 14}  # px: a chart's title in a narrow column ("Throughput · MFU 1.9%")
MEMORY_AXIS = {"rangemode": "tozero", "tickformat": ",~g"}  # 0, 0.1, 0.2 ... not "24.1705k"


def title(text: str) -> dict[str, Any]:
    """A chart title, left-aligned so a long one is not cut at both ends."""
    return {"text": text, "font": TITLE_FONT, "x": 0.01, "xanchor": "left"}


def legend_below(layout: dict[str, Any], rows: int = 1) -> dict[str, Any]:
    """``layout`` with the legend under the plot (``rows`` lines of entries): the plot keeps the
    chart's whole width, and each entry its whole text."""
    margin = dict(layout.get("margin") or {})
    margin["b"] = max(margin.get("b", 40), 58 + 20 * rows)  # px: ticks and axis title, then the legend
    return {**layout, "legend": dict(LEGEND_BELOW), "margin": margin, "showlegend": True}


def is_far_above(value: float | None, top: float | None) -> bool:
    """Whether a line at ``value`` would squash a curve whose highest point is ``top``."""
    if not value or top is None or not math.isfinite(top) or top <= 0:
        return False
    return value > FAR_ABOVE * top


def off_scale_note(label: str, nbytes: float, index: int = 0) -> dict[str, Any]:
    """A note naming a line left off the scale (``nbytes``, shown in GB): the first above the
    plot's top right, on the title's line (clear of the phase labels inside the plot), others
    under it."""
    return {"xref": "paper", "yref": "paper", "x": 1, "y": 1 if index == 0 else 1 - 0.09 * index,
            "xanchor": "right", "yanchor": "bottom" if index == 0 else "top", "showarrow": False,
            "font": {"size": 11, "color": "#b22222"}, "text": f"{label}: {gb(nbytes)} (above the scale)"}


def finite_max(*values: Any) -> float | None:
    """The largest finite number among arrays and numbers (None, NaN and empty ones skipped)."""
    best = None
    for value in values:
        if value is None:
            continue
        array = np.asarray(value, dtype=float).ravel()
        array = array[np.isfinite(array)]
        if array.size and (best is None or array.max() > best):
            best = float(array.max())
    return best
