"""Charts people can read in a narrow column (no browser): legends below the plot, a budget far
above the curve named in a note instead of drawn as a line that flattens it, memory axes from
zero with plain ticks, samples without a figure left out (not drawn as 0 MiB), and the
comparison's titles and legends in a user's words. The browser checks of the same charts'
widths and clipping are in tests/e2e/test_readable.py."""

from __future__ import annotations

import numpy as np

from lora_gui.ui import charts
from lora_gui.ui.history import HISTORY
from lora_gui.units import MIB


def _records(n: int = 4, mib: float = 490.0) -> list[dict]:
    return [{"step": i + 1, "loss": 2.0 / (i + 1), "peak_bytes": int(mib * MIB), "memory_source": "tracker",
             "tokens_per_s": 900.0, "real_tokens": 90, "padded_tokens": 100, "seconds": 1.0}
            for i in range(n)]


def setup_function() -> None:
    HISTORY.__init__()  # curves are followed incrementally by name: each test starts afresh


def test_a_budget_far_above_the_curve_is_a_note_not_a_line():
    traces, layout = charts.memory_spec(_records(), budget_bytes=24 * 1024 * MIB,
                                        predicted_bytes=int(500 * MIB))
    names = [t["name"] for t in traces]
    assert not any(n.startswith("budget") for n in names) and "predicted peak" in names
    assert len(layout["shapes"]) == 1  # the predicted peak's line only
    notes = [a["text"] for a in layout["annotations"]]
    assert notes == ["budget (simulated VRAM): 25.77 GB (above the scale)"]
    near = charts.memory_spec(_records(), budget_bytes=int(1000 * MIB))[1]
    assert len(near["shapes"]) == 1 and not near["annotations"]  # near: drawn as a line


def test_the_axis_holds_the_curve_and_the_predicted_peak_and_only_a_budget_goes_off_scale():
    """The predicted peak is always drawn, whatever the samples so far (the first ones can be far
    below it); a budget is judged against the higher of the curve and the predicted peak."""
    few = _records(1, mib=20.0)  # one early sample, 5x below the prediction
    traces, layout = charts.memory_spec(few, predicted_bytes=int(100 * MIB))
    assert "predicted peak" in [t["name"] for t in traces] and not layout["annotations"]
    assert len(layout["shapes"]) == 1  # the predicted peak's line
    traces, layout = charts.memory_spec(few, budget_bytes=int(250 * MIB), predicted_bytes=int(100 * MIB))
    assert {"budget (simulated VRAM)", "predicted peak"} <= {t["name"] for t in traces}  # 2.5x: drawn
    traces, layout = charts.memory_spec(few, budget_bytes=int(400 * MIB), predicted_bytes=int(100 * MIB))
    notes = [a["text"] for a in layout["annotations"]]  # 4x the prediction: named, not drawn
    assert len(notes) == 1 and notes[0].startswith("budget") and "above the scale" in notes[0], notes
    assert "budget (simulated VRAM)" not in {t["name"] for t in traces}
    samples = [{"time": 1.0, "tracker_live_bytes": 10 * MIB}]
    traces, layout = charts.timeline_spec(samples, [("training", 0.0)], 24 * 1024 * MIB, int(100 * MIB))
    assert [t["name"] for t in traces][-1] == "predicted peak" and len(layout["annotations"]) >= 1


def test_memory_axes_start_at_zero_with_plain_ticks():
    for _, layout in (charts.memory_spec(_records()), charts.timeline_spec([], [], 24 * 1024 * MIB)):
        assert layout["yaxis"]["rangemode"] == "tozero" and layout["yaxis"]["tickformat"] == ",~g"


def test_legends_sit_below_narrow_charts():
    for _, layout in (charts.memory_spec(_records()), charts.loss_spec(_records(), 0.6),
                      charts.throughput_spec(_records()), charts.timeline_spec([], [])):
        legend = layout["legend"]
        assert legend["orientation"] == "h" and legend["yref"] == "container" and legend["y"] == 0
        assert layout["margin"]["b"] >= 70  # room for the axis title and the legend under it


def test_samples_without_the_figure_are_left_out_not_drawn_as_zero():
    samples = [{"time": 1.0, "tracker_live_bytes": 100 * MIB}, {"time": 2.0, "rss_bytes": 5 * MIB},
               {"time": 3.0, "tracker_live_bytes": 120 * MIB}]
    traces, _ = charts.timeline_spec(samples, [("training", 0.0)])
    ys = np.asarray(traces[0]["y"], dtype=float)
    assert 0.0 not in ys.tolist() and np.isnan(ys[1])
    records = _records(2)
    del records[1]["tokens_per_s"]  # a step without a measured speed
    speed = np.asarray(charts.throughput_spec(records)[0][0]["y"], dtype=float)
    assert np.isnan(speed[1])


def test_compare_titles_speak_to_users_and_legends_are_below():
    rows = [{"question": "memory", "data": "full", "mode": m, "seq_len": 512, "status": "ok",
             "peak_bytes": int(p * MIB), "memory_source": "tracker"}
            for m, p in (("traditional", 900), ("strong_baseline", 700), ("optimized", 500))]
    bars = charts.compare_bars(rows, "memory", "full")
    title = bars.layout.title.text
    assert "question" not in title and "Peak memory per mode" in title and "tracker" in title
    assert bars.layout.legend.orientation == "h" and bars.layout.legend.yref == "container"
    lines = charts.mode_lines(rows + [{**r, "mode": f"{r['mode']} (measured)"} for r in rows])
    assert lines.layout.legend.orientation == "h" and lines.layout.margin.b >= 98  # two lines of entries


def test_a_card_far_above_the_compared_bars_is_named_in_a_note():
    from lora_gui.ui.tabs.compare_handlers import with_card

    rows = [{"question": "memory", "data": "full", "mode": "optimized", "seq_len": 128, "status": "ok",
             "peak_bytes": int(40 * MIB), "memory_source": "tracker"}]
    fig = with_card(charts.compare_bars(rows, "memory", "full"), "24gb")
    assert not fig.layout.shapes and "above the scale" in fig.layout.annotations[0].text


def test_measured_megabytes_beside_predicted_gigabytes_get_a_log_axis():
    rows = [{"question": "memory", "data": "full", "mode": "optimized", "seq_len": n, "status": "ok",
             "peak_bytes": int(p * MIB), "memory_source": s}
            for n, p, s in ((128, 31, "tracker"), (4096, 18_000, "predicted"))]
    assert charts.mode_lines(rows).layout.yaxis.type == "log"
    assert charts.mode_lines(rows[:1]).layout.yaxis.type != "log"
