"""The Train tab's live charts in a real browser: a tick adds the new points to the chart already
on the page (the same Plotly div, not a new one), and a page reloaded mid-run shows the whole
history at once, then keeps taking new points."""

from __future__ import annotations

from tests.e2e import test_dashboard as dash
from tests.e2e.test_dashboard import MINUTE, plot_traces, set_field, start_run, wait_text
from tests.e2e.test_train_layout import open_page

server = dash.server  # this module's own app server (module scope)
browser_present = dash.browser_present  # under CI a missing browser fails (autouse)

pytestmark = dash.pytestmark  # slow, integration; skipped without chromium except under CI

POINTS = """id => { const el = document.querySelector('#' + id + ' .js-plotly-plot');
                    const d = el && el._fullData;
                    return d && d.length ? (d[0].x || []).length : 0; }"""  # in the browser, to wait on
COUNTS = "() => [window.loraLive.whole, window.loraLive.parts]"  # charts the page got whole / in part
MARK = "() => { document.querySelector('#loss-plot .js-plotly-plot').dataset.mark = 'kept'; }"


def _points(page, chart: str = "loss-plot") -> int:
    return (plot_traces(page, chart) or [0])[0]


def _wait_points(page, at_least: int, chart: str = "loss-plot", minutes: float = 5) -> int:
    page.wait_for_function(f"() => ({POINTS})('{chart}') >= {at_least}", timeout=int(minutes * MINUTE))
    return _points(page, chart)


def test_ticks_extend_the_same_chart_and_a_reload_gets_the_history(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = open_page(pw, server[0], 1400)
        try:
            set_field(page, "max_seq_len", "64")
            set_field(page, "max_steps", "400")
            wait_text(page, "differs", "max_steps = 400")
            start_run(page, "live-charts")
            first = _wait_points(page, 2)
            for chart in ("memory-plot", "throughput-plot"):
                assert _points(page, chart) >= 1, f"{chart} shows nothing"
            # mark the chart's div: a chart drawn anew would be a new div without the mark
            page.evaluate(MARK)
            counts = page.evaluate(COUNTS)
            later = _wait_points(page, first + 2)
            assert page.evaluate("() => document.querySelector('#loss-plot .js-plotly-plot')"
                                 ".dataset.mark") == "kept"
            assert later >= first + 2
            whole, parts = (now - before for now, before in zip(page.evaluate(COUNTS), counts))
            assert parts >= 2 and whole <= 2, (whole, parts)  # new points each tick, not whole charts

            page.reload()
            page.wait_for_selector("#start", timeout=5 * MINUTE)
            reloaded = _wait_points(page, later)  # the whole history at once, then new points
            assert reloaded >= later
            page.evaluate(MARK)
            _wait_points(page, reloaded + 1)
            assert page.evaluate("() => document.querySelector('#loss-plot .js-plotly-plot')"
                                 ".dataset.mark") == "kept"
            xs = page.evaluate("() => Array.from(document.querySelector('#loss-plot .js-plotly-plot')"
                               "._fullData[0].x)")
            assert xs == list(range(1, len(xs) + 1))  # every step once, in order, none lost
            names = page.evaluate("() => document.querySelector('#memory-plot .js-plotly-plot')"
                                  "._fullData.map(t => t.name)")
            assert "live memory (tracker)" in names  # the memory figure names its source
            page.locator("#more-charts").get_by_text("More charts").first.click()  # drawn once open
            # a CPU run measures the first steps of each step shape: the peak chart draws those
            assert _wait_points(page, 2, chart="step-peak-plot", minutes=1) >= 2
            peak_names = page.evaluate("() => document.querySelector('#step-peak-plot .js-plotly-plot')"
                                       "._fullData.map(t => t.name)")
            assert any("measured steps only" in n for n in peak_names), peak_names
            page.click("#stop")
            wait_text(page, "status", "stopped", minutes=3)
        finally:
            browser.close()
