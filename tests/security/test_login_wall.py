"""With --auth nothing answers without the login: every route the app serves (read from its own
router) is walked without a login and answers 401, 403 or 404, except the login form (the page
shell, which carries no API description, component or run list), its POST and static files."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator

import gradio as gr
import httpx
import pytest

from lora_gui.ui import login_wall

USER, PASSWORD = "ana", "s3cret-pw"
DENIED = (401, 403, 404)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_routes(app) -> Iterator[tuple[str, str]]:
    """(method, path) of every route of a FastAPI app, the included routers' too."""
    for route in app.routes:
        if hasattr(route, "path"):
            for method in sorted(getattr(route, "methods", None) or {"GET"}):
                yield method, route.path
        else:  # an included router (gradio's /gradio_api routes)
            yield from served_routes(route.original_router)


def concrete(path: str) -> str:
    """A route's path with its parameters filled in (a file= route asks for a real file)."""
    path = path.replace("{path_or_url:path}", "/etc/passwd")
    return re.sub(r"\{[^}]+\}", "x", path)


def page_api_info(html: str) -> dict:
    found = re.search(r"window\.gradio_api_info = (.*?);</script>", html)
    assert found, "the page carries no gradio_api_info at all"
    return json.loads(found.group(1))


def walk_without_login(url: str, app) -> list[str]:
    """Every route requested without a login; returns the routes that answered otherwise."""
    routes = sorted(set(served_routes(app)))
    assert len(routes) > 60  # gradio's API routes are there: the walk covers them
    leaks = []
    with httpx.Client(timeout=15) as client:
        for method, path in routes:
            if login_wall.is_public(path):
                continue
            if path in login_wall.SHELL_PATHS and method in ("GET", "HEAD"):
                answer = client.request(method, url + concrete(path))
                if answer.status_code != 200 or (method == "GET" and page_api_info(answer.text) != {
                        "named_endpoints": {}, "unnamed_endpoints": {}}):
                    leaks.append(f"{method} {path}: the page shell carries the API")
                continue
            # the status only: an open stream (heartbeat, queue data) would never end the body
            with client.stream(method, url + concrete(path)) as answer:
                if answer.status_code not in DENIED:
                    leaks.append(f"{method} {path}: {answer.status_code}")
    return leaks


@pytest.fixture()
def small_app():
    """A small app launched as app.py launches the dashboard (the same app_kwargs and auth)."""
    with gr.Blocks() as demo:
        box = gr.Textbox(value="a default only a login may see", elem_id="box")
        gr.Button(elem_id="go").click(lambda text: text, box, box, api_name="echo")
    port = _free_port()
    demo.launch(server_port=port, auth=[(USER, PASSWORD)], prevent_thread_lock=True, quiet=True,
                app_kwargs=login_wall.app_kwargs())
    try:
        yield f"http://127.0.0.1:{port}", demo
    finally:
        demo.close()


def test_every_route_refuses_without_the_login(small_app):
    url, demo = small_app
    assert walk_without_login(url, demo.app) == []
    with httpx.Client(timeout=15) as client:
        page = client.get(url + "/").text
        assert "a default only a login may see" not in page and "echo" not in page
        assert client.get(url + "/openapi.json").status_code in DENIED
        assert client.post(url + "/login", data={"username": USER, "password": PASSWORD}).status_code == 200
        assert client.get(url + "/config").status_code == 200  # logged in: the app answers
        assert "echo" in json.dumps(page_api_info(client.get(url + "/").text))


@pytest.mark.integration
def test_the_login_form_still_logs_in_from_a_browser(small_app):
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed")
    from playwright.sync_api import sync_playwright

    url, _ = small_app
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.set_default_timeout(60_000)
        page.goto(url)
        page.fill("input[type=password]", PASSWORD)
        page.fill("input[type=text]", USER)
        page.click("button")
        page.wait_for_selector("#box textarea")
        assert page.input_value("#box textarea") == "a default only a login may see"
        browser.close()


@pytest.mark.slow
@pytest.mark.integration
def test_the_dashboard_serves_nothing_without_the_login(tmp_path, monkeypatch):
    """The whole dashboard as `python app.py --auth` serves it (~40 s: every tab is built)."""
    import app
    from lora_gui.config import RunConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "secret-run").mkdir(parents=True)
    (tmp_path / "runs" / "secret-run" / "config.json").write_text(json.dumps(RunConfig().to_dict()))
    port = _free_port()
    demo = app.serve(app.parse_args(["--port", str(port), "--auth", f"{USER}:{PASSWORD}"]), block=False)
    try:
        url = f"http://127.0.0.1:{port}"
        assert walk_without_login(url, demo.app) == []
        page = httpx.get(url + "/", timeout=30).text
        assert "secret-run" not in page and "text-demo" not in page
    finally:
        demo.close()
