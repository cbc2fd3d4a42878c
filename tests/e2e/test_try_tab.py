"""The Try tab in a real browser (Debian's Chromium via Playwright): type, generate, both outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.test_dashboard import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    MINUTE,
    ROOT,
    browser_present,
    page,
    pytestmark,
    server,
    text_of,
    wait_text,
)


@pytest.fixture()
def chat_run(server, tmp_path):  # noqa: F811
    """A finished 2-step chat run in runs/chat under the app's working folder (the server's, which
    the Try tab lists: the server is shared by the module, its folder is not tmp_path)."""
    data = server[1] / "qa.jsonl"  # in the dashboard's working folder, which its pages may read
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n"
                            for q, a in [("what is ice", "frozen water."), ("what is rain", "falling water."),
                                         ("what is a wave", "a disturbance."), ("who are you", "a bot.")]))
    subprocess.run([sys.executable, "-m", "lora_gui", "train", "--quiet", "--out", "runs/chat",
                    "--set", f"data={data}", "--set", "max_steps=2", "--set", "batch_size=2",
                    "--set", "max_seq_len=64", "--set", "precision=fp32", "--set", "monitor_hz=0"],
                   cwd=server[1], env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                   stdout=subprocess.DEVNULL, timeout=600)
    return server[1] / "runs" / "chat"


def test_try_tab_generates_base_and_adapter_side_by_side(chat_run, server, page):  # noqa: F811
    page.get_by_role("tab", name="Try").click()
    page.click("#try-refresh")  # the run was trained after the page was built
    page.wait_for_function("() => { const box = document.querySelector('#try-run input');"
                           " return box && box.value.endsWith('chat'); }", timeout=MINUTE)
    page.locator("#try-prompt textarea").fill("what is ice")
    page.click("#try-generate")
    try:
        wait_text(page, "try-message", "Done", minutes=3)
    finally:
        page.screenshot(path=str(ARTIFACTS / "try.png"), full_page=True)
    base = page.locator("#try-base textarea").input_value()
    tuned = page.locator("#try-adapter textarea").input_value()
    assert base.strip() and tuned.strip(), (base, tuned)
    assert "chat template applied" in text_of(page, "try-message")
