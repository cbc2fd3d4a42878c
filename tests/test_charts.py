from lora_gui.ui import charts


def rec(step, peak, loss=3.0):
    return {"step": step, "peak_bytes": peak, "memory_source": "tracker", "loss": loss,
            "tokens_per_s": 100.0, "real_tokens": 50, "padded_tokens": 100}


def test_memory_figure_has_points_budget_and_source():
    fig = charts.memory_figure([rec(1, 2**20), rec(2, 3 * 2**20)], budget_bytes=8 * 2**20,
                               predicted_bytes=4 * 2**20)
    peak = fig.data[0]
    assert list(peak.y) == [1.0, 3.0] and "tracker" in peak.name
    assert any("simulated" in (t.name or "") for t in fig.data)
    shapes = [s.y0 for s in fig.layout.shapes]
    assert 8.0 in shapes and 4.0 in shapes
    assert "tracker" in fig.layout.yaxis.title.text


def test_memory_figure_without_budget_or_data():
    fig = charts.memory_figure([])
    assert len(fig.data) == 1 and len(fig.data[0].x) == 0 and not fig.layout.shapes


def test_loss_and_throughput_figures():
    records = [rec(1, 1, 4.0), rec(2, 1, 3.5)]
    assert list(charts.loss_figure(records).data[0].y) == [4.0, 3.5]
    thr = charts.throughput_figure(records)
    assert list(thr.data[1].y) == [0.5, 0.5]


def test_breakdown_figure_stacks_categories_and_overheads():
    fig = charts.breakdown_figure({"frozen_weights": 2**20, "activations": 3 * 2**20},
                                  {"cuda_context": 2**20, "allocator_rounding": 0}, budget_bytes=8 * 2**20)
    names = [t.name for t in fig.data]
    assert names[0] == "frozen_weights" and "overhead: cuda_context" in names
    assert "overhead: allocator_rounding" not in names  # zero overheads are not drawn
    assert fig.layout.barmode == "stack" and fig.layout.shapes[0].y0 == 8.0
