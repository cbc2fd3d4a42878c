"""Plotly figures from metric records. No gradio here: unit-tested on plain dicts.

Every memory axis says its source (``tracker`` on CPU, ``cuda_allocator`` on GPUs), and a
simulated budget is labelled as simulated.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from _plotly_utils.utils import is_homogeneous_array, is_skipped_key, to_typed_array_spec
from plotly.io.json import to_json_plotly

from lora_gui.ui import chart_style as style
from lora_gui.ui.history import HISTORY, SmoothedSeries, column
from lora_gui.ui.series import downsample
from lora_gui.units import GB


class _Figure(go.Figure):
    """A go.Figure whose ``to_json()`` (what gradio sends the page every tick) writes the figure
    as it is, without plotly's deep copy of the whole figure and its ~7 kB default template
    (~10 ms a figure); the JSON is the same (tested). Other calls go to plotly's own."""

    def to_json(self, *args: Any, **kwargs: Any) -> str:
        if args or kwargs:
            return super().to_json(*args, **kwargs)
        data = [{key: _typed(value) for key, value in trace.items() if key != "uid"} for trace in self._data]
        return to_json_plotly({"data": data, "layout": self._layout})


def _typed(value: Any) -> Any:
    """Numeric arrays as plotly's typed-array spec (base64), as plotly's own to_json sends them."""
    if isinstance(value, dict):
        return {k: v if is_skipped_key(k) else _typed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_typed(v) for v in value]
    return to_typed_array_spec(value) if is_homogeneous_array(value) else value


MARKERS_UP_TO = 200  # points: a line with more is drawn without markers (one SVG shape each)


def _marked(n: int) -> str:
    """A curve's mode: each sample marked while they are few enough to tell apart."""
    return "lines+markers" if n <= MARKERS_UP_TO else "lines"


def _single(value: Any) -> Any:
    """Float64 columns sent as float32: half the bytes every open page gets each tick; steps,
    seconds since the run's start, GB and losses keep far more digits than a chart shows."""
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        return value.astype(np.float32)
    return value


Spec = tuple[list[dict[str, Any]], dict[str, Any]]  # (traces, layout) as plain dicts
# A trace's "stable" entry (not Plotly's): (generation, k) of its curve (lora_gui.ui.history): its
# first k points stay as they are while the generation lasts; the live charts send a page only
# the points after those it holds. A trace without one is sent whole whenever it changes.
STABLE = "stable"


def figure(traces: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A figure from plain trace and layout dicts, built without plotly's per-property validation
    (the builders below are unit-tested; validation cost ~3 ms a figure on every timer tick)."""
    traces = [{key: _single(value) if key in ("x", "y") else value for key, value in trace.items()
               if key != STABLE} for trace in traces]
    return _Figure({"data": traces, "layout": layout}, _validate=False)


def _ranked_lines(records: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """Several processes: one line per GPU besides the step peak (short runs: no downsampling)."""
    records = _measured(records)
    ranks = max((len(r.get("peak_bytes_by_rank") or ()) for r in records[-1:] + records[:1]), default=0)
    lines = []
    for rank in range(ranks if ranks > 1 else 0):
        rows = [r for r in records if len(r.get("peak_bytes_by_rank") or ()) > rank]
        lines.append({"type": "scatter", "x": np.array([r["step"] for r in rows], float),
                      "y": np.array([r["peak_bytes_by_rank"][rank] / GB for r in rows]),
                      "mode": "lines", "name": f"{_device_name(source)} {rank} ({source})"})
    return lines


def _steps(records: list[dict[str, Any]]) -> np.ndarray:
    return column(records, "step")


def _coverage(records: list[dict[str, Any]]) -> str:
    """', measured steps only' when some steps carry no measured peak (followed incrementally, so
    a tick's cost does not grow with the run's length)."""
    unmeasured, _, _, _ = HISTORY.curve("unmeasured steps", records, lambda new: (
        _steps(u := [r for r in new if r.get("peak_bytes") is None]), np.zeros(len(u))))
    return ", measured steps only" if len(unmeasured) else ""


def _measured(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps with a measured peak (a CPU run measures the first steps of each step shape, not the
    smaller steps after them)."""
    return [r for r in records if r.get("peak_bytes") is not None]


def memory_figure(records: list[dict[str, Any]], budget_bytes: int | None = None,
                  predicted_bytes: int | None = None, simulated_budget: bool = True) -> go.Figure:
    """Per-step peak memory (GB) with the budget and the predicted peak as horizontal lines; only
    measured steps are drawn (a CPU run measures the first steps of each step shape, not the
    smaller steps after them)."""
    return figure(*memory_spec(records, budget_bytes, predicted_bytes, simulated_budget))


def memory_spec(records: list[dict[str, Any]], budget_bytes: int | None = None,
                predicted_bytes: int | None = None, simulated_budget: bool = True) -> Spec:
    """:func:`memory_figure` as plain dicts."""
    steps, peaks, _, stable = HISTORY.curve("step peak", records, lambda new: (
        _steps(m := _measured(new)), column(m, "peak_bytes", GB)))
    source = records[-1]["memory_source"] if records else "no data yet"
    traces = [{"type": "scatter", "x": steps, "y": peaks, "mode": _marked(len(steps)),
               "name": f"step peak ({source}{_coverage(records)})", STABLE: stable},
              *_ranked_lines(records, source)]
    shapes = []  # layout shapes draw across the whole axis; a one-point trace names each in the legend
    first = [steps[0] if len(steps) else 0]
    lines, notes = _reference_lines(budget_bytes, predicted_bytes, simulated_budget, [peaks])
    for value, label, color, dash in lines:
        shapes.append(_hline(value / GB, color, dash))
        traces.append({"type": "scatter", "x": first, "y": [value / GB], "mode": "lines",
                       "line": {"color": color, "dash": dash}, "name": label})
    return traces, style.legend_below({"shapes": shapes, "annotations": notes,
                                       "title": style.title("Memory per step"),
                                       "xaxis": {"title": {"text": "step"}},
                                       "yaxis": {"title": {"text": f"GB ({source})"}, **style.MEMORY_AXIS},
                                       "height": 320, "margin": {"l": 55, "r": 20, "t": 40, "b": 40}})


def _reference_lines(budget_bytes: int | None, predicted_bytes: int | None, simulated: bool,
                     drawn: Any) -> tuple[list[tuple[int, str, str, str]], list[dict[str, Any]]]:
    """(the budget and predicted-peak lines to draw, notes for those left off the scale): the
    axis is scaled to what is drawn, the curve and the predicted peak (always drawn: it belongs
    to the run, and a line that came and went with the first samples would move the axis); a
    budget far above both would flatten them onto the axis, so it is named in a note instead."""
    budget_label = "budget (simulated VRAM)" if simulated else "budget"
    lines = [(predicted_bytes, "predicted peak", "green", "dot")] if predicted_bytes else []
    notes = []
    if budget_bytes:
        top = style.finite_max(*drawn, predicted_bytes / GB if predicted_bytes else None)
        if style.is_far_above(budget_bytes / GB, top):
            notes.append(style.off_scale_note(budget_label, budget_bytes))
        else:
            lines.insert(0, (budget_bytes, budget_label, "red", "dash"))
    return lines, notes


def loss_figure(records: list[dict[str, Any]], smoothing: float = 0.0) -> go.Figure:
    """Train loss per step: the raw curve faint and its EMA (``smoothing`` weight, 0 = off) on
    top; long histories downsampled (the EMA is computed on every step first)."""
    return figure(*loss_spec(records, smoothing))


def loss_spec(records: list[dict[str, Any]], smoothing: float = 0.0) -> Spec:
    """:func:`loss_figure` as plain dicts."""
    def losses(new: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        return _steps(new), column(new, "loss")

    xs, raw, _, stable = HISTORY.curve("loss", records, losses)
    traces = [{"type": "scatter", "x": xs, "y": raw, "mode": "lines", "name": "train loss",
               "opacity": 0.3 if smoothing else 1.0, STABLE: stable}]
    if smoothing and records:
        xs, smooth, _, stable = HISTORY.curve(f"loss ema {smoothing}", records, losses,
                                              lambda: SmoothedSeries(smoothing))
        traces.append({"type": "scatter", "x": xs, "y": smooth, "mode": "lines",
                       "name": f"EMA {smoothing:g}", STABLE: stable})
    layout = {"title": style.title("Loss"), "xaxis": {"title": {"text": "step"}},
              "yaxis": {"title": {"text": "loss"}, "tickformat": ".3~g"}, "height": 320,
              "margin": {"l": 45, "r": 10, "t": 40, "b": 40}}
    if records and "reward_margin" in records[-1]:  # preference runs: their rewards beside the loss
        traces += _reward_traces(records)
        layout |= {"title": style.title("Loss and rewards"), "margin": {"l": 45, "r": 45, "t": 40, "b": 40},
                   "yaxis2": {"title": {"text": "reward"}, "overlaying": "y", "side": "right"}}
        return traces, style.legend_below(layout, rows=3)
    return traces, style.legend_below(layout)


REWARD_SERIES = (("rewards_chosen", "reward chosen"), ("rewards_rejected", "reward rejected"),
                 ("reward_margin", "reward margin"), ("reward_accuracy", "reward accuracy"))


def _reward_traces(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A preference run's per-step rewards (chosen, rejected, margin) and reward accuracy, on the
    loss chart's right axis."""
    traces = []
    for key, name in REWARD_SERIES:
        xs, ys, _, stable = HISTORY.curve(name, records, lambda new, k=key: (
            _steps(new), np.array([r.get(k, np.nan) for r in new], dtype=float)))
        traces.append({"type": "scatter", "x": xs, "y": ys, "mode": "lines", "name": name, STABLE: stable,
                       "yaxis": "y2", "line": {"dash": "dot"} if key == "reward_accuracy" else {}})
    return traces


def mfu_label(records: list[dict[str, Any]]) -> str:
    """' · MFU 12.3%' (of the last step): useful FLOPs per second over the machine's measured
    matmul peak; short, as the title of a narrow chart."""
    last = next((r.get("mfu") for r in reversed(records) if r.get("mfu") is not None), None)
    return "" if last is None else f" · MFU {last:.1%}"


def throughput_figure(records: list[dict[str, Any]]) -> go.Figure:
    """Real (non-padding) tokens/s and padding efficiency per step (image runs: images/s)."""
    return figure(*throughput_spec(records))


def throughput_spec(records: list[dict[str, Any]]) -> Spec:
    """:func:`throughput_figure` as plain dicts."""
    margin = {"l": 45, "r": 45, "t": 40, "b": 40}
    if not records:  # no run yet: the axes of neither task (the form may show either)
        return [], style.legend_below({"title": style.title("Throughput"),
                                       "xaxis": {"title": {"text": "step"}},
                                       "yaxis": {"title": {"text": "per second"}}, "height": 320,
                                       "margin": margin})
    if "images_per_s" in records[0]:
        xs, ys, _, stable = HISTORY.curve("images/s", records,
                                          lambda new: (_steps(new), column(new, "images_per_s",
                                                                             default=np.nan)))
        return ([{"type": "scatter", "x": xs, "y": ys, "name": "images/s", STABLE: stable}],
                style.legend_below({"title": style.title("Throughput" + mfu_label(records)),
                                    "xaxis": {"title": {"text": "step"}},
                                    "yaxis": {"title": {"text": "images/s"}, "tickformat": ",.3~g"},
                                    "height": 320, "margin": margin}))
    xs, ys, _, stable = HISTORY.curve("tokens/s", records,
                                      lambda new: (_steps(new), column(new, "tokens_per_s",
                                                                         default=np.nan)))
    ex, ey, _, e_stable = HISTORY.curve("padding efficiency", records, lambda new: (
        _steps(new), column(new, "real_tokens") / np.maximum(column(new, "padded_tokens"), 1)))
    traces = [{"type": "scatter", "x": xs, "y": ys, "name": "real tokens/s", STABLE: stable},
              {"type": "scatter", "x": ex, "y": ey, "name": "padding efficiency", "yaxis": "y2",
               STABLE: e_stable}]
    return (traces, style.legend_below({"title": style.title("Throughput" + mfu_label(records)),
                                        "xaxis": {"title": {"text": "step"}},
                                        "yaxis": {"title": {"text": "real tokens/s"},
                                                  "tickformat": ",.3~s"},
                                        "yaxis2": {"title": {"text": "real / padded"}, "overlaying": "y",
                                                   "side": "right", "range": [0, 1.05],
                                                   "tickformat": ".0%"},
                                        "height": 320, "margin": margin}))


BREAKDOWN_ORDER = ("frozen_weights", "lora_params", "gradients", "optimizer_state", "activations",
                   "temporaries")


def breakdown_figure(breakdown: dict[str, int], overheads: dict[str, int],
                     budget_bytes: int | None = None) -> go.Figure:
    """One stacked bar of the predicted peak by category (GB), with the budget as a line."""
    fig = go.Figure()
    parts = [(k, breakdown.get(k, 0)) for k in BREAKDOWN_ORDER] + [
        (k, v) for k, v in breakdown.items() if k not in BREAKDOWN_ORDER] + [
        (f"overhead: {k}", v) for k, v in overheads.items() if v]
    for name, nbytes in parts:
        fig.add_trace(go.Bar(x=["predicted peak"], y=[nbytes / GB], name=name))
    total = sum(nbytes for _, nbytes in parts) / GB
    if budget_bytes and style.is_far_above(budget_bytes / GB, total):  # a line would flatten the bar
        fig.add_annotation(**style.off_scale_note("budget", budget_bytes))
    elif budget_bytes:
        fig.add_hline(y=budget_bytes / GB, line_dash="dash", line_color="red", annotation_text="budget")
    rows = max(1, -(-len(parts) // 3))  # legend entries, three a line
    fig.update_layout(**style.legend_below({
        "barmode": "stack", "title": style.title("Predicted peak by category (source: predicted)"),
        "yaxis": {"title": {"text": "GB"}, **style.MEMORY_AXIS}, "height": 420 + 20 * rows,
        "margin": {"l": 55, "r": 20, "t": 50, "b": 40}}, rows))
    return fig


def _hline(y: float, color: str, dash: str) -> dict[str, Any]:
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y,
            "line": {"color": color, "dash": dash}}


def _device_name(source: str) -> str:
    return "GPU" if source.startswith(("cuda", "nvml")) else "rank"


PHASE_COLORS = {"loading": "#9ecae1", "caching": "#c7e9c0", "training": "#fdd0a2",
                "evaluating": "#dadaeb", "saving": "#fcbba1", "sampling": "#d9d9d9"}
SAMPLE_SOURCES = (("cuda_allocator_allocated_bytes", "cuda_allocator"), ("tracker_live_bytes", "tracker"),
                  ("rss_bytes", "rss"))


def _phase_shading(phases: list[tuple[str, float]], start: float, end: float,
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rectangles, labels) of the run's phases on a time axis starting at ``start``."""
    shapes, notes = [], []
    for (name, t0), nxt in zip(phases, [*phases[1:], None]):
        if name == "done":
            continue
        x0, x1 = t0 - start, (nxt[1] - start) if nxt else end
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": x0, "x1": max(x1, x0 + 1e-3),
                       "y0": 0, "y1": 1, "fillcolor": PHASE_COLORS.get(name, "#eeeeee"),
                       "opacity": 0.35, "line": {"width": 0}, "layer": "below"})
        notes.append({"x": x0, "y": 1, "xref": "x", "yref": "paper", "text": name, "showarrow": False,
                      "xanchor": "left", "yanchor": "top"})
    return shapes, notes


def _timeline_lines(samples: list[dict[str, Any]], key: str, source: str, start: float,
                    ) -> tuple[list[dict[str, Any]], float]:
    """The live-memory line (one per GPU of a launched run) and the last time on the axis."""
    def line(xs: np.ndarray, ys: np.ndarray, label: str) -> dict[str, Any]:
        return {"type": "scatter", "x": xs, "y": ys, "mode": _marked(len(xs)), "marker": {"size": 3},
                "name": f"{label}live memory ({source})"}

    if not (samples and any("rank" in s for s in (samples[0], samples[-1]))):
        xs, ys, last, (gen, k) = HISTORY.curve(f"timeline {key}", samples,
                                               lambda new: (column(new, "time"),
                                                            column(new, key, GB, default=np.nan)))
        # the axis starts at the run's first phase: a new start is a new generation of the line
        return [{**line(xs - start, ys, ""), STABLE: ((*gen, start), k)}], \
            (last - start if last is not None else 1.0)
    xs, ys = column(samples, "time") - start, column(samples, key, GB, default=np.nan)  # per GPU
    ranks = column(samples, "rank", default=-1).astype(int)
    lines = [line(*downsample(xs[ranks == r], ys[ranks == r]), f"{_device_name(source)} {r} ")
             for r in sorted(set(ranks.tolist()) - {-1})]
    return lines, float(xs[-1])


def memory_timeline(samples: list[dict[str, Any]], phases: list[tuple[str, float]],
                    budget_bytes: int | None = None, predicted_bytes: int | None = None,
                    simulated_budget: bool = True) -> go.Figure:
    """Memory over time (GB, its source named) with budget and predicted-peak lines and the
    run's phases shaded. Uses the best source the samples have (CUDA allocator, tracker, RSS)."""
    return figure(*timeline_spec(samples, phases, budget_bytes, predicted_bytes, simulated_budget))


def timeline_spec(samples: list[dict[str, Any]], phases: list[tuple[str, float]],
                  budget_bytes: int | None = None, predicted_bytes: int | None = None,
                  simulated_budget: bool = True) -> Spec:
    """:func:`memory_timeline` as plain dicts."""
    key, source = next(((k, s) for k, s in SAMPLE_SOURCES if samples and k in samples[0]),
                       ("tracker_live_bytes", "no data yet"))
    start = phases[0][1] if phases else (samples[0]["time"] if samples else 0.0)
    traces, end = _timeline_lines(samples, key, source, start) if samples else ([], 1.0)
    shapes, notes = _phase_shading(phases, start, end)
    lines, off_scale = _reference_lines(budget_bytes, predicted_bytes, simulated_budget,
                                        [t["y"] for t in traces])
    for value, label, color, dash in lines:
        traces.append({"type": "scatter", "x": [0, max(end, 1.0)], "y": [value / GB] * 2,
                       "mode": "lines", "name": label, "line": {"color": color, "dash": dash}})
    return traces, style.legend_below({"shapes": shapes, "annotations": notes + off_scale,
                                       "title": style.title("Memory over time"),
                                       "xaxis": {"title": {"text": "seconds"}},
                                       "yaxis": {"title": {"text": f"GB ({source})"}, **style.MEMORY_AXIS},
                                       "height": 320, "margin": {"l": 55, "r": 20, "t": 40, "b": 40}})


# -- comparison charts: lora_gui/ui/charts_compare.py (kept here under their old names) --------
from lora_gui.ui.charts_compare import (  # noqa: E402
    COMPARE_MODES,
    MODE_COLORS,
    ablation_waterfall,
    compare_bars,
    compare_figures,
    mode_lines,
    speed_bars,
)

__all__ = ["COMPARE_MODES", "MODE_COLORS", "ablation_waterfall", "compare_bars", "compare_figures",
           "mode_lines", "speed_bars"]


def write_compare_report(rows: list[dict[str, Any]], path: Path, title: str = "lora_gui compare") -> Path:
    """A self-contained HTML page (plotly.js embedded: works offline) with every figure and the
    rows as a table; written atomically."""
    from lora_gui.engine.core.checkpoint import write_atomic

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><p>Every memory figure names its source (tracker: live "
             "tensor bytes on CPU; cuda_allocator: torch.cuda.max_memory_allocated; predicted: the "
             "planner). Rows labelled predicted were not measured.</p>"]
    for i, (name, fig) in enumerate(compare_figures(rows)):
        parts.append(f"<h2>{html.escape(name)}</h2>")
        parts.append(fig.to_html(full_html=False, include_plotlyjs=i == 0))
    cols = ("question", "data", "mode", "seq_len", "resolution", "status", "batch_size", "peak_bytes",
            "memory_source", "predicted_peak_bytes", "real_tokens_per_s", "images_per_s", "eval_loss",
            "eval_loss_full_attention", "message")
    parts.append("<h2>rows</h2><table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>")
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{v:.4g}" if isinstance(v, float) else "" if v is None else html.escape(str(v)))
        parts.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    parts.append("</table></body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "\n".join(parts))
    return path
