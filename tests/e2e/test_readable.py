"""The dashboard as a new user judges it, in a real browser at 1400 x 1000: bad data stops Start
with one message beside the data field (a value set at once, as a paste sets it, included) and a
run that fails after starting is listed on Runs with its reason; the live charts keep a usable
width with legends and titles whole and the memory axis scaled to what is drawn; the status and
messages follow the run to its end with the training time Runs shows; each task shows only its
own fields, panes and estimates. Helpers and the server fixture come from test_dashboard.py (one
server for this module)."""

from __future__ import annotations

import json
import os
import re
import time

from tests.e2e import test_dashboard as dash
from tests.e2e.test_dashboard import (
    ARTIFACTS,
    MINUTE,
    open_group,
    pick,
    set_field,
    settled_text,
    start_run,
    text_of,
    wait_text,
)

server = dash.server  # this module's own app server (module scope)
page = dash.page  # a page on it at 1400 x 1600, once the form is there
browser_present = dash.browser_present  # under CI a missing browser fails (autouse)
pytestmark = dash.pytestmark  # slow, integration; skipped without chromium except under CI
RUN_CHARTS = ("memory-plot", "loss-plot", "throughput-plot")
MIN_PLOT_PX = 120  # the plotting area of a live chart, legend and axes aside


def open_page(pw, url: str):
    """The Train tab at 1400 x 1000 (test_train_layout's), once it shows the run's own plan."""
    from tests.e2e.test_train_layout import open_page as first_view

    browser, page = first_view(pw, url, 1400)
    wait_text(page, "predicted", "the run's own plan,")
    return browser, page


def start_disabled(page) -> bool:
    return page.evaluate("() => document.querySelector('#start').disabled")


# The rows a table shows, one list of cell texts per row. gradio's table draws its rows as grid
# rows (role=row, cells role=gridcell) and keeps, beside them, a hidden sizing row (aria-hidden)
# made of each column's longest text, which measures the column widths: with two runs that row
# mixes them (one run's name and reason beside the other's figures), so it is left out here, as
# a screen reader leaves it out.
SHOWN_ROWS = """id => Array.from(document.querySelectorAll(`#${id} [role=row]`))
  .filter(row => !row.closest('[aria-hidden=true]'))
  .map(row => Array.from(row.querySelectorAll('[role=gridcell]')).map(cell => cell.innerText.trim()))
  .filter(cells => cells.length)"""


def shown_row(page, elem_id: str, name: str, minutes: float = 1) -> list[str]:
    """The cells of the row a table shows for ``name`` (its first cell), once it shows one."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    find = f"id => ({SHOWN_ROWS})(id).find(cells => cells[0] === {json.dumps(name)}) || null"
    try:
        return page.wait_for_function(find, arg=elem_id, timeout=int(minutes * MINUTE)).json_value()
    except PlaywrightTimeout:
        raise AssertionError(f"#{elem_id} shows no row for {name!r}; its rows: "
                             f"{page.evaluate(SHOWN_ROWS, elem_id)!r}") from None


def test_bad_data_blocks_start_and_a_run_that_fails_later_is_listed(server):
    from playwright.sync_api import sync_playwright

    url, cwd = server
    (cwd / "empty.txt").write_bytes(b"")
    (cwd / "binary.jsonl").write_bytes(b'{"text": "ok"}\n\x00\xff\xfe binary\n')
    cases = ((cwd / "missing.txt", "does not exist"), (cwd / "empty.txt", "is empty"),
             (cwd / "binary.jsonl", "is not UTF-8 (line 2)"))
    with sync_playwright() as pw:
        browser, page = open_page(pw, url)
        try:
            for path, words in cases:  # each value set at once (fill) and left with Tab
                set_field(page, "data", str(path))
                wait_text(page, "error-data", words, minutes=1)
                assert str(path) in text_of(page, "error-data")
                box = page.locator("#error-data").bounding_box()
                assert box["y"] + box["height"] <= 1000, f"the message is below the first view: {box}"
                page.wait_for_function("() => document.querySelector('#start').disabled", timeout=MINUTE)
                assert str(path) not in text_of(page, "predicted")  # said once, beside the field
            assert not (cwd / "runs" / "text-demo").exists()  # nothing written
            page.screenshot(path=str(ARTIFACTS / "bad-data-blocks-start.png"))
            # a file the form cannot judge (a line that is not JSON): the run finds it and fails
            (cwd / "notes.jsonl").write_text('{"text": "a fine line"}\nnot JSON\n', encoding="utf-8")
            set_field(page, "data", str(cwd / "notes.jsonl"))
            page.wait_for_function("() => !document.querySelector('#start').disabled", timeout=MINUTE)
            settled_text(page, "predicted", quiet_s=4)
            start_run(page, "bad-notes")
            wait_text(page, "status", "failed", minutes=5)
            assert "Error: error" not in text_of(page, "status")
            page.get_by_role("tab", name="Runs").click()
            page.click("#runs-refresh")
            row = shown_row(page, "runs-table", "bad-notes")
            assert row[1] == "failed" and row[-1].startswith("notes.jsonl:2"), row
            assert (cwd / "runs" / "bad-notes" / "config.json").is_file()  # not an empty folder
        finally:
            browser.close()


CHART_GEOMETRY = """id => {
  const outer = document.getElementById(id), div = outer.querySelector('.js-plotly-plot');
  const box = outer.getBoundingClientRect(), size = div._fullLayout._size;
  const rect = el => el ? el.getBoundingClientRect() : null;
  const plot = rect(div.querySelector('.nsewdrag'));
  const ys = div.data.filter(t => !/budget|predicted/.test(t.name || ''))
                     .flatMap(t => Array.from(t.y || [])).filter(Number.isFinite);
  return {plotWidth: size.w, chart: [box.left, box.right], plotBottom: plot.bottom,
          title: rect(div.querySelector('.gtitle')), legend: rect(div.querySelector('.legend')),
          entries: Array.from(div.querySelectorAll('.legend .legendtext')).map(rect),
          yRange: div._fullLayout.yaxis.range, dataMax: ys.length ? Math.max(...ys) : null};
}"""


def test_live_charts_are_readable_and_the_status_follows_the_run(server):
    from playwright.sync_api import sync_playwright

    url, cwd = server
    with sync_playwright() as pw:
        browser, page = open_page(pw, url)
        try:
            set_field(page, "max_seq_len", "128")
            set_field(page, "max_steps", "12")
            set_field(page, "budget_gb", "24")  # far above the run's ~100 MiB
            wait_text(page, "differs", "max_steps = 12")
            settled_text(page, "predicted", quiet_s=4)
            start_run(page, "readable")
            wait_text(page, "status", "completed", minutes=10)
            page.wait_for_timeout(3000)  # the last points drawn
            page.screenshot(path=str(ARTIFACTS / "readable-charts.png"))
            for chart in RUN_CHARTS:
                g = page.evaluate(CHART_GEOMETRY, chart)
                width = g["chart"][1] - g["chart"][0]  # the report's figures (pytest -s prints them)
                print(f"{chart}: plot area {g['plotWidth']:.0f} px wide of {width:.0f} px, y axis to "
                      f"{g['yRange'][1]:,.1f} for data up to {g['dataMax']:,.1f}")
                assert g["plotWidth"] >= MIN_PLOT_PX, (chart, g)
                left, right = g["chart"]
                assert left - 1 <= g["title"]["left"] and g["title"]["right"] <= right + 1, (chart, g)
                assert g["legend"]["top"] >= g["plotBottom"], (chart, g)  # below the plot
                for entry in g["entries"]:
                    assert left - 1 <= entry["left"] and entry["right"] <= right + 1, (chart, g)
            assert_memory_scaled_to_what_is_drawn(page, "memory-plot")
            # the message of the start is over once the run is: the status says how it ended
            try:
                page.wait_for_function(
                    "() => !document.getElementById('message').innerText.includes('Started')", timeout=MINUTE)
            except Exception:
                raise AssertionError(f"message: {text_of(page, 'message')!r}; "
                                     f"status: {text_of(page, 'status')!r}") from None
            status = text_of(page, "status")
            trained = re.search(r"trained (\d+) s", status).group(1)
            summary = json.loads((cwd / "runs" / "readable" / "run.json").read_text())
            assert int(trained) == round(summary["train_seconds"]), status
            page.get_by_role("tab", name="Runs").click()
            page.click("#runs-refresh")
            row = shown_row(page, "runs-table", "readable")
            assert row[1] == "completed" and trained in row, (row, status)  # the same duration on both tabs
        finally:
            browser.close()


MEMORY_SCALE = """id => {
  const div = document.querySelector(`#${id} .js-plotly-plot`);
  const drawn = div.data.flatMap(t => Array.from(t.y || [])).filter(Number.isFinite);
  return {names: div.data.map(t => t.name || ''), range: div._fullLayout.yaxis.range,
          drawnMax: drawn.length ? Math.max(...drawn) : null,
          notes: (div.layout.annotations || []).map(a => a.text || '')};
}"""
AXIS_HEADROOM = 1.15  # Plotly's autorange ends ~5% above the highest point drawn


def assert_memory_scaled_to_what_is_drawn(page, elem_id: str) -> None:
    """The memory axis holds everything drawn (the samples and the predicted peak) and ends just
    above it; a budget far above is not drawn but named in a note. Read from the chart as the
    page holds it, so it does not depend on how many samples reached the page."""
    chart = page.evaluate(MEMORY_SCALE, elem_id)
    top = chart["range"][1]
    assert "predicted peak" in chart["names"], chart
    assert not any(name.startswith("budget") for name in chart["names"]), chart  # not drawn
    assert chart["drawnMax"] and chart["drawnMax"] <= top <= AXIS_HEADROOM * chart["drawnMax"], chart
    assert any(n.startswith("budget") and "above the scale" in n for n in chart["notes"]), chart


def _run_folder(cwd, name: str, summary: dict, age_s: float) -> None:
    """A run folder as the engine leaves it (its settings and run.json), ``age_s`` seconds old."""
    from lora_gui.config import RunConfig

    folder = cwd / "runs" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(RunConfig().to_dict()))
    (folder / "run.json").write_text(json.dumps(summary))
    when = time.time() - age_s  # the table lists the newest first, by the folder's time
    os.utime(folder, (when, when))


def test_runs_table_shows_a_failed_run_and_the_next_run_each_on_its_own_row(server, page):
    """A failed run, then a run that completed: the Runs table shows two rows, each with its own
    name, state and figures, after the tab is opened and after Refresh."""
    cwd = server[1]
    _run_folder(cwd, "table-failed", {"status": "failed", "train_seconds": 0,
                                      "error": f"error: {cwd}/notes.jsonl:2: malformed JSON"}, 120)
    _run_folder(cwd, "table-good", {"status": "completed", "peak_bytes": 85 * 2**20, "eval_loss": 4.93851,
                                    "memory_source": "tracker", "train_seconds": 94.4}, 60)
    page.get_by_role("tab", name="Runs").click()  # the tab's own reload
    for _ in range(2):
        good = shown_row(page, "runs-table", "table-good")
        failed = shown_row(page, "runs-table", "table-failed")
        assert good[1:2] + good[4:] == ["completed", "0.0891", "tracker", "4.9385", "94", ""], good
        reason = "notes.jsonl:2: malformed JSON"  # the file by its name, without its folders
        assert failed[1] == "failed" and failed[4:] == ["", "", "", "", reason], failed
        names = [row[0] for row in page.evaluate(SHOWN_ROWS, "runs-table")]
        assert names.index("table-good") < names.index("table-failed"), names  # newest first
        page.click("#runs-refresh")
        page.wait_for_timeout(1500)
    page.screenshot(path=str(ARTIFACTS / "runs-failed-then-completed.png"))


def test_compare_titles_and_legends_are_whole(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = open_page(pw, server[0])
        try:
            page.get_by_role("tab", name="Compare").click()
            wait_text(page, "compare-message", "Predicted")
            page.wait_for_function("() => { const el = document.querySelector("
                                   "'#compare-lines .js-plotly-plot');"
                                   " return el && el.data && el.data.length >= 3; }", timeout=2 * MINUTE)
            for chart in ("compare-bars", "compare-lines"):
                g = page.evaluate(CHART_GEOMETRY, chart)
                left, right = g["chart"]
                whole = [e["width"] > 30 and left - 1 <= e["left"] and e["right"] <= right + 1
                         for e in g["entries"]]
                assert len(whole) >= 3 and all(whole), g
                title = page.evaluate("id => document.querySelector(`#${id} .gtitle`).textContent", chart)
                assert "question" not in title and "Peak memory" in title, title
        finally:
            browser.close()


def _finished_text_run(cwd) -> None:
    """A finished text run as the engine leaves it, with its adapter (no weights needed to list it)."""
    from lora_gui.config import RunConfig

    folder = cwd / "runs" / "try-text"
    (folder / "adapter").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(RunConfig().to_dict()))
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    (folder / "run.json").write_text(json.dumps({"status": "completed", "train_seconds": 3}))


def test_each_task_shows_only_its_own_fields_panes_and_estimates(server):
    from playwright.sync_api import sync_playwright

    url, cwd = server
    _finished_text_run(cwd)
    with sync_playwright() as pw:
        browser, page = open_page(pw, url)
        try:
            assert not page.locator("#samples").is_visible()  # a text run draws no pictures
            page.evaluate("""() => { window.shown = [];
                new MutationObserver(() => window.shown.push(document.getElementById('predicted').innerText))
                  .observe(document.getElementById('predicted'), {subtree: true, childList: true,
                                                                   characterData: true}); }""")
            pick(page, "preset", "image-768")
            page.wait_for_function(  # the image fields are drawn once the preset's update lands
                "() => { const el = document.querySelector('#field-resolution input');"
                " return el !== null && el.value === '768'; }", timeout=2 * MINUTE)
            wait_text(page, "predicted", "the run's own plan,", minutes=8)
            shown = page.evaluate("window.shown")
            verdicts = [t for t in shown if "fits" in t and "the run's own plan," not in t
                        and "whether a run fits" not in t]
            assert not verdicts, verdicts  # no quick-estimate verdict for pictures
            assert page.locator("#samples").is_visible()
            help_of = "id => document.getElementById(id).textContent"
            for group, title, field in (("lora", "LoRA", "lora_targets"),
                                        ("task", "Task, model and data", "eval_fraction"),
                                        ("memory", "Memory", "mode")):
                open_group(page, group, title, field)  # a closed group's fields are not on the page
            assert "q_proj" not in page.evaluate(help_of, "field-lora_targets")
            assert "pictures held out" in page.evaluate(help_of, "field-eval_fraction")
            assert "pad to max_seq_len" not in page.evaluate(help_of, "field-mode")
            page.get_by_role("tab", name="Try").click()
            page.wait_for_function(
                "() => document.querySelector('#try-run input').value.includes('try-text')", timeout=MINUTE)
            for pane in ("try-start", "try-base-image", "try-adapter-image"):  # after the pick's update
                page.locator(f"#{pane}").wait_for(state="hidden", timeout=MINUTE)
            assert page.locator("#try-base").is_visible() and page.locator("#try-adapter").is_visible()
        finally:
            browser.close()


def test_no_raw_translation_key_shows_when_an_event_ends(server):
    """gradio announces each finished event ("common.complete"); the page says it in words."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = open_page(pw, server[0])
        try:
            page.evaluate("""() => { window.keys = [];
                new MutationObserver(ms => { for (const m of ms) {
                    const t = m.target.textContent || '';
                    if (/common\\.\\w/.test(t)) window.keys.push(t); } })
                  .observe(document.body, {subtree: true, childList: true, characterData: true}); }""")
            page.get_by_role("tab", name="Runs").click()
            for _ in range(2):
                page.click("#runs-refresh")
                page.wait_for_timeout(1500)
            assert page.evaluate("window.keys") == []
        finally:
            browser.close()
