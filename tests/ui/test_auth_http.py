"""With --auth, every route that starts, stops, deletes or reads runs needs the login: checked over
HTTP (httpx, no browser) against the dashboard served in this process, as `python app.py` serves
it. Endpoints are found by the element ids of their buttons, not by gradio's generated names."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

import app
from lora_gui.config import RunConfig
from lora_gui.engine.jobs.manager import Job
from lora_gui.ui import common

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # ~40 s: the whole dashboard starts
USER, PASSWORD = "ana", "s3cret-pw"
DENIED = (401, 403)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The dashboard with --auth in a folder holding two runs, and a live job with a sample picture."""
    work = tmp_path_factory.mktemp("auth")
    mp = pytest.MonkeyPatch()
    mp.chdir(work)
    for name in ("keep", "gone"):
        (work / "runs" / name).mkdir(parents=True)
        (work / "runs" / name / "config.json").write_text(json.dumps(RunConfig().to_dict()))
    live = work / "runs" / "live"
    (live / "samples").mkdir(parents=True)
    (live / "samples" / "step-1.png").write_bytes(_png())
    port = _free_port()
    demo = app.serve(app.parse_args(["--port", str(port), "--auth", f"{USER}:{PASSWORD}"]), block=False)
    mp.setattr(common.MANAGER, "job", Job(name="live", out=Path("runs") / "live", cfg=RunConfig(),
                                          status="running"))
    try:
        yield f"http://127.0.0.1:{port}", work
    finally:
        demo.close()
        mp.undo()


@pytest.fixture(scope="module")
def config(served) -> dict[str, Any]:
    url, _ = served
    client = _login(url)
    try:
        return client.get(f"{url}/config").json()
    finally:
        client.close()


def _login(url: str) -> httpx.Client:
    client = httpx.Client(timeout=60)
    assert client.post(f"{url}/login", data={"username": USER, "password": PASSWORD}).status_code == 200
    return client


def _endpoint(config: dict[str, Any], elem_id: str, event: str = "click") -> dict[str, Any]:
    """The event a button (by element id) fires, with its api name and input component ids."""
    ids = {c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == elem_id}
    for dep in config["dependencies"]:
        if any(target[0] in ids and target[1] == event for target in dep["targets"]):
            return dep
    raise AssertionError(f"no {event} event on #{elem_id}")


def _defaults(config: dict[str, Any], dep: dict[str, Any], **by_elem_id: Any) -> list[Any]:
    """The inputs of ``dep`` as the page first shows them, some replaced by element id."""
    comps = {c["id"]: c.get("props", {}) for c in config["components"]}
    return [by_elem_id.get(comps[i].get("elem_id"), comps[i].get("value")) for i in dep["inputs"]]


def _call(client: httpx.Client, url: str, dep: dict[str, Any], data: list[Any]) -> httpx.Response:
    return client.post(f"{url}/gradio_api/call/{dep['api_name']}", json={"data": data})


def _result(client: httpx.Client, url: str, dep: dict[str, Any], data: list[Any]) -> list[Any]:
    """The outputs of one call (gradio's two-step call API: an event id, then its event stream)."""
    posted = _call(client, url, dep, data)
    assert posted.status_code == 200, posted.text
    stream = client.get(f"{url}/gradio_api/call/{dep['api_name']}/{posted.json()['event_id']}")
    lines = stream.text.splitlines()
    for kind, payload in zip(lines, lines[1:]):
        if kind == "event: complete":
            return json.loads(payload.removeprefix("data: "))
    raise AssertionError(f"{dep['api_name']}: no result in {stream.text[:300]}")


def test_every_run_route_refuses_without_the_login_and_works_with_it(served, config):
    url, work = served
    reload = _endpoint(config, "runs-refresh")
    start = _endpoint(config, "start")
    stop = _endpoint(config, "stop")
    delete = _endpoint(config, "runs-delete-confirm")
    opened = _endpoint(config, "runs-open")
    export = _endpoint(config, "export-button")
    tick = next(d for d in config["dependencies"] if d["api_name"] == "poll")  # the Train tab's timer

    client = _login(url)  # logged in: each route reaches its handler
    table = _result(client, url, reload, [])[0]
    assert {"keep", "gone"} <= {row[0] for row in table["data"]}
    message = _result(client, url, start, _defaults(config, start, **{"run-name": "../x"}))[0]
    assert message.startswith("Error:") and "run name" in message.lower()
    pictures = _result(client, url, tick, [0.6, ""])[-1]  # charts, status, events, sample pictures
    file_url = pictures[0]["image"]["url"]
    assert client.get(file_url).content == (work / "runs" / "live" / "samples" / "step-1.png").read_bytes()
    assert _result(client, url, delete, ["gone"])[0].startswith("Deleted")
    assert not (work / "runs" / "gone").exists()
    assert _result(client, url, stop, [])[0] == "stopping live"
    common.MANAGER.job.control.stop.clear()
    client.close()

    anonymous = httpx.Client(timeout=60)
    wrong = httpx.Client(timeout=60)
    assert wrong.post(f"{url}/login", data={"username": USER, "password": "guess"}).status_code in (400, 401)
    for client in (anonymous, wrong):
        for path in ("/config", "/gradio_api/info", "/gradio_api/queue/data?session_hash=x",
                     "/gradio_api/openapi.json", file_url.removeprefix(url)):
            assert client.get(f"{url}{path}").status_code in DENIED, path
        for dep, data in ((reload, []), (start, _defaults(config, start, **{"run-name": "new"})),
                          (stop, []), (delete, ["keep"]), (opened, ["keep", 0.0]),
                          (export, _defaults(config, export)), (tick, [0.6, ""])):
            assert _call(client, url, dep, data).status_code in DENIED, dep["api_name"]
        joined = client.post(f"{url}/gradio_api/queue/join", json={
            "data": ["keep"], "fn_index": delete["id"], "session_hash": "intruder", "trigger_id": None,
            "event_data": None})
        assert joined.status_code in DENIED
        direct = client.post(f"{url}/gradio_api/run/poll", json={  # the tick: a plain request
            "data": [0.6, ""], "fn_index": tick["id"], "session_hash": "intruder", "event_data": None})
        assert direct.status_code in DENIED
        assert client.post(f"{url}/gradio_api/upload", files={"files": ("a.txt", b"x")}).status_code in DENIED
    assert (work / "runs" / "keep").is_dir() and not (work / "runs" / "new").exists()
    assert not common.MANAGER.job.control.stop.is_set()
