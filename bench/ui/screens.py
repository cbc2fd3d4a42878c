"""First-view screenshots of the dashboard as a new user meets it, at 1400 x 1000 in Debian's
Chromium (Playwright, no browser download): Train for a text and an image preset, Plan after a
plan, Compare after Measure, Runs with a failed run. Written to docs/screens/*.png.

    python -m bench.ui.screens [--out docs/screens] [--extra DIR] [--only SHOT ...]

A dashboard is started in a temporary folder (its own runs/), driven, and ended. ``--extra``
also saves the Train tab with a finished run's charts (not committed: a reviewer's check);
``--only`` takes just the named shots (e.g. ``--only runs-failed``; the page's first view is
always loaded, since every shot starts from it). Takes 3-6 minutes on a laptop CPU for all of
them (one short run, a failed one and a one-step comparison).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MINUTE = 60_000  # ms
VIEW = {"width": 1400, "height": 1000}
SHOTS = ("train-text", "train-image", "runs-failed", "compare", "plan")  # docs/screens/NAME.png, in order


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dashboard(cwd: Path) -> tuple[subprocess.Popen, str]:
    """app.py in ``cwd`` on a free port; returns (process, url) once it listens."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False"}
    log = (cwd / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("the dashboard did not start listening within 300 s")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux's /proc)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:  # the task ended meanwhile
                continue
            found += children
            todo += children
    return found


def end_dashboard(proc: subprocess.Popen) -> None:
    """Ends the dashboard and every run it launched. A run is a process in a session of its own
    (it outlives the dashboard by design), so its group is signalled apart; a second SIGTERM ends
    a run at once instead of after its checkpoint (lora_gui.cli.signals)."""
    groups = {proc.pid}
    for pid in _descendants(proc.pid):
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    alive = set(groups)
    for _ in range(2):
        for group in list(alive):
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                alive.discard(group)
        time.sleep(1)
    proc.wait(timeout=30)
    deadline = time.time() + 30  # s: a run's process ends within this once signalled twice
    while alive and time.time() < deadline:
        for group in list(alive):
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                alive.discard(group)
        time.sleep(0.5)
    for group in alive:
        os.killpg(group, signal.SIGKILL)


def wait_text(page, elem_id: str, words: str, minutes: float = 5) -> None:
    page.wait_for_function(
        "([id, w]) => { const el = document.getElementById(id); return el && el.innerText.includes(w); }",
        arg=[elem_id, words], timeout=int(minutes * MINUTE))


def set_field(page, name: str, value: str) -> None:
    """Sets a field at once, as a paste or autofill does, then leaves it (Tab)."""
    box = page.locator(f"#field-{name} input, #field-{name} textarea").first
    box.fill(value)
    box.press("Tab")


def settled(page, elem_id: str = "predicted", quiet_s: float = 6, minutes: float = 6) -> str:
    """The element's text once it has not changed for ``quiet_s`` seconds."""
    deadline, last, since = time.time() + minutes * 60, None, time.time()
    while time.time() < deadline:
        now = page.evaluate("id => (document.getElementById(id) || {innerText: ''}).innerText", elem_id)
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= quiet_s:
            break
        time.sleep(0.5)
    return last or ""


def start_run(page, name: str) -> None:
    page.locator("#run-name input, #run-name textarea").first.fill(name)
    page.click("#start")
    wait_text(page, "message", "Started")


def pick(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id} input").first
    box.click()
    box.fill(value)
    page.locator(f"ul[role='listbox'] li[aria-label='{value}']").first.click(timeout=10_000)


def shoot(page, path: Path) -> None:
    try:  # gradio dims a component while its update is pending: shoot once none is
        page.wait_for_function("() => !document.querySelector('.pending, .generating')", timeout=30_000)
    except Exception:  # a page that stays busy (a timer) is shot as it is
        print(f"{path.name}: the page still had a pending update after 30 s")
    page.wait_for_timeout(1500)  # the charts' last redraw (Plotly draws on the next frames)
    page.screenshot(path=str(path))
    print(f"wrote {path}")


def tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()
    page.evaluate("window.scrollTo(0, 0)")


def take(url: str, cwd: Path, out: Path, extra: Path | None, only: tuple[str, ...] = SHOTS) -> None:
    """Drives the dashboard at ``url`` through each shot in ``only`` (in SHOTS' order)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport=VIEW)
        page.set_default_timeout(2 * MINUTE)
        page.goto(url)
        page.wait_for_selector("#start", timeout=5 * MINUTE)
        wait_text(page, "predicted", "the run's own plan,")
        settled(page)
        if "train-text" in only:
            shoot(page, out / "train-text.png")
        if "train-image" in only:  # before any job: the status line would name it
            _train_image(page, out)
        if "runs-failed" in only:
            _failed_run(page, cwd, out)
        if extra is not None:
            _short_run(page, extra)
        if "compare" in only:
            _compare(page, out)
        if "plan" in only:
            tab(page, "Plan")
            page.click("#plan-button")
            wait_text(page, "plan-message", "fits", minutes=5)
            settled(page, "plan-message", quiet_s=3)
            shoot(page, out / "plan.png")
        browser.close()


def _train_image(page, out: Path) -> None:
    """The Train tab on an image preset (no job yet), then back on text-demo for the other shots."""
    pick(page, "preset", "image-768")
    wait_text(page, "predicted", "the run's own plan,", minutes=8)
    settled(page)
    shoot(page, out / "train-image.png")
    pick(page, "preset", "text-demo")
    # the run name changes with the panel's "Predicting…" (one update): the plan after it is text-demo's
    page.wait_for_function("() => document.querySelector('#run-name input, #run-name textarea').value"
                           " === 'text-demo'", timeout=MINUTE)
    wait_text(page, "predicted", "the run's own plan,", minutes=5)
    settled(page)


def _failed_run(page, cwd: Path, out: Path) -> None:
    """A run that fails after it starts (a data line that is not JSON: found by the run itself),
    then the Runs tab listing it with its reason."""
    (cwd / "notes.jsonl").write_text('{"text": "a fine line"}\nthis line is not JSON\n', encoding="utf-8")
    set_field(page, "data", str(cwd / "notes.jsonl"))
    wait_text(page, "differs", "notes.jsonl")
    settled(page)
    start_run(page, "bad-notes")
    wait_text(page, "status", "failed", minutes=5)
    tab(page, "Runs")
    page.click("#runs-refresh")
    wait_text(page, "runs-table", "bad-notes")
    shoot(page, out / "runs-failed.png")


def _short_run(page, extra: Path) -> None:
    """A short run's charts, with a 24 GB budget far above its curve."""
    tab(page, "Train")
    set_field(page, "data", "builtin")
    set_field(page, "max_seq_len", "128")
    set_field(page, "max_steps", "12")
    set_field(page, "budget_gb", "24")
    settled(page)
    start_run(page, "short")
    wait_text(page, "status", "completed", minutes=10)
    shoot(page, extra / "train-run.png")


def _compare(page, out: Path) -> None:
    """Compare after Measure (one step at 128 tokens per mode)."""
    tab(page, "Compare")
    wait_text(page, "compare-message", "Predicted")
    page.locator("#compare-measure-sizes input, #compare-measure-sizes textarea").first.fill("128")
    page.locator("#compare-steps input").fill("1")
    page.click("#compare-measure")
    wait_text(page, "compare-progress", "completed", minutes=10)
    page.wait_for_function("() => document.querySelector('#compare-table').innerText.includes('tracker')",
                           timeout=2 * MINUTE)
    page.locator("#compare-bars").scroll_into_view_if_needed()
    page.evaluate("document.getElementById('compare-bars').scrollIntoView({block: 'start'})")
    shoot(page, out / "compare.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screens")
    parser.add_argument("--extra", type=Path, default=None,
                        help="also save the Train tab with a finished run's charts here")
    parser.add_argument("--only", nargs="+", choices=SHOTS, default=list(SHOTS),
                        help="take only these shots (default: all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.extra is not None:
        args.extra.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lora-gui-screens-") as tmp:
        cwd = Path(tmp)
        proc, url = start_dashboard(cwd)
        try:
            take(url, cwd, args.out, args.extra, tuple(args.only))
        finally:
            end_dashboard(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
