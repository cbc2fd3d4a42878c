"""Plotly figures from metric records. No gradio here: unit-tested on plain dicts.

Every memory axis says its source (``tracker`` on CPU, ``cuda_allocator`` on GPUs), and a
simulated budget is labelled as simulated.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

MIB = 2**20


def memory_figure(records: list[dict[str, Any]], budget_bytes: int | None = None,
                  predicted_bytes: int | None = None, simulated_budget: bool = True) -> go.Figure:
    """Per-step peak memory (MiB) with the budget and the predicted peak as horizontal lines."""
    steps = [r["step"] for r in records]
    peaks = [r["peak_bytes"] / MIB for r in records]
    source = records[-1]["memory_source"] if records else "no data yet"
    fig = go.Figure(go.Scatter(x=steps, y=peaks, mode="lines+markers", name=f"step peak ({source})"))
    if budget_bytes:
        label = "budget (simulated VRAM)" if simulated_budget else "budget"
        fig.add_hline(y=budget_bytes / MIB, line_dash="dash", line_color="red",
                      annotation_text=label, name=label)
        fig.add_trace(go.Scatter(x=steps[:1] or [0], y=[budget_bytes / MIB], mode="lines",
                                 line={"color": "red", "dash": "dash"}, name=label))
    if predicted_bytes:
        fig.add_hline(y=predicted_bytes / MIB, line_dash="dot", line_color="green",
                      annotation_text="predicted peak")
    fig.update_layout(title="Memory per step", xaxis_title="step", yaxis_title=f"MiB ({source})",
                      height=320, margin={"l": 50, "r": 20, "t": 40, "b": 40})
    return fig


def loss_figure(records: list[dict[str, Any]]) -> go.Figure:
    fig = go.Figure(go.Scatter(x=[r["step"] for r in records], y=[r["loss"] for r in records],
                               mode="lines", name="train loss"))
    fig.update_layout(title="Loss", xaxis_title="step", yaxis_title="loss", height=320,
                      margin={"l": 50, "r": 20, "t": 40, "b": 40})
    return fig


def throughput_figure(records: list[dict[str, Any]]) -> go.Figure:
    """Real (non-padding) tokens/s and padding efficiency per step (image runs: images/s)."""
    steps = [r["step"] for r in records]
    if records and "images_per_s" in records[0]:
        fig = go.Figure(go.Scatter(x=steps, y=[r["images_per_s"] for r in records], name="images/s"))
        fig.update_layout(title="Throughput", xaxis_title="step", yaxis_title="images/s", height=320,
                          margin={"l": 50, "r": 50, "t": 40, "b": 40})
        return fig
    fig = go.Figure(go.Scatter(x=steps, y=[r["tokens_per_s"] for r in records], name="real tokens/s"))
    fig.add_trace(go.Scatter(x=steps, y=[r["real_tokens"] / r["padded_tokens"] for r in records],
                             name="padding efficiency", yaxis="y2"))
    fig.update_layout(title="Throughput", xaxis_title="step", yaxis_title="real tokens/s",
                      yaxis2={"title": "real / padded", "overlaying": "y", "side": "right",
                              "range": [0, 1.05]}, height=320,
                      margin={"l": 50, "r": 50, "t": 40, "b": 40})
    return fig


BREAKDOWN_ORDER = ("frozen_weights", "lora_params", "gradients", "optimizer_state", "activations",
                   "temporaries")


def breakdown_figure(breakdown: dict[str, int], overheads: dict[str, int],
                     budget_bytes: int | None = None) -> go.Figure:
    """One stacked bar of the predicted peak by category (MiB), with the budget as a line."""
    fig = go.Figure()
    parts = [(k, breakdown.get(k, 0)) for k in BREAKDOWN_ORDER] + [
        (k, v) for k, v in breakdown.items() if k not in BREAKDOWN_ORDER] + [
        (f"overhead: {k}", v) for k, v in overheads.items() if v]
    for name, nbytes in parts:
        fig.add_trace(go.Bar(x=["predicted peak"], y=[nbytes / MIB], name=name))
    if budget_bytes:
        fig.add_hline(y=budget_bytes / MIB, line_dash="dash", line_color="red", annotation_text="budget")
    fig.update_layout(barmode="stack", title="Predicted peak by category (source: predicted)",
                      yaxis_title="MiB", height=420, margin={"l": 50, "r": 20, "t": 40, "b": 40})
    return fig


PHASE_COLORS = {"loading": "#9ecae1", "caching": "#c7e9c0", "training": "#fdd0a2",
                "evaluating": "#dadaeb", "saving": "#fcbba1", "sampling": "#d9d9d9"}
SAMPLE_SOURCES = (("cuda_allocator_allocated_bytes", "cuda_allocator"), ("tracker_live_bytes", "tracker"),
                  ("rss_bytes", "rss"))


def memory_timeline(samples: list[dict[str, Any]], phases: list[tuple[str, float]],
                    budget_bytes: int | None = None, predicted_bytes: int | None = None,
                    simulated_budget: bool = True) -> go.Figure:
    """Memory over time (MiB, its source named) with budget and predicted-peak lines and the
    run's phases shaded. Uses the best source the samples have (CUDA allocator, tracker, RSS)."""
    key, source = next(((k, s) for k, s in SAMPLE_SOURCES if samples and k in samples[0]),
                       ("tracker_live_bytes", "no data yet"))
    start = phases[0][1] if phases else (samples[0]["time"] if samples else 0.0)
    xs = [s["time"] - start for s in samples]
    fig = go.Figure(go.Scatter(x=xs, y=[s.get(key, 0) / MIB for s in samples], mode="lines+markers",
                               marker={"size": 3}, name=f"live memory ({source})"))
    end = xs[-1] if xs else 1.0
    for (name, t0), nxt in zip(phases, [*phases[1:], None]):
        if name == "done":
            continue
        x0, x1 = t0 - start, (nxt[1] - start) if nxt else end
        fig.add_vrect(x0=x0, x1=max(x1, x0 + 1e-3), fillcolor=PHASE_COLORS.get(name, "#eeeeee"),
                      opacity=0.35, line_width=0, annotation_text=name, annotation_position="top left")
    for value, label, color, dash in ((budget_bytes, "budget (simulated VRAM)" if simulated_budget else
                                       "budget", "red", "dash"), (predicted_bytes, "predicted peak",
                                                                  "green", "dot")):
        if value:
            fig.add_trace(go.Scatter(x=[0, max(end, 1.0)], y=[value / MIB] * 2, mode="lines", name=label,
                                     line={"color": color, "dash": dash}))
    fig.update_layout(title="Memory over time", xaxis_title="seconds", yaxis_title=f"MiB ({source})",
                      height=320, margin={"l": 50, "r": 20, "t": 40, "b": 40})
    return fig
