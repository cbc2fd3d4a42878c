"""Server CPU of one tick request in a bare gradio app, by what the tick returns.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.tick_cost [--requests 400] [--cpu 1]

Each variant is a small gradio app of its own (a process pinned to ``--cpu``) with one event
outside the queue, called ``--requests`` times one after the other as a page's tick (a plain
``run/poll`` request); the figure is the app's CPU seconds per request (from /proc). Variants:
one text output; the Train tab's four outputs (live charts HTML, status Markdown, events
Textbox, Gallery) sent as values; the same with the gallery given ``gr.skip()``; with three of
them skipped. It shows why the Train tab's tick sends small values instead of ``gr.skip()``
(gradio rebuilds a component for each skip it is given).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import httpx

APP = """
import sys, gradio as gr
kind, port = sys.argv[1], int(sys.argv[2])
answers = {"one output": lambda: "x",
           "four values": lambda: ('{"seq":1}', "**run**: running", "log", []),
           "gallery skipped": lambda: ('{"seq":1}', "**run**: running", "log", gr.skip()),
           "three skipped": lambda: (gr.skip(), "**run**: running", gr.skip(), gr.skip())}
with gr.Blocks() as demo:
    html = gr.HTML("", html_template="<div></div>", js_on_load=None)
    status, log, gallery, slider = gr.Markdown(), gr.Textbox(), gr.Gallery(), gr.Slider(0, 1, 0.6)
    answer = answers[kind]
    def tick(smoothing, seen, request: gr.Request):
        return answer()
    outputs = [log] if kind == "one output" else [html, status, log, gallery]
    gr.Button().click(tick, [slider, html], outputs, queue=False, api_name="poll", show_progress="hidden")
demo.launch(server_port=port)
"""
VARIANTS = ("one output", "four values", "gallery skipped", "three skipped")


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(kind: str, requests: int, cpu: int) -> float:
    """The app's CPU milliseconds per tick request."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    app = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", APP, kind, str(port)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                config = httpx.get(f"{url}/config", timeout=5).json()
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise SystemExit(f"{kind}: the app did not start")
        fn = next(d["id"] for d in config["dependencies"] if d["api_name"] == "poll")
        body = {"data": [0.6, "seen 1"], "fn_index": fn, "session_hash": "bench", "event_data": None}
        with httpx.Client(timeout=60) as client:
            for _ in range(20):  # warm
                client.post(f"{url}/gradio_api/run/poll", json=body).raise_for_status()
            before = cpu_seconds(app.pid)
            for _ in range(requests):
                client.post(f"{url}/gradio_api/run/poll", json=body).raise_for_status()
            return (cpu_seconds(app.pid) - before) / requests * 1000
    finally:
        app.terminate()
        app.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the variants, order alternating")
    parser.add_argument("--cpu", type=int, default=1, help="the CPU the app is pinned to")
    args = parser.parse_args()
    results: dict[str, list[float]] = {kind: [] for kind in VARIANTS}
    for r in range(args.rounds):
        for kind in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
            results[kind].append(measure(kind, args.requests, args.cpu))
    for kind, ms in results.items():
        print(f"{kind:>16}: {', '.join(f'{x:.2f}' for x in ms)} ms of server CPU per tick request")


if __name__ == "__main__":
    main()
