"""The Train tab on one screen, in a real browser at 1400 x 1000 and 800 x 1000: the settings that
decide a run, the card picker, the predicted peak and the run buttons inside the first viewport;
the run's charts in view while it trains; the picked card remembered on reload. Helpers and the
server fixture come from test_dashboard.py (one server for this module)."""

from __future__ import annotations

import pytest

from lora_gui.ui.common import card_budget_gb
from tests.e2e import test_dashboard as dash
from tests.e2e.test_dashboard import (
    ARTIFACTS,
    CHROMIUM,
    MINUTE,
    pick,
    plot_traces,
    set_field,
    settled_plan,
    start_run,
    text_of,
    wait_text,
)

server = dash.server  # this module's own app server (module scope)
browser_present = dash.browser_present  # under CI a missing browser fails (autouse)

pytestmark = dash.pytestmark  # slow, integration; skipped without chromium except under CI
FIRST_SCREEN = ("preset", "card", "field-budget_gb", "field-task", "field-model", "field-data",
                "field-max_seq_len", "field-batch_size", "field-lr", "field-lora_rank", "field-max_steps",
                "predicted", "start", "stop", "resume", "longest")
RUN_CHARTS = ("memory-plot", "loss-plot", "throughput-plot")
BUDGET_24GB = str(card_budget_gb("24gb"))  # as the page's number field shows it


def open_page(pw, url: str, width: int):
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.set_default_timeout(2 * MINUTE)
    page.goto(url)
    page.wait_for_selector("#start", timeout=5 * MINUTE)
    wait_text(page, "predicted", "Predicted peak")
    return browser, page


def outside_first_screen(page, ids: tuple[str, ...]) -> dict[str, object]:
    """The elements (by id) whose box is not wholly inside the first viewport, with the box."""
    out = {}
    for elem_id in ids:
        box = page.locator(f"#{elem_id}").first.bounding_box()
        if box is None or box["y"] < 0 or box["y"] + box["height"] > 1000 or box["x"] < 0 \
                or box["x"] + box["width"] > page.viewport_size["width"]:
            out[elem_id] = box
    return out


@pytest.mark.parametrize("width", [1400, 800])
def test_the_decision_is_on_the_first_screen(server, width):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser, page = open_page(pw, server[0], width)
        try:
            assert page.evaluate("window.scrollY") == 0
            assert outside_first_screen(page, FIRST_SCREEN) == {}
            assert "% of the budget" in text_of(page, "predicted")  # the bar, with its source
            assert "simulated on this CPU" in text_of(page, "budget-note")
            assert "preset" in text_of(page, "differs")
            page.screenshot(path=str(ARTIFACTS / f"train-first-screen-{width}.png"))
        finally:
            browser.close()


def test_charts_beside_the_settings_while_a_run_trains(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = open_page(pw, server[0], 1400)
        try:
            set_field(page, "max_seq_len", "128")
            set_field(page, "max_steps", "200")
            wait_text(page, "differs", "max_steps = 200")
            start_run(page, "layout-run")
            assert "No training yet" not in text_of(page, "status")  # one status, in the same update
            wait_text(page, "status", "layout-run", minutes=0.1)
            page.wait_for_function(  # two steps drawn: the run is training
                "() => { const el = document.querySelector('#loss-plot .js-plotly-plot');"
                " const d = el && (el._fullData || el.data);"
                " return d && d.length && (d[0].x || []).length >= 2; }",
                timeout=5 * MINUTE)
            wait_text(page, "status", "ETA")
            assert outside_first_screen(page, (*RUN_CHARTS, "status", "start", "field-lr")) == {}
            page.screenshot(path=str(ARTIFACTS / "train-running-1400.png"))
            height = page.evaluate("document.documentElement.scrollHeight")
            (ARTIFACTS / "train-height-running-1400.txt").write_text(f"{height}\n")  # the report's figure
            print(f"Train tab page height at 1400 x 1000 with a run in progress: {height} px")
            page.click("#stop")
            wait_text(page, "status", "stopping", minutes=0.2)  # at once, not after the step
            wait_text(page, "status", "stopped", minutes=3)
            assert "ETA" not in text_of(page, "status") and "trained" in text_of(page, "status")
            # one unit on the page: the budget field's GB in the verdict, the status and the charts
            shown = " ".join(text_of(page, part) for part in ("predicted", "status", "memory-plot"))
            assert "MiB" not in shown and "GiB" not in shown and " GB" in shown, shown
            axis = page.evaluate("() => document.querySelector('#memory-plot .js-plotly-plot')"
                                 "._fullLayout.yaxis.title.text")
            assert axis.startswith("GB ("), axis
            page.set_viewport_size({"width": 800, "height": 1000})  # one column: charts below
            memory = page.locator("#memory-plot")
            memory.scroll_into_view_if_needed()
            assert memory.is_visible() and plot_traces(page, "loss-plot")
            assert memory.bounding_box()["y"] > page.locator("#start").bounding_box()["y"]
        finally:
            browser.close()


def _pick_card(page, picker: str, text: str) -> None:
    box = page.locator(f"#{picker} input").first
    box.click()
    box.fill(text)
    page.locator("ul[role='listbox'] li").filter(has_text=text).first.click()


def test_the_card_is_remembered_on_its_own_tab_and_changes_no_other_tab(server):
    """A card picked on Train sets Train's budget and comes back on reload; it changes neither
    Plan's card nor Plan's budget, and a card picked on Plan leaves Train's budget as it was."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = open_page(pw, server[0], 1400)
        try:
            _pick_card(page, "card", "24 GB consumer")
            page.wait_for_function(f"() => document.querySelector('#field-budget_gb input').value"
                                   f" === '{BUDGET_24GB}'", timeout=MINUTE)  # the card's memory in GB
            wait_text(page, "differs", "card 24gb")
            page.reload()
            page.wait_for_selector("#start", timeout=5 * MINUTE)
            page.wait_for_function("() => document.querySelector('#card input').value.includes('24 GB')",
                                   timeout=MINUTE)
            page.get_by_role("tab", name="Plan").click()
            page.wait_for_selector("#plan-card input", timeout=MINUTE)
            page.wait_for_timeout(1000)  # time for a copy to arrive, were there one
            assert "24 GB" not in page.locator("#plan-card input").first.input_value()
            assert page.locator("#plan-budget_gb input").first.input_value() != BUDGET_24GB
            _pick_card(page, "plan-card", "8 GB consumer")
            eight = str(card_budget_gb("8gb"))
            page.wait_for_function("() => document.querySelector('#plan-budget_gb input').value"
                                   f" === '{eight}'", timeout=MINUTE)
            page.get_by_role("tab", name="Train").click()
            page.wait_for_timeout(1000)
            assert page.locator("#field-budget_gb input").first.input_value() == BUDGET_24GB
            assert "24 GB" in page.locator("#card input").first.input_value()
        finally:
            browser.close()


def test_a_preset_change_never_shows_the_previous_presets_plan(server):
    """From the change on, the panel shows the new preset's settings being predicted, then their
    plan: never the plan of the preset it replaced (not even for a moment: every text the panel
    takes is recorded by a MutationObserver)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = open_page(pw, server[0], 1400)
        try:
            before = settled_plan(page)
            page.evaluate("""() => { window.shown = [];
                const el = document.getElementById('predicted');
                new MutationObserver(() => window.shown.push(el.innerText))
                    .observe(el, {subtree: true, childList: true, characterData: true}); }""")
            pick(page, "preset", "image-512")
            page.wait_for_function(
                "b => { const t = document.getElementById('predicted').innerText;"
                " return t.includes(\"the run's own plan,\") && t !== b; }", arg=before, timeout=5 * MINUTE)
            shown = [t for t in page.evaluate("window.shown") if t.strip()]
            assert shown and "Predicting for the preset image-512" in shown[0], shown[:3]
            assert before not in shown, "the previous preset's plan came back after the change"
        finally:
            browser.close()


def test_a_key_settings_help_reads_in_full_under_the_pointer(server):
    """The first screen's help is cut at two lines; resting the pointer on the field shows all of
    it (no text hidden), and it folds again when the pointer leaves."""
    from playwright.sync_api import sync_playwright

    hidden = """id => { const el = document.querySelector(`#${id} .info-text`)
        || document.querySelector(`#${id} [data-testid="block-info"]`) || null;
        return el ? el.scrollHeight - el.clientHeight : null; }"""
    with sync_playwright() as pw:
        browser, page = open_page(pw, server[0], 1400)
        try:
            ids = [i for i in ("field-lr", "field-lora_rank", "field-max_seq_len", "field-data")
                   if (page.evaluate(hidden, i) or 0) > 2]
            assert ids, "no key setting's help is cut: nothing to check"
            field = ids[0]
            page.mouse.move(5, 5)
            page.hover(f"#{field}")
            page.wait_for_timeout(300)
            assert page.evaluate(hidden, field) <= 1, f"#{field}'s help is still cut under the pointer"
        finally:
            browser.close()
