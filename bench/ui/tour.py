"""README's three-minute tour, timed as a new user follows it, in Debian's Chromium (Playwright, no
browser download) at 1400 x 1000.

    python -m bench.ui.tour [--out bench/results/tables/readme_tour.json] [--demo-wait-min 60]
        [--measure-wait-min 30]

A dashboard is started as ``make run`` starts it (``app.py``), but on a free port and in a
temporary working folder (its own runs/), and ended when the tour ends, failed or not. The tour
is the order a reader takes: open the page (Train, text-demo), wait for the plan, press Start and
watch the charts fill, close the page and open it again (the run goes on); while the demo trains,
Plan llama-3.1-8b on a 24 GB card at 2048 tokens, again with nf4, and Longest that fits; open
Compare (predicted rows); once the demo has ended (or, past ``--demo-wait-min``, been stopped, as
recorded), ask Try a prompt, then press Measure on Compare with its defaults.

Each action records the seconds until the page answered (polled every 0.25 s, so answers are
timed to about that), what the page showed, and the checks of README's words that the page did
not bear out. The README text of each step is read from README.md itself. Prints the table and
writes the results file stamped with the commit (bench.common.write_results).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import RESULTS, markdown_table, write_results
from bench.ui.screens import MINUTE, ROOT, VIEW, end_dashboard, pick, start_dashboard, tab

OUT = RESULTS / "tables" / "readme_tour.json"
PLAN_MODEL, PLAN_CARD, PLAN_LENGTH = "llama-3.1-8b", "24 GB consumer card (RTX 3090 / 4090): 25.35 GB", "2048"
PROMPT = "Enter the duke, and"  # the Try tab's prompt (the demo trains on Shakespeare's comedies)
POLL_S = 0.25
DETAILS = "Predicted peak by category and micro-batch per bucket"  # the Train tab's accordion


def readme_steps(readme: Path = ROOT / "README.md") -> list[str]:
    """The tour's numbered steps as README.md words them (one string each, lines joined)."""
    text = readme.read_text(encoding="utf-8")
    section = text.split("## A three-minute tour", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d+\. )", section)[1:]
    steps = [" ".join(line.strip() for line in item.split("\n\n")[0].splitlines()) for item in items]
    if len(steps) != 3:
        raise SystemExit(f"README.md: the tour has {len(steps)} numbered steps, this script follows 3")
    return steps


class Tour:
    """What the tour saw: each action with its seconds, what the page showed and the README words
    it did not bear out."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.actions: list[dict[str, Any]] = []
        self.mismatches: dict[int, list[str]] = {1: [], 2: [], 3: []}

    def text(self, elem_id: str) -> str:
        return self.page.evaluate("id => (document.getElementById(id) || {innerText: ''}).innerText", elem_id)

    def until(self, step: int, did: str, ready: Callable[[], bool], limit_s: float,
              shown: Callable[[], str] | None = None, t0: float | None = None) -> float | None:
        """Polls ``ready`` until true or ``limit_s``; records the seconds since ``t0`` (default:
        now) and what ``shown`` reads. Returns the seconds, or None when the page never answered."""
        t0 = time.monotonic() if t0 is None else t0
        answered = None
        while time.monotonic() - t0 < limit_s:
            try:
                if ready():
                    answered = time.monotonic() - t0
                    break
            except Exception:  # the page is between renders: try again at the next poll
                pass
            time.sleep(POLL_S)
        seen = ""
        if shown is not None:
            try:
                seen = " ".join(shown().split())[:400]
            except Exception as err:  # what the page showed is a note; the timing stands
                seen = f"(not readable: {type(err).__name__})"
        seconds = None if answered is None else round(answered, 1)
        self.actions.append({"step": step, "did": did, "answered_s": seconds, "shown": seen})
        print(f"  step {step}: {did}: " + (f"{seconds} s" if seconds is not None else "no answer"),
              flush=True)
        if answered is None:
            self.mismatch(step, f"{did}: the page did not answer within {limit_s:.0f} s")
        return answered

    def has(self, elem_id: str, *words: str) -> bool:
        """Whether the element's text holds any of ``words``."""
        now = self.text(elem_id)
        return any(w in now for w in words)

    def mismatch(self, step: int, what: str) -> None:
        self.mismatches[step].append(what)
        print(f"  step {step}: NOT AS README SAYS: {what}", flush=True)

    def check(self, step: int, ok: bool, what: str) -> None:
        if not ok:
            self.mismatch(step, what)


def chart_points(page: Any, chart_id: str) -> dict[str, int]:
    """{trace name: points drawn} of one of the Train tab's live charts."""
    return page.evaluate("""id => {
        const div = document.querySelector('#' + id + ' .live-plot');
        if (!div || !div.data) return {};
        const out = {};
        for (const t of div.data) out[t.name || '?'] = (t.y || []).filter(v => v !== null).length;
        return out; }""", chart_id)


def chart_notes(page: Any, chart_id: str) -> str:
    """The text of a live chart's notes (annotations, e.g. a budget far above the scale)."""
    return page.evaluate("""id => {
        const div = document.querySelector('#' + id + ' .live-plot');
        const notes = div && div.layout && div.layout.annotations || [];
        return notes.map(a => a.text || '').join(' | '); }""", chart_id)


def answered(message: str) -> bool:
    """Whether the Try tab's message is its answer: not empty, not a model still generating, and
    not gradio's own timer of a pending event ("0.2s", "1.3/9.0s")."""
    message = message.strip()
    timer = re.fullmatch(r"[\d.]+(/[\d.]+)?\s*s", message)
    return bool(message) and "generating" not in message and not timer


def visible(page: Any, selector: str) -> bool:
    return page.locator(selector).first.is_visible()


def open_dashboard(tour: Tour, url: str, step: int, did: str) -> None:
    page = tour.page
    t0 = time.monotonic()
    page.goto(url)
    tour.until(step, did, lambda: visible(page, "#start"), 5 * 60, t0=t0,
               shown=lambda: page.locator("#preset input").first.input_value())


def train_first_view(tour: Tour) -> None:
    """Step 1 up to Start: the preset, the quick estimate, then the run's own plan."""
    page, t0 = tour.page, time.monotonic()
    firsts: list[str] = []

    def planned() -> bool:
        now = tour.text("predicted")
        if now and (not firsts or firsts[-1] != now):
            firsts.append(now)
        return "the run's own plan," in now

    tour.check(1, page.locator("#preset input").first.input_value() == "text-demo",
               "the Train tab does not open on the text-demo preset")
    tour.until(1, "the predicted peak under the settings (the run's own plan)", planned, 5 * 60, t0=t0,
               shown=lambda: tour.text("predicted"))
    tour.check(1, any("quick estimate" in f for f in firsts),
               "no quick estimate was seen before the run's own plan")
    plan = tour.text("predicted")
    tour.check(1, "budget" in plan and "GB" in plan,
               "the panel does not show the peak against a budget in GB")
    details = page.locator("#plan-details").get_by_text(DETAILS, exact=True)
    tour.check(1, details.count() > 0, f"no '{DETAILS}' under the charts")
    if details.count():
        details.first.click()  # opened as the reader does, then closed again
        tour.until(1, f"opened '{DETAILS}': the micro-batch per length bucket",
                   lambda: "tokens" in tour.text("predicted-buckets"), 60,
                   shown=lambda: tour.text("predicted-buckets"))
        details.first.click()


def start_demo(tour: Tour) -> float:
    """Presses Start; times the message, the first step on the charts and the status' ETA."""
    page = tour.page
    t0 = time.monotonic()
    page.click("#start")
    tour.until(1, "Start: the message under the buttons", lambda: "Started" in tour.text("message"), 60,
               t0=t0, shown=lambda: tour.text("message"))
    tour.until(1, "Start: the first step on the loss and memory charts",
               lambda: chart_points(page, "loss-plot") and sum(chart_points(page, "loss-plot").values()) > 0,
               10 * 60, t0=t0, shown=lambda: tour.text("status"))
    memory = chart_points(page, "memory-plot")
    names = " ".join(memory).lower()
    notes = chart_notes(page, "memory-plot")
    tour.check(1, "budget" in names or "budget" in notes.lower(),
               f"the memory chart shows no budget (its traces: {sorted(memory)}; its notes: {notes})")
    tour.check(1, "predict" in names, f"the memory chart draws no prediction (its traces: {sorted(memory)})")
    tour.check(1, sum(chart_points(page, "throughput-plot").values()) > 0,
               "the throughput chart has no point")
    tour.check(1, "ETA" in tour.text("status"), "the status shows no time left")
    return t0


def reopen(tour: Tour, browser: Any, url: str) -> Tour:
    """Closes the page and opens the dashboard again: the run goes on and the page picks it up."""
    tour.page.close()
    page = browser.new_page(viewport=VIEW)
    page.set_default_timeout(2 * MINUTE)
    again = Tour(page)
    again.actions, again.mismatches = tour.actions, tour.mismatches
    open_dashboard(again, url, 1, "closed the page and opened the dashboard again")
    again.until(1, "the reopened page shows the run training",
                lambda: "training" in again.text("status") or "completed" in again.text("status"), 60,
                shown=lambda: again.text("status"))
    return again


def plan_tab(tour: Tour) -> None:
    """Step 2: a bundled llama-3.1-8b on a 24 GB card at 2048 tokens, then nf4, then Longest."""
    page = tour.page
    tab(page, "Plan")
    model = page.get_by_label("Model (bundled config, builtin or local dir)")
    model.click()
    model.fill(PLAN_MODEL)
    page.locator(f"ul[role='listbox'] li[aria-label='{PLAN_MODEL}']").first.click(timeout=10_000)
    pick(page, "plan-card", PLAN_CARD)
    length = page.locator("#plan-max_seq_len input").first
    length.fill(PLAN_LENGTH)
    length.press("Tab")
    t0 = time.monotonic()
    page.click("#plan-button")
    tour.until(2, f"Plan: {PLAN_MODEL}, {PLAN_CARD.split(':')[0]}, {PLAN_LENGTH} tokens",
               lambda: "Predicted peak" in tour.text("plan-message") or "Error" in tour.text("plan-message"),
               5 * 60, t0=t0, shown=lambda: tour.text("plan-message"))
    message = tour.text("plan-message")
    tour.check(2, "Error" not in message, f"Plan answered with an error: {message[:200]}")
    chart = page.evaluate("() => { const d = document.querySelector('#plan-chart .js-plotly-plot');"
                          " return d && d.data ? d.data.map(t => t.name || '').join(' | ') : ''; }").lower()
    for part in ("frozen", "lora", "grad", "optimizer", "activation", "cuda"):
        tour.check(2, part in chart, f"the breakdown chart has no '{part}' part (its parts: {chart[:200]})")
    tour.check(2, page.locator("table").filter(has_text="What fits where").count() > 0
               or "What fits where" in page.inner_text("body"), "no table of what fits on other cards")
    quant = page.locator("#plan-quantization input").first
    quant.click()
    quant.fill("nf4")
    page.locator("ul[role='listbox'] li[aria-label='nf4']").first.click(timeout=10_000)
    t0 = time.monotonic()
    page.click("#plan-button")
    tour.until(2, "Plan again with Quantization nf4",
               lambda: (tour.has("plan-message", "Predicted peak")
                        and not tour.has("plan-message", "Settings changed")),
               5 * 60, t0=t0, shown=lambda: tour.text("plan-message"))
    t0 = time.monotonic()
    page.click("#plan-longest")
    tour.until(2, "Longest that fits (nf4)", lambda: len(tour.text("plan-longest-message").strip()) > 20,
               10 * 60, t0=t0, shown=lambda: tour.text("plan-longest-message"))


def compare_tab(tour: Tour) -> None:
    """Step 3, first half: the predicted comparison the tab opens on."""
    page = tour.page
    t0 = time.monotonic()
    tab(page, "Compare")
    tour.until(3, "opened Compare: the predicted comparison",
               lambda: tour.has("compare-table", "traditional"),
               3 * 60, t0=t0, shown=lambda: tour.text("compare-message"))
    table = tour.text("compare-table").lower()
    for mode in ("traditional", "baseline", "optimized"):
        tour.check(3, mode in table, f"the predicted comparison has no '{mode}' row")
    lengths = set(re.findall(r"\b(\d{3,5})\b", table))
    tour.check(3, len(lengths) >= 2, "the predicted comparison is not over several lengths")


def try_tab(tour: Tour) -> None:
    """Step 1's end: the Try tab answers a prompt with the base model and the adapter."""
    page = tour.page
    tab(page, "Try")
    tour.until(1, "opened Try: the demo run listed",
               lambda: "text-demo" in page.locator("#try-run input").first.input_value(), 60,
               shown=lambda: page.locator("#try-run input").first.input_value())
    page.locator("#try-prompt textarea").first.fill(PROMPT)
    t0 = time.monotonic()
    page.click("#try-generate")
    def answers() -> list[str]:
        return [page.locator(f"#{i} textarea").first.input_value() for i in ("try-base", "try-adapter")]

    tour.until(1, f"Try: Generate for '{PROMPT}' (base and adapter side by side)",
               lambda: answered(tour.text("try-message")),
               5 * 60, t0=t0, shown=lambda: " || ".join([*answers(), tour.text("try-message")]))
    tour.check(1, tour.has("try-message", "Done") and all(a.strip() for a in answers()),
               f"Try did not answer with both models: {tour.text('try-message')[:200]}")


def measure(tour: Tour, limit_min: float) -> None:
    """Step 3's end: Measure with the tab's defaults, once the demo run has finished."""
    page = tour.page
    tab(page, "Compare")
    t0 = time.monotonic()
    page.click("#compare-measure")
    tour.until(3, "Measure (the tab's defaults): the message",
               lambda: tour.has("compare-progress", "Measuring", "Error"), 60, t0=t0,
               shown=lambda: tour.text("compare-progress"))
    tour.until(3, "Measure: the measured rows beside the predicted ones",
               lambda: tour.has("compare-progress", "completed", "failed"), limit_min * 60, t0=t0,
               shown=lambda: tour.text("compare-progress"))
    table = tour.text("compare-table").lower()
    tour.check(3, "tracker" in table or "cuda_allocator" in table, "no measured row in the table")
    tour.check(3, "predicted" in table, "no predicted row beside the measured ones")


def follow(url: str, demo_wait_min: float, measure_min: float) -> dict[str, Any]:
    """The whole tour against the dashboard at ``url``; returns what the results file holds."""
    from playwright.sync_api import sync_playwright

    began = time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport=VIEW)
        page.set_default_timeout(2 * MINUTE)
        tour = Tour(page)
        demo: dict[str, Any] = {}
        try:
            open_dashboard(tour, url, 1, "opened the dashboard: the Train tab")
            train_first_view(tour)
            started = start_demo(tour)
            tour = reopen(tour, browser, url)
            plan_tab(tour)
            compare_tab(tour)
            tab(tour.page, "Train")
            done = tour.until(1, "waited for the demo run to end (from Start)",
                              lambda: tour.has("status", "completed", "failed", "out_of_memory"),
                              demo_wait_min * 60, t0=started, shown=lambda: tour.text("status"))
            if done is None:  # a reader who stops waiting: Stop saves the adapter so far
                t0 = time.monotonic()
                tour.page.click("#stop")
                tour.until(1, "Stop (the demo had not ended)",
                           lambda: tour.has("status", "stopped", "completed"), 10 * 60, t0=t0,
                           shown=lambda: tour.text("status"))
            status = tour.text("status")
            trained = re.search(r"trained (\d+) s", status)
            demo = {"start_to_end_s": None if done is None else round(done, 1),
                    "trained_s": int(trained.group(1)) if trained else None,
                    "status": " ".join(status.split())}
            tour.check(1, "completed" in status, f"the demo run did not complete: {demo['status'][:200]}")
            try_tab(tour)
            measure(tour, measure_min)
        except Exception as err:  # the tour stops; what it saw so far is written
            tour.mismatch(max(a["step"] for a in tour.actions) if tour.actions else 1,
                          f"the tour stopped: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
        finally:
            browser.close()
    return {"actions": tour.actions, "mismatches": {str(k): v for k, v in tour.mismatches.items()},
            "demo_run": demo, "tour_wall_s": round(time.monotonic() - began, 1)}


COLUMNS = ["step", "what the user did", "seconds until the page answered",
           "README's words the page did not bear out"]


def rows_of(body: dict[str, Any]) -> list[list[str]]:
    """The results table: each action with its seconds; a step's mismatches on its last action."""
    last = {a["step"]: i for i, a in enumerate(body["actions"])}
    rows = []
    for i, action in enumerate(body["actions"]):
        found = body["mismatches"][str(action["step"])] if last[action["step"]] == i else []
        seconds = "no answer" if action["answered_s"] is None else f"{action['answered_s']:.1f}"
        rows.append([str(action["step"]), action["did"], seconds, "; ".join(found) or "—"])
    return rows


def report(body: dict[str, Any]) -> str:
    demo = body["demo_run"]
    return "\n".join([markdown_table(COLUMNS, body["rows"]), "",
                      f"demo run: {demo.get('start_to_end_s')} s from Start to its end (the run's own "
                      f"training time: {demo.get('trained_s')} s); whole tour {body['tour_wall_s']} s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--demo-wait-min", type=float, default=60,
                        help="minutes to wait for the demo run to end; then Stop is pressed (recorded)")
    parser.add_argument("--measure-wait-min", type=float, default=30,
                        help="minutes to wait for Measure's rows")
    args = parser.parse_args(argv)
    steps = readme_steps()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lora-gui-tour-") as tmp:
        began = time.monotonic()
        proc, url = start_dashboard(Path(tmp))
        listening = time.monotonic() - began
        try:
            body = follow(url, args.demo_wait_min, args.measure_wait_min)
        finally:
            end_dashboard(proc)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m bench.ui.tour", *given])
    body = {"meta": {"command": command,
                     "machine": f"{os.cpu_count()} CPUs, no GPU, load average {load[0]:.1f} at the start"},
            "title": "README's three-minute tour, timed as a new user follows it",
            "columns": COLUMNS, "readme_steps": steps, "dashboard_listening_s": round(listening, 1), **body}
    body["rows"] = rows_of(body)
    print(report(body))
    print(f"wrote {write_results(args.out, body)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
