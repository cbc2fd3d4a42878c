"""A run started from the dashboard outlives it, in a real browser: the dashboard's process is
killed with SIGKILL mid-run, the run keeps training, and a dashboard started again on the same
runs folder shows it live, stops it from its Stop button, and has every step's record once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lora_gui.engine.core.lock import lock_is_live
from tests.e2e.test_dashboard import (  # noqa: F401  (browser_present: the CI check)
    ARTIFACTS,
    CHROMIUM,
    IN_CI,
    MINUTE,
    ROOT,
    browser_present,
    end_live_runs,
    free_port,
    set_field,
    start_run,
    text_of,
    wait_text,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.skipif(
    CHROMIUM is None and not IN_CI, reason="chromium not installed (apt-get install chromium)")]


def _serve(cwd: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False"}
    log = (cwd / f"server-{port}.log").open("w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.5)
    proc.kill()
    pytest.fail("the app did not start listening within 300 s")


def _steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _wait(predicate, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _open(pw, url: str):
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.set_default_timeout(2 * MINUTE)
    page.goto(url)
    page.wait_for_selector("#start", timeout=5 * MINUTE)
    return browser, page


def test_a_run_outlives_a_killed_dashboard_and_a_new_one_shows_it_live(tmp_path):
    from playwright.sync_api import sync_playwright

    run = tmp_path / "runs" / "outlive"
    first, url = _serve(tmp_path)
    second = None
    try:
        with sync_playwright() as pw:
            browser, page = _open(pw, url)
            wait_text(page, "predicted", "the run's own plan,")
            set_field(page, "max_steps", "100000")  # longer than the test: it is stopped below
            set_field(page, "max_seq_len", "64")
            start_run(page, "outlive")
            _wait(lambda: len(_steps(run)) >= 2, 300, "the run's first steps")
            browser.close()
        first.send_signal(signal.SIGKILL)  # the dashboard dies mid-run
        first.wait()
        seen = len(_steps(run))
        _wait(lambda: len(_steps(run)) > seen + 2, 120, "steps after the dashboard died")
        assert lock_is_live(run)

        second, url = _serve(tmp_path)  # a dashboard started again on the same runs folder
        with sync_playwright() as pw:
            browser, page = _open(pw, url)
            wait_text(page, "status", "outlive", minutes=2)
            wait_text(page, "status", "running", minutes=2)
            before = len(_steps(run))
            _wait(lambda: len(_steps(run)) > before, 120, "the followed run to keep going")
            page.click("#stop")
            wait_text(page, "status", "stopped", minutes=5)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "outlive.png"), full_page=True)
            browser.close()
        steps = _steps(run)
        assert steps == list(range(1, len(steps) + 1))  # every step's record once, none lost
        assert json.loads((run / "run.json").read_text())["status"] == "stopped"
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        end_live_runs(tmp_path / "runs")  # never leave a training process behind
