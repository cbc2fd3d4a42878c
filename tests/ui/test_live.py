"""Several pages (and a reloaded one) see the same run, and a tick's charts are built once for
all of them: the server's work per tick does not grow with the number of pages."""

from __future__ import annotations

from types import SimpleNamespace

from lora_gui.config import RunConfig
from lora_gui.engine.jobs import Job
from lora_gui.ui import common
from lora_gui.ui.tabs import train
from lora_gui.ui.tabs import train_handlers as handle

SKIP = {"__type__": "update"}  # gr.skip(): the page keeps what it shows


def _page(name: str) -> SimpleNamespace:
    return SimpleNamespace(session_hash=name)


def _record(step: int) -> dict:
    return {"step": step, "loss": 3.0 / step, "peak_bytes": 2**20 * (100 + step), "memory_source": "tracker",
            "tokens_per_s": 1000.0, "real_tokens": 900, "padded_tokens": 1024}


def test_pages_share_one_build_per_tick_and_get_only_what_changed(monkeypatch, tmp_path):
    job = Job(name="shared", out=tmp_path / "shared", cfg=RunConfig(), status="running")
    for step in (1, 2, 3):
        job.add_record(_record(step))
    job.add_sample({"time": job.started + 1, "tracker_live_bytes": 2**27})
    monkeypatch.setattr(common.MANAGER, "job", job)
    builds = handle.CHARTS.builds

    first = [train.poll(0.6, _page(name)) for name in ("a", "b")]
    assert handle.CHARTS.builds == builds + 2  # two pages, one build of each part (timeline, steps)
    shown = (0, 2, 3)  # memory over time, loss, throughput; the peak per step waits in "More charts"
    assert all(first[0][i] is first[1][i] for i in shown)  # the very same charts
    assert first[0][1] == SKIP
    assert '"y":' in first[0][2].plot and "shared" in first[0][4]  # loss chart, status names the run

    again = train.poll(0.6, _page("a"))  # nothing new: the page keeps what it holds
    assert all(part == SKIP for part in again[:4]) and "shared" in again[4]
    reloaded = train.poll(0.6, _page("c"))  # a page opened (or reloaded) mid-run gets everything
    assert reloaded[:4] == first[0][:4]
    assert train.more_charts(True)(0.6, _page("c")).plot.count("Memory per step") == 1  # opened

    job.add_record(_record(4))  # a new step: the per-step charts change, memory over time does not
    after = [train.poll(0.6, _page(name)) for name in ("a", "b", "c")]
    assert handle.CHARTS.builds == builds + 3
    assert all(a[0] == SKIP for a in after)
    assert all(x is y is z for x, y, z in zip(*(a[2:4] for a in after)))
    assert after[0][1] == after[1][1] == SKIP and "Memory per step" in after[2][1].plot  # c opened it
    assert after[0][2].plot != first[0][2].plot  # the new step is in the loss chart


def test_a_page_without_a_job_sees_the_empty_charts(monkeypatch):
    monkeypatch.setattr(common.MANAGER, "job", None)
    *_, status, log, gallery = train.poll(0.0, _page("empty"))
    assert status.startswith("No training yet") and log == "" and gallery == []
