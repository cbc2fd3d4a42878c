import numpy as np
import pytest

from lora_gui.ui import charts


def rec(step, peak, loss=3.0):
    return {"step": step, "peak_bytes": peak, "memory_source": "tracker", "loss": loss,
            "tokens_per_s": 100.0, "real_tokens": 50, "padded_tokens": 100}


def test_memory_figure_has_points_budget_and_source():
    fig = charts.memory_figure([rec(1, 10**9), rec(2, 3 * 10**9)], budget_bytes=8 * 10**9,
                               predicted_bytes=4 * 10**9)
    peak = fig.data[0]
    assert list(peak.y) == [1.0, 3.0] and "tracker" in peak.name
    assert any("simulated" in (t.name or "") for t in fig.data)
    shapes = [s.y0 for s in fig.layout.shapes]
    assert 8.0 in shapes and 4.0 in shapes
    assert "tracker" in fig.layout.yaxis.title.text


def test_memory_figure_draws_only_the_measured_steps():
    records = [rec(1, 10**9), rec(2, 3 * 10**9), rec(3, None), {**rec(4, None), "peak_bytes_by_rank": None}]
    fig = charts.memory_figure(records)
    assert list(fig.data[0].x) == [1.0, 2.0] and list(fig.data[0].y) == [1.0, 3.0]
    assert "measured steps only" in fig.data[0].name
    assert "measured steps only" not in charts.memory_figure(records[:2]).data[0].name


def test_memory_figure_without_budget_or_data():
    fig = charts.memory_figure([])
    assert len(fig.data) == 1 and len(fig.data[0].x) == 0 and not fig.layout.shapes


def test_loss_and_throughput_figures():
    records = [rec(1, 1, 4.0), rec(2, 1, 3.5)]
    assert list(charts.loss_figure(records).data[0].y) == [4.0, 3.5]
    thr = charts.throughput_figure(records)
    assert list(thr.data[1].y) == [0.5, 0.5]
    assert thr.layout.title.text == "Throughput"  # no FLOP count: no MFU shown
    records[1]["mfu"] = 0.1234
    titled = charts.throughput_figure(records).layout.title.text
    assert titled == "Throughput · MFU 12.3%"  # short: it fits a narrow chart


def test_breakdown_figure_stacks_categories_and_overheads():
    fig = charts.breakdown_figure({"frozen_weights": 10**9, "activations": 3 * 10**9},
                                  {"cuda_context": 10**9, "allocator_rounding": 0}, budget_bytes=8 * 10**9)
    names = [t.name for t in fig.data]
    assert names[0] == "frozen_weights" and "overhead: cuda_context" in names
    assert "overhead: allocator_rounding" not in names  # zero overheads are not drawn
    assert fig.layout.barmode == "stack" and fig.layout.shapes[0].y0 == 8.0


def test_memory_timeline_shades_phases_and_draws_budget_and_prediction():
    samples = [{"time": 100.0 + i, "tracker_live_bytes": (i + 1) * 10**9, "rss_bytes": 1} for i in range(4)]
    phases = [("loading", 99.0), ("training", 100.5), ("saving", 102.5)]
    fig = charts.memory_timeline(samples, phases, budget_bytes=8 * 10**9, predicted_bytes=6 * 10**9)
    assert list(fig.data[0].y) == [1.0, 2.0, 3.0, 4.0] and "tracker" in fig.data[0].name
    assert list(fig.data[0].x) == [1.0, 2.0, 3.0, 4.0]  # seconds since the first phase
    names = [t.name for t in fig.data]
    assert "budget (simulated VRAM)" in names and "predicted peak" in names
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(r.x0, r.x1) for r in rects] == [(0.0, 1.5), (1.5, 3.5), (3.5, 4.0)]


def test_memory_timeline_prefers_the_cuda_allocator():
    samples = [{"time": 1.0, "cuda_allocator_allocated_bytes": 2 * 10**9, "tracker_live_bytes": 1}]
    fig = charts.memory_timeline(samples, [], budget_bytes=None)
    assert "cuda_allocator" in fig.data[0].name and list(fig.data[0].y) == [2.0]



def test_tick_figures_send_the_json_plotly_itself_would():
    import json

    import plotly.graph_objects as go

    records = [{**rec(i + 1, (i + 1) * 10**9, 4.0 - i / 1000)} for i in range(3000)]  # downsampled
    samples = [{"time": float(i), "tracker_live_bytes": i * 10**9} for i in range(3000)]
    for fig in (charts.memory_figure(records, 8 * 10**9, 4 * 10**9), charts.loss_figure(records, 0.9),
                charts.throughput_figure(records),
                charts.memory_timeline(samples, [("training", 0.0)], 2**30)):
        assert json.loads(fig.to_json()) == json.loads(go.Figure.to_json(fig))
        assert len(fig.data[0].x) <= 2000


def test_compare_bars_show_the_saving_and_oom(compare_rows):
    fig = charts.compare_bars(compare_rows, "memory", "full")
    by = {t.name: t for t in fig.data}
    assert list(by) == ["traditional", "strong baseline", "optimized"]
    assert list(by["optimized"].x) == ["512", "1024"] and list(by["optimized"].y) == [0.1, 0.15]  # GB
    assert by["optimized"].text[0] == "-75%" and by["strong baseline"].text[0] == "-25%"
    assert by["traditional"].text[1] == "OOM" and "tracker" in fig.layout.yaxis.title.text


def test_ablation_waterfall_adds_up_to_optimized(compare_rows):
    fig = charts.ablation_waterfall(compare_rows, "full", 512)
    wf = fig.data[0]
    assert list(wf.x) == ["traditional", "sdpa alone", "loss_chunk alone", "combined (interaction)",
                          "optimized"]
    assert list(wf.y)[:3] == pytest.approx([0.4, -0.1, -0.15])  # GB
    assert sum(list(wf.y)[:4]) == pytest.approx(0.1)  # the bars land on optimized's peak
    assert list(wf.text)[1:3] == ["-0.100", "-0.150"]
    assert "no traditional row" in charts.ablation_waterfall(compare_rows, "full", 1024).layout.title.text


def test_speed_bars_and_self_contained_report(tmp_path, compare_rows):
    fig = charts.speed_bars(compare_rows, "full")
    by = {t.name: t for t in fig.data}
    assert list(by["optimized"].y) == [250.0] and by["optimized"].text[0] == "2.50x"
    page = charts.write_compare_report(compare_rows, tmp_path / "r.html").read_text()
    assert page.count("<script src=") == 0 and "Plotly" in page and "ablation: full 512" in page


def test_live_curves_go_as_float32_and_mark_samples_only_while_few():
    import json

    from lora_gui.ui.series import MAX_POINTS

    few = charts.memory_timeline([{"time": float(i), "tracker_live_bytes": i * 10**9} for i in range(10)],
                                 [("training", 0.0)])
    assert few.data[0].mode == "lines+markers" and few.data[0].y.dtype == np.float32
    samples = [{"time": float(i), "tracker_live_bytes": i * 10**9} for i in range(5000)]
    many = charts.memory_timeline(samples, [("training", 0.0)])
    sent = json.loads(many.to_json())["data"][0]
    assert many.data[0].mode == "lines" and len(many.data[0].x) <= MAX_POINTS
    assert sent["x"]["dtype"] == sent["y"]["dtype"] == "f4"
    assert float(many.data[0].y.max()) == 4999.0  # the peak survives the downsampling
