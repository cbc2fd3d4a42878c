"""Many pages on one live run: tick latency per page and the run's speed with 0 vs 20 pages open.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.ui.many_pages [--pages 20] [--rounds 3] [--window 60] [--pin]

Starts the dashboard (``app.py``) in a scratch folder and a run of the bundled text demo from its
Start button's endpoint (a process of its own, as the product starts every run) with enough steps
to outlast the measurement. Then, in rounds whose order alternates (0 pages then N, N then 0,
...), it measures the run's steps per second over ``--window`` seconds with no page open and with
``--pages`` Playwright pages open (Debian's Chromium, one browser context each, as N users).

Tick latency per page, timed inside each page: from the Train tab's timer sending its tick
(gradio's ``queue/join`` request of the ``poll`` event) to the end of the in-place drawing of the
answer (the last ``Plotly.react`` call on a live chart's div after the SSE message that carries the
result and before the next tick: the page draws every chart with new points at once), split into
the answer's arrival and the page's own drawing; and the age of what it then shows (the newest step
on the loss chart, from its record's time in the run folder to drawn). A tick the server answered
with nothing new (no step or memory sample since the page's last tick) is not timed. (gradio marks
each output pending when a tick is sent, which changes the page's DOM at once: a change of the page
is not a sign of new data.) Each chart's ``Plotly.react`` time and calls per tick are reported
too. Reports the median over pages of each page's median, the worst page's median and the 90th
percentile of every tick. Targets: median <= 200 ms, steps/s with N pages within 10% of no
page. Prints a Markdown table and writes the figures as JSON (``--json``).

On a machine with few cores the N Chromium pages themselves take most of a core, which in use sit
on the users' own machines: ``--pin`` keeps the dashboard and its run on the last CPU and the browsers
on the others, so the run's speed shows the server's work for the pages (which shares the run's core)
and not the browsers' rendering.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.common import round_order, write_results
from bench.ui.process_cpu import allowed_cpus, cpu_use, descendants, pin, pin_run
from lora_gui.ui.tabs.train import LIVE_TICK_S

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]

# Runs in every page before gradio's own code: notes when the timer's tick is sent (fetch of
# queue/join with the poll event's fn_index), when the server's answer arrives (the SSE chunk
# that carries a finished event) and each chart's Plotly.react call (start, end of its
# synchronous drawing, the chart's box and the last x it draws: the newest step on the loss chart).
PAGE_PROBE = """
(pollId) => {
  window.__ticks = {joins: [], answers: [], draws: []};
  const read = ReadableStreamDefaultReader.prototype.read, text = new TextDecoder();
  ReadableStreamDefaultReader.prototype.read = function () {
    return read.apply(this, arguments).then((r) => {
      try {
        const chunk = typeof r.value === 'string' ? r.value : r.value && text.decode(r.value);
        if (chunk && chunk.includes('process_completed')) window.__ticks.answers.push(performance.now());
      } catch (e) {}
      return r;
    });
  };
  const wrap = setInterval(() => {
    if (!window.Plotly || !window.Plotly.react || window.Plotly.__timed) return;
    const react = window.Plotly.react;
    window.Plotly.react = function (gd) {
      const t0 = performance.now(), out = react.apply(this, arguments), t1 = performance.now();
      const box = gd.closest && gd.closest('[id]'), first = (gd._fullData || [])[0];
      const x = first && first.x && first.x.length ? Number(first.x[first.x.length - 1]) : null;
      window.__ticks.draws.push([box ? box.id : '', t0, t1, x]);
      return out;
    };
    window.Plotly.__timed = true;
    clearInterval(wrap);
  }, 100);
  const send = window.fetch;
  window.fetch = function (input, init) {
    let direct = false;
    try {
      const url = typeof input === 'string' ? input : input.url;
      if ((url.includes('/queue/join') || url.includes('/run/')) && init && init.body &&
          JSON.parse(init.body).fn_index === pollId) {
        window.__ticks.joins.push(performance.now());
        direct = url.includes('/run/');  // outside the queue: the answer is this response's body
      }
    } catch (e) {}
    const out = send.apply(this, arguments);
    if (!direct) return out;
    // the response's arrival (a body of a few kB comes with it; timing its read instead would
    // come after gradio has read and drawn it)
    return out.then((r) => { window.__ticks.answers.push(performance.now()); return r; });
  };
}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(work: Path) -> tuple[subprocess.Popen, str]:
    """``python app.py`` in ``work`` (runs/ there), once it listens."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False"}
    log = (work / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=work,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/config", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the dashboard exited: see {work / 'server.log'}")
        time.sleep(1)
    proc.kill()
    raise SystemExit("the dashboard did not answer within 600 s")


def _dependency(config: dict[str, Any], elem_id: str) -> dict[str, Any]:
    ids = {c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == elem_id}
    return next(d for d in config["dependencies"]
                if any(t[0] in ids and t[1] == "click" for t in d["targets"]))


def start_run(url: str, name: str, steps: int, seq_len: int) -> str:
    """Presses Start through its endpoint with the text-demo form, a run name and more steps."""
    config = httpx.get(f"{url}/config", timeout=60).json()
    start = _dependency(config, "start")
    props = {c["id"]: c.get("props", {}) for c in config["components"]}
    values = {"run-name": name, "field-max_steps": steps,
              **({"field-max_seq_len": seq_len} if seq_len else {})}
    data = [values.get(props[i].get("elem_id"), props[i].get("value")) for i in start["inputs"]]
    posted = httpx.post(f"{url}/gradio_api/call/{start['api_name']}", json={"data": data}, timeout=60)
    stream = httpx.get(f"{url}/gradio_api/call/{start['api_name']}/{posted.json()['event_id']}", timeout=120)
    lines = stream.text.splitlines()
    message = next((json.loads(p.removeprefix("data: "))[0] for k, p in zip(lines, lines[1:])
                    if k == "event: complete"), stream.text)
    if not str(message).startswith("Started"):
        raise SystemExit(f"Start answered: {message}")
    return str(message)


def poll_fn_index(url: str) -> tuple[int, bool]:
    """The Train tab's tick event: (its id, whether it goes through gradio's queue)."""
    config = httpx.get(f"{url}/config", timeout=60).json()
    tick = next(d for d in config["dependencies"] if d["api_name"] == "poll")
    return tick["id"], tick.get("queue") is not False


def records(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip().endswith("}")]


def steps_per_s(run: Path, t0: float, t1: float) -> float:
    """Optimizer steps whose record was written in [t0, t1), per second."""
    return sum(1 for r in records(run) if t0 <= r["time"] < t1) / (t1 - t0)


LIVE_CHARTS = ("memory-plot", "loss-plot", "throughput-plot", "step-peak-plot")


def tick_times(ticks: dict[str, list], origin_s: float, written: dict[int, float]) -> list[dict[str, float]]:
    """One page's timed ticks: each tick sent whose answer was followed, before the next tick,
    by drawings of the live charts. ``latency``: tick sent to the end of the last such drawing
    (ms): the answer's new points drawn in place on every chart that got some; ``answer``: tick
    sent to the server's answer arriving; ``draw``: answer to its last chart drawn (the page's
    own work); ``age``: the newest step on the loss chart, from its record written to the run
    folder to drawn (``written``: step -> epoch s; ``origin_s``: the page's
    performance.timeOrigin in epoch s). A tick the server answered with nothing new (nothing
    sent) is not timed."""
    joins, answers = sorted(ticks["joins"]), sorted(ticks["answers"])
    live = sorted((d for d in ticks["draws"] if d[0] in LIVE_CHARTS), key=lambda d: d[1])
    out = []
    for sent, following in zip(joins, [*joins[1:], float("inf")]):
        got = next((a for a in answers if sent < a < following), None)
        drawn = [d for d in live if got is not None and got <= d[1] < following]
        if not drawn:
            continue
        end = max(d[2] for d in drawn)
        loss = [d for d in drawn if d[0] == "loss-plot"]
        step = loss[-1][3] if loss else None
        age = (origin_s + loss[-1][2] / 1000 - written[int(step)]) * 1000 if step in written else None
        out.append({"latency": end - sent, "answer": got - sent, "draw": end - got, "age": age})
    return out


def draw_costs(per_page: list[dict[str, list]]) -> dict[str, Any]:
    """Median ms of one Plotly.react call per chart and the calls per page per tick sent."""
    draws: dict[str, list[float]] = {}
    for ticks in per_page:
        for box, t0, t1, _ in ticks["draws"]:
            draws.setdefault(box or "?", []).append(t1 - t0)
    sent = max(1, sum(len(t["joins"]) for t in per_page))
    return {"draw_ms": {box: round(statistics.median(xs), 1) for box, xs in sorted(draws.items())},
            "draws_per_tick": {box: round(len(xs) / sent, 2) for box, xs in sorted(draws.items())}}


def open_pages(browser, url: str, n: int, poll_id: int) -> list:
    """``n`` pages, one browser context each (as n users), loading at once; returns when every
    page shows the run (its status and a first chart update)."""
    started = time.time()
    pages = []
    for _ in range(n):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.add_init_script(f"({PAGE_PROBE})({poll_id})")
        page = context.new_page()
        page.set_default_timeout(1_200_000)
        page.goto(url, wait_until="commit")
        pages.append(page)
    for page in pages:
        page.wait_for_function("() => (document.getElementById('status') || {innerText: ''})"
                               ".innerText.includes('step')")
        page.wait_for_function("() => window.__ticks && window.__ticks.draws.some(d => d[0] === 'loss-plot')")
    print(f"{n} pages show the run after {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    return pages


class ApiPage(threading.Thread):
    """A page without a browser: the Train tab's tick as gradio's client sends it (a plain
    request to ``run/poll``, or for a queued event queue/join and its answer read from the SSE
    stream) with a session of its own and the number of the last answer it holds, once a second
    after the previous answer, as the page's timer does. The server does for it what it does for
    a page; nothing is drawn. Notes each tick's answer time (ms) and size (bytes)."""

    def __init__(self, url: str, poll_id: int, stop: threading.Event, queued: bool = True) -> None:
        super().__init__(daemon=True)
        self.url, self.poll_id, self.stop, self.answers, self.sizes = url, poll_id, stop, [], []
        self.queued = queued  # False: the tick is one plain request (the event is not queued)
        self.session = uuid.uuid4().hex[:11]
        self.seen = ""  # the charts' answer this page holds ("seen N"), as the page's script says

    def _held(self, line: str) -> None:
        """Notes the answer's number, as the page's script does once it has drawn it."""
        try:
            answer = json.loads(line.removeprefix("data:"))
            charts = (answer["output"] if self.queued else answer)["data"][0]
            if isinstance(charts, str) and charts.startswith("{"):
                self.seen = f"seen {json.loads(charts)['seq']}"
        except (ValueError, KeyError, IndexError, TypeError):
            self.seen = ""

    def tick(self, client: httpx.Client) -> None:
        sent = time.perf_counter()
        if not self.queued:
            answer = client.post(f"{self.url}/gradio_api/run/poll", json={
                "data": [0.6, self.seen], "fn_index": self.poll_id, "session_hash": self.session,
                "event_data": None})
            self.answers.append((time.perf_counter() - sent) * 1000)
            self.sizes.append(len(answer.content))
            self._held(answer.text)
            return
        joined = client.post(f"{self.url}/gradio_api/queue/join", json={
            "data": [0.6, self.seen], "fn_index": self.poll_id, "session_hash": self.session,
            "event_data": None})
        event = joined.json()["event_id"]
        with client.stream("GET", f"{self.url}/gradio_api/queue/data",
                           params={"session_hash": self.session}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:") and event in line and "process_completed" in line:
                    self.answers.append((time.perf_counter() - sent) * 1000)
                    self.sizes.append(len(line.encode()))
                    self._held(line)
                    return

    def run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                self.tick(client)
                self.stop.wait(LIVE_TICK_S)  # as gradio's timer waits between a page's ticks


def measure(browser, url: str, run: Path, pages_n: int, window: float, poll: tuple[int, bool],
            settle: float, server_pid: int, api_pages: int = 0) -> dict[str, Any]:
    from lora_gui.engine.core.lock import read_lock

    poll_id, queued = poll
    api_n = min(api_pages, pages_n)
    pages = open_pages(browser, url, pages_n - api_n, poll_id) if pages_n > api_n else []
    stop = threading.Event()
    api = [ApiPage(url, poll_id, stop, queued) for _ in range(api_n)]
    for page in api:
        page.start()
    time.sleep(settle)
    for page in pages:
        page.evaluate("() => { for (const k in window.__ticks) window.__ticks[k] = []; }")
    info = read_lock(run)
    train = {info.pid} | descendants(info.pid) if info else set()
    run_cpus = allowed_cpus(info.pid) if info else "?"
    usage = cpu_use({"server": {server_pid}, "run": train,
                     "browser": descendants(os.getpid()) - {server_pid} - train}, window)
    t0 = time.time()
    time.sleep(window)
    t1 = time.time()
    cores = usage()
    probe = "() => ({...window.__ticks, origin: performance.timeOrigin})"
    per_page = [page.evaluate(probe) for page in pages]
    api_answers = [ms for page in api for ms in page.answers]  # in the window and the settle
    api_bytes = [size for page in api for size in page.sizes]
    stop.set()
    for page in api:
        page.join(timeout=120)
    for page in pages:
        page.context.close()
    result: dict[str, Any] = {"pages": pages_n, "steps_per_s": steps_per_s(run, t0, t1), "window_s": t1 - t0,
                              **cores, "browser_pages": len(pages), "api_pages": api_n,
                              "run_cpus": run_cpus, "server_cpus": allowed_cpus(server_pid),
                              "tick_queued": queued}
    if api_answers:
        result.update({"api_answer_ms_median": statistics.median(api_answers), "api_ticks": len(api_answers),
                       "api_answer_bytes_median": statistics.median(api_bytes),
                       "api_answer_bytes_max": max(api_bytes)})
    if pages:
        written = {r["step"]: r["time"] for r in records(run)}
        timed = [tick_times(t, t["origin"] / 1000, written) for t in per_page]
        medians = [statistics.median(x["latency"] for x in ticks) for ticks in timed if ticks]
        every = [x for ticks in timed for x in ticks]
        latency = sorted(x["latency"] for x in every)

        def median(key: str) -> float | None:
            values = [x[key] for x in every if x[key] is not None]
            return statistics.median(values) if values else None
        result.update({
            "tick_ms_median_of_pages": statistics.median(medians) if medians else None,
            "tick_ms_worst_page": max(medians) if medians else None,
            "tick_ms_p90": latency[int(0.9 * (len(latency) - 1))] if latency else None,
            "answer_ms_median": median("answer"), "draw_ms_median": median("draw"),
            "age_ms_median": median("age"), **draw_costs(per_page),
            "ticks_sent": sum(len(t["joins"]) for t in per_page), "chart_updates_timed": len(every),
            "pages_timed": len(medians)})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of (0 pages, N pages), order alternating")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured per arm and round")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between opening and measuring")
    parser.add_argument("--seq-len", type=int, default=0, help="the run's max_seq_len (0: the preset's)")
    parser.add_argument("--pin", action="store_true",
                        help="the dashboard and its run on the last CPU, the browsers on the others "
                             "(as on users' own machines): the run then shares its core with the "
                             "server's work per tick only")
    parser.add_argument("--api-pages", type=int, default=0,
                        help="of the --pages, this many tick as gradio's client does without a "
                             "browser (the server's work for a page, nothing drawn): with --pin and "
                             "--pages 20 --api-pages 19, one user's browser page times the ticks "
                             "of a server that serves 20")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium); no browser is downloaded")
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="many-pages-"))
    run = work / "runs" / "bench"
    server, url = serve(work)
    if args.pin:
        pin(server.pid)
    rows: list[dict[str, Any]] = []
    try:
        print(start_run(url, "bench", steps=100_000, seq_len=args.seq_len), flush=True)
        while len(records(run)) < 3:
            if server.poll() is not None:
                raise SystemExit("the dashboard exited")
            time.sleep(1)
        if args.pin:
            print(f"the run's process may use CPU {pin_run(run, server.pid)}", file=sys.stderr, flush=True)
        poll = poll_fn_index(url)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            for r in range(args.rounds):
                for n in round_order((0, args.pages), r):
                    row = measure(browser, url, run, n, args.window, poll, args.settle, server.pid,
                                  args.api_pages)
                    row["round"] = r + 1
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            browser.close()
    finally:
        stop_run(run)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    summary = summarise(rows, args.pages)
    print(table(rows, summary, args))
    if args.json:
        write_results(args.json, {"rows": rows, "summary": summary})
    return 0


def stop_run(run: Path) -> None:
    """Ends the run's process (a process of its own: it would outlive the dashboard)."""
    from lora_gui.engine.core.lock import lock_is_live, read_lock

    info = read_lock(run) if run.is_dir() else None
    if info is not None and lock_is_live(run):
        try:
            os.killpg(os.getpgid(info.pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def summarise(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    none = [r["steps_per_s"] for r in rows if r["pages"] == 0]
    many = [r for r in rows if r["pages"] == n]
    ratios = []
    for r in range(1, max(row["round"] for row in rows) + 1):  # each round's own pair
        pair = {row["pages"]: row["steps_per_s"] for row in rows if row["round"] == r}
        if pair.get(0):
            ratios.append(pair[n] / pair[0])
    return {"steps_per_s_0": statistics.median(none),
            "steps_per_s_n": statistics.median(r["steps_per_s"] for r in many),
            "ratio_median": statistics.median(ratios), "ratios": ratios,
            "tick_ms_median": statistics.median(r["tick_ms_median_of_pages"] for r in many),
            "tick_ms_worst_page": max(r["tick_ms_worst_page"] for r in many),
            "tick_ms_p90": statistics.median(r["tick_ms_p90"] for r in many),
            **{key: statistics.median([r[key] for r in many if r[key] is not None] or [float("nan")])
               for key in ("answer_ms_median", "draw_ms_median", "age_ms_median")},
            **{f"{key}_{label}": statistics.median(r[key] for r in rows if (r["pages"] > 0) == (label == "n"))
               for key in ("cpu_server", "cpu_browser", "cpu_run") for label in ("0", "n")}}


def _cores(row: dict[str, Any]) -> str:
    return f"{row['cpu_server']:.2f} | {row['cpu_browser']:.2f} | {row['cpu_run']:.2f} |"


def table(rows: list[dict[str, Any]], s: dict[str, Any], args: argparse.Namespace) -> str:
    nan = float("nan")
    out = ["| round | pages | steps/s | tick ms: median of pages | worst page | p90 | of which answer "
           "| drawing | record age ms | ticks timed / sent | CPU cores: server | browser | run |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shown = f"{r['pages']} ({r['api_pages']} without browser)" if r.get("api_pages") else r["pages"]
        if r["pages"]:
            out.append(f"| {r['round']} | {shown} | {r['steps_per_s']:.3f} | "
                       f"{r['tick_ms_median_of_pages']:.0f} | {r['tick_ms_worst_page']:.0f} | "
                       f"{r['tick_ms_p90']:.0f} | {r['answer_ms_median'] or nan:.0f} | "
                       f"{r['draw_ms_median'] or nan:.0f} | {r['age_ms_median'] or nan:.0f} | "
                       f"{r['chart_updates_timed']} / {r['ticks_sent']} | {_cores(r)}")
        else:
            out.append(f"| {r['round']} | 0 | {r['steps_per_s']:.3f} | {'— | ' * 7}{_cores(r)}")
    out.append(f"\nMedians over {args.rounds} rounds of {args.window:.0f} s: steps/s "
               f"{s['steps_per_s_0']:.3f} (0 pages) vs {s['steps_per_s_n']:.3f} ({args.pages} pages), "
               "per-round ratio median "
               f"{s['ratio_median']:.3f} ({', '.join(f'{x:.3f}' for x in s['ratios'])}); tick latency "
               f"median {s['tick_ms_median']:.0f} ms, worst page {s['tick_ms_worst_page']:.0f} ms, "
               f"p90 {s['tick_ms_p90']:.0f} ms (answer {s['answer_ms_median']:.0f} ms, drawing "
               f"{s['draw_ms_median']:.0f} ms), record written to drawn {s['age_ms_median']:.0f} ms; "
               f"the server's CPU {s['cpu_server_0']:.2f} vs "
               f"{s['cpu_server_n']:.2f} cores, the browser's {s['cpu_browser_0']:.2f} vs "
               f"{s['cpu_browser_n']:.2f}, the run's {s['cpu_run_0']:.2f} vs {s['cpu_run_n']:.2f}")
    api = [r["api_answer_ms_median"] for r in rows if r.get("api_answer_ms_median") is not None]
    if api:
        out.append(f"The pages without a browser got their answers in {statistics.median(api):.0f} ms "
                   "(median of each round's median).")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
