"""The dashboard as someone on the same network meets it: started in a folder of its own (its runs
under work/runs), with an outside folder beside it that the page must never reach."""

from __future__ import annotations

from pathlib import Path

import pytest

import lora_gui.memory.predict as predict_pkg
from lora_gui.memory.predict import Prediction
from lora_gui.ui import common, paths

TEXT = "some words to train on\n\nand a second document here\n"


@pytest.fixture()
def work(tmp_path, monkeypatch) -> Path:
    """The dashboard's working directory (runs in work/runs); tmp_path/elsewhere is outside."""
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    (work / "data.txt").write_text(TEXT)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "data.txt").write_text(TEXT)
    (tmp_path / "elsewhere" / "other.txt").write_text(TEXT)
    monkeypatch.chdir(work)
    monkeypatch.setattr(common, "RUNS_ROOT", work / "runs")
    fake = Prediction(peak_bytes=2**20, device="cpu", how="plan")  # a queue's plan answers at once
    monkeypatch.setattr(predict_pkg, "predict", lambda cfg, *_, **__: fake)
    # the server's own job manager, never launching a process here
    monkeypatch.setattr(common.MANAGER, "job", None)
    monkeypatch.setattr(common.MANAGER, "_run_launched", lambda *a, **k: None)
    paths.configure()
    yield work
    paths.configure()


@pytest.fixture()
def outside(work) -> Path:
    """An existing data file outside every folder the dashboard may use."""
    return work.parent / "elsewhere" / "data.txt"
