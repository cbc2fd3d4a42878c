"""Several pages (and a reloaded one) see the same run. A tick's charts are built once for all
pages, and each page's answer carries only the points after those it holds: its size grows with
neither the run's length nor the number of pages."""

from __future__ import annotations

import json
from types import SimpleNamespace

import gradio as gr

from lora_gui.config import RunConfig
from lora_gui.engine.jobs.manager import Job
from lora_gui.ui import common
from lora_gui.ui.tabs import train
from lora_gui.ui.tabs import train_handlers as handle

CHARTS = ("memory-plot", "step-peak-plot", "loss-plot", "throughput-plot")


def _page(name: str) -> SimpleNamespace:
    return SimpleNamespace(session_hash=name)


def _record(step: int) -> dict:
    return {"step": step, "loss": 3.0 / step, "peak_bytes": 2**20 * (100 + step), "memory_source": "tracker",
            "tokens_per_s": 1000.0 + step, "real_tokens": 900, "padded_tokens": 1024}


def _job(tmp_path, steps: int, name: str = "shared") -> Job:
    job = Job(name=name, out=tmp_path / name, cfg=RunConfig(), status="running")
    for step in range(1, steps + 1):
        job.add_record(_record(step))
    job.add_sample({"time": job.started + 1, "tracker_live_bytes": 2**27})
    return job


class Page:
    """A page as its script is: it applies each answer and says which one it holds."""

    def __init__(self, name: str) -> None:
        self.request, self.seen, self.charts = _page(name), "", {}

    def tick(self, smoothing: float = 0.6) -> tuple:
        out = train.poll(smoothing, self.seen, self.request)
        if out[0].startswith("{"):
            answer = json.loads(out[0])
            assert answer["after"] is None or answer["after"] == int(self.seen.split()[1])
            for chart_id, part in answer["charts"].items():
                if part.get("full"):
                    self.charts[chart_id] = part["traces"]
                    continue
                for held, new in zip(self.charts[chart_id], part["traces"]):
                    keep = new["keep"]
                    held["x"], held["y"] = held["x"][:keep] + new["x"], held["y"][:keep] + new["y"]
            self.seen = f"seen {answer['seq']}"
        return out

    def xs(self, chart_id: str = "loss-plot", trace: int = 0) -> list[float]:
        return self.charts[chart_id][trace]["x"]


def test_pages_share_one_build_and_get_only_the_new_points(monkeypatch, tmp_path):
    job = _job(tmp_path, 3)
    monkeypatch.setattr(common.MANAGER, "job", job)
    builds = handle.CHARTS.builds
    a, b = Page("a"), Page("b")
    first = [a.tick(), b.tick()]
    assert handle.CHARTS.builds == builds + 2  # two pages, one build of each part (timeline, steps)
    assert first[0][0] == first[1][0]  # the same answer: every chart whole
    whole = json.loads(first[0][0])
    assert set(whole["charts"]) == set(CHARTS) and all(c["full"] for c in whole["charts"].values())
    assert a.xs() == [1, 2, 3] and "shared" in first[0][1]  # loss chart; the status names the run
    assert "Memory per step" in json.dumps(whole["charts"]["step-peak-plot"]["layout"])
    assert "live memory (tracker)" in json.dumps(whole["charts"]["memory-plot"]["traces"])  # its source

    again = a.tick()  # nothing new: the page's own "seen" back, no chart sent
    assert again[0] == "seen 1" and "shared" in again[1]

    job.add_record(_record(4))  # a new step: the per-step charts get one point each
    after = a.tick()
    delta = json.loads(after[0])
    assert set(delta["charts"]) == {"step-peak-plot", "loss-plot", "throughput-plot"}
    loss = delta["charts"]["loss-plot"]
    assert "full" not in loss and [(t["keep"], t["x"]) for t in loss["traces"]] == [(3, [4.0]), (3, [4.0])]
    assert a.xs() == [1, 2, 3, 4] and a.xs("loss-plot", 1) == [1, 2, 3, 4]  # raw loss and its EMA
    assert handle.CHARTS.builds == builds + 3

    reloaded = Page("c")  # a page opened (or reloaded) mid-run: the whole history, once
    reloaded.tick()
    assert reloaded.charts == a.charts
    job.add_record(_record(5))
    b.tick()  # b missed step 4: it gets 4 and 5, after the 3 points it holds
    reloaded.tick()
    assert b.charts == reloaded.charts and b.xs() == [1, 2, 3, 4, 5]


def _delta_bytes(tmp_path, monkeypatch, steps: int) -> tuple[int, int]:
    """(bytes of the first answer, bytes of the answer after one more step) for a page on a run
    of ``steps`` steps."""
    job = _job(tmp_path, steps, name=f"run-{steps}")
    monkeypatch.setattr(common.MANAGER, "job", job)
    page = Page(f"page-{steps}")
    whole = len(page.tick()[0])
    job.add_record(_record(steps + 1))
    answer = page.tick()[0]
    for chart_id in CHARTS[1:]:  # held as the server has it: the page's copy stays exact
        assert page.xs(chart_id)[-1] == steps + 1
    return whole, len(answer)


def test_the_tick_answer_does_not_grow_with_the_run(monkeypatch, tmp_path):
    short, long_run = _delta_bytes(tmp_path, monkeypatch, 20), _delta_bytes(tmp_path, monkeypatch, 6_000)
    assert short[1] < 1_000 and long_run[1] <= short[1] + 200  # one step's points, however long
    assert long_run[0] < 200_000  # the whole history, downsampled (at most 1,000 points a curve)


def test_a_page_that_missed_an_answer_gets_everything(monkeypatch, tmp_path):
    job = _job(tmp_path, 3)
    monkeypatch.setattr(common.MANAGER, "job", job)
    page = Page("lost")
    page.tick()
    job.add_record(_record(4))
    page.seen = "seen 0"  # says it holds another answer than the last one sent
    answer = json.loads(page.tick()[0])
    assert answer["after"] is None and all(c["full"] for c in answer["charts"].values())
    assert page.xs() == [1, 2, 3, 4]


def test_a_page_without_a_job_sees_the_empty_charts(monkeypatch):
    monkeypatch.setattr(common.MANAGER, "job", None)
    charts, status, log, gallery = train.poll(0.0, "", _page("empty"))
    # the page loads with "No training yet"; a tick leaves it, so one sent before Start and
    # answered after it cannot put it back beside "Started"
    assert isinstance(status, type(gr.skip())) and log == "" and gallery == []
    assert handle.status_text().startswith("No training yet")
    assert all(c["traces"][0]["x"] == [] for c in json.loads(charts)["charts"].values()
               if c["traces"])
