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
    """Real (non-padding) tokens/s and padding efficiency per step."""
    steps = [r["step"] for r in records]
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
