"""The comparison's charts (rows of compare.json): peak memory per mode as grouped bars and as
lines over length, what each optimization saves alone, speed at the same budget. Legends sit
below the plot (each entry whole), titles say what a user asks ("Peak memory per mode"), and a
card far above the bars is named in a note instead of flattening them. No gradio here."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from lora_gui.ui import chart_style as style
from lora_gui.units import GB, gb_decimals

# -- comparison: rows of compare.json ------------------------------------------------
COMPARE_MODES = ("traditional", "strong_baseline", "optimized")
MODE_COLORS = {"traditional": "#9e9e9e", "strong_baseline": "#6baed6", "optimized": "#31a354"}


def _size(row: dict[str, Any]) -> int:
    return row["seq_len"] if row.get("seq_len") is not None else row["resolution"]


def _size_label(rows: list[dict[str, Any]]) -> str:
    return "resolution (px)" if rows and rows[0].get("seq_len") is None else "sequence length (tokens)"


LOG_SPAN = 30.0  # highest over lowest peak above which the lines use a log axis
# the data kinds and questions as a user says them (lora_gui.engine.compare.spec)
DATA_WORDS = {"full": "samples filling each length", "corpus": "the training documents"}
QUESTION_WORDS = {"memory": "the same work", "speed": "the same budget"}


def _data_words(data: str) -> str:
    return DATA_WORDS.get(data, f"{data} data")


def _pick(rows: list[dict[str, Any]], question: str, data: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["question"] == question and r["data"] == data]


def compare_bars(rows: list[dict[str, Any]], question: str = "memory", data: str = "corpus") -> go.Figure:
    """Grouped bars of peak GB per length (or resolution): traditional / strong baseline /
    optimized, with each bar's saving against traditional on top; OOM rows are marked."""
    picked = _pick(rows, question, data)
    sizes = sorted({_size(r) for r in picked})
    by = {(r["mode"], _size(r)): r for r in picked}
    source = next((r["memory_source"] for r in picked if r.get("memory_source")), "no data")
    fig = go.Figure()
    for mode in COMPARE_MODES:
        ys, texts = [], []
        for n in sizes:
            r, trad = by.get((mode, n)), by.get(("traditional", n))
            peak = r.get("peak_bytes") if r else None
            ys.append(peak / GB if peak else None)
            if r and r.get("status") == "oom":
                texts.append("OOM")
            elif peak and trad and trad.get("peak_bytes") and mode != "traditional":
                texts.append(f"{peak / trad['peak_bytes'] - 1:+.0%}")
            else:
                texts.append("")
        fig.add_trace(go.Bar(x=[str(n) for n in sizes], y=ys, name=mode.replace("_", " "), text=texts,
                             textposition="outside", marker_color=MODE_COLORS[mode]))
    asked = QUESTION_WORDS.get(question, question)
    layout = style.legend_below({
        "barmode": "group", "title": style.title(f"Peak memory per mode (source: {source})<br><sup>"
                                                 f"{asked}, {_data_words(data)}</sup>"),
        "xaxis": {"title": {"text": _size_label(picked)}},
        "yaxis": {"title": {"text": f"peak GB ({source})"}, **style.MEMORY_AXIS},
        "height": 400, "margin": {"l": 60, "r": 20, "t": 60, "b": 40}})
    fig.update_layout(**layout)
    return fig


def mode_lines(rows: list[dict[str, Any]]) -> go.Figure:
    """Peak GB over length (or resolution), one line per mode; rows of the memory question."""
    picked = [r for r in rows if r.get("question", "memory") == "memory" and r.get("peak_bytes")]
    sources = sorted({str(r.get("memory_source")) for r in picked}) or ["no data"]
    fig = go.Figure()
    for mode in dict.fromkeys(r["mode"] for r in picked):
        line = sorted((r for r in picked if r["mode"] == mode), key=_size)
        dash = "dot" if mode.startswith("ablation:") else ("dash" if "(measured)" in mode else "solid")
        fig.add_trace(go.Scatter(x=[_size(r) for r in line], y=[r["peak_bytes"] / GB for r in line],
                                 mode="lines+markers", name=mode.replace("_", " "),
                                 line={"dash": dash, "color": MODE_COLORS.get(mode)}))
    peaks = [r["peak_bytes"] / GB for r in picked]
    # measured rows of a few MB beside predictions of GBs: a log axis keeps both readable
    axis = {"type": "log", "tickformat": ",~g"} if peaks and max(peaks) > LOG_SPAN * min(peaks) \
        else style.MEMORY_AXIS
    rows_needed = max(1, -(-len(fig.data) // 3))  # legend entries, three a line
    fig.update_layout(**style.legend_below({
        "title": style.title(f"Peak memory over length (source: {', '.join(sources)})"),
        "xaxis": {"title": {"text": _size_label(picked)}},
        "yaxis": {"title": {"text": "peak GB" + (", log scale" if axis.get("type") else "")}, **axis},
        "height": 400 + 18 * rows_needed, "margin": {"l": 60, "r": 20, "t": 50, "b": 40}}, rows_needed))
    return fig


def ablation_waterfall(rows: list[dict[str, Any]], data: str = "corpus",
                       size: int | None = None) -> go.Figure:
    """Waterfall from traditional's peak: each optimization's own change (switched on alone),
    the interaction of combining them, and the optimized peak (GB)."""
    picked = _pick(rows, "memory", data)
    sizes = sorted({_size(r) for r in picked})
    size = size if size is not None else (sizes[-1] if sizes else None)
    by = {r["mode"]: r for r in picked if _size(r) == size and r.get("peak_bytes")}
    fig = go.Figure()
    trad, opt = by.get("traditional"), by.get("optimized")
    if trad is None:
        fig.update_layout(title=f"Ablation: no traditional row for {data} {size}")
        return fig
    base = trad["peak_bytes"] / GB
    names, values, measures = ["traditional"], [base], ["absolute"]
    for mode, r in by.items():
        if mode.startswith("ablation:"):
            names.append(mode.split(":", 1)[1] + " alone")
            values.append(r["peak_bytes"] / GB - base)
            measures.append("relative")
    if opt is not None:
        names.append("combined (interaction)")
        values.append(opt["peak_bytes"] / GB - base - sum(values[1:]))
        measures.append("relative")
        names.append("optimized")
        values.append(0)
        measures.append("total")
    texts = [f"{v:+,.{gb_decimals(abs(v))}f}" if m == "relative" else "" for v, m in zip(values, measures)]
    fig.add_trace(go.Waterfall(x=names, y=values, measure=measures, text=texts))
    fig.update_layout(title=style.title(f"What each optimization saves alone ({_data_words(data)}, "
                                        f"{size}; source: {trad.get('memory_source')})"),
                      yaxis_title="peak GB", height=420,
                      showlegend=False, margin={"l": 50, "r": 20, "t": 50, "b": 90})
    return fig


def speed_bars(rows: list[dict[str, Any]], data: str = "corpus") -> go.Figure:
    """Real tokens/s (or images/s) per length at the same budget, with the ratio to traditional."""
    picked = _pick(rows, "speed", data)
    key = "images_per_s" if picked and picked[0].get("seq_len") is None else "real_tokens_per_s"
    sizes = sorted({_size(r) for r in picked})
    by = {(r["mode"], _size(r)): r for r in picked}
    fig = go.Figure()
    for mode in COMPARE_MODES:
        ys, texts = [], []
        for n in sizes:
            r, trad = by.get((mode, n)), by.get(("traditional", n))
            value = r.get(key) if r else None
            ys.append(value)
            base = trad.get(key) if trad else None
            texts.append("OOM" if r and r.get("status") == "oom" else
                         f"{value / base:.2f}x" if value and base else "")
        fig.add_trace(go.Bar(x=[str(n) for n in sizes], y=ys, name=mode.replace("_", " "), text=texts,
                             textposition="outside", marker_color=MODE_COLORS[mode]))
    label = key.replace("_per_s", "/s").replace("_", " ")
    fig.update_layout(**style.legend_below({
        "barmode": "group", "title": style.title(f"{label} at the same budget, {_data_words(data)}"),
        "xaxis": {"title": {"text": _size_label(picked)}}, "yaxis": {"title": {"text": label}},
        "height": 400, "margin": {"l": 60, "r": 20, "t": 50, "b": 40}}))
    return fig


def compare_figures(rows: list[dict[str, Any]]) -> list[tuple[str, go.Figure]]:
    """Every comparison figure the rows support, titled: bars, waterfalls and speed per data."""
    figs = []
    for data in sorted({r["data"] for r in rows}):
        for question in ("memory", "speed"):
            if _pick(rows, question, data):
                figs.append((f"peak memory per mode, {QUESTION_WORDS[question]}, {_data_words(data)}",
                             compare_bars(rows, question, data)))
        if any(r["mode"].startswith("ablation:") for r in _pick(rows, "memory", data)):
            for n in sorted({_size(r) for r in _pick(rows, "memory", data)}):
                figs.append((f"ablation: {data} {n}", ablation_waterfall(rows, data, n)))
        if _pick(rows, "speed", data):
            figs.append((f"speed: {data}", speed_bars(rows, data)))
    return figs


