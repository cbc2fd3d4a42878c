"""Try tab handlers: refusal beside a running job, bad input, the run list."""

from __future__ import annotations

import json
from types import SimpleNamespace

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.memory.predict import generation
from lora_gui.ui import common
from lora_gui.ui.tabs import try_handlers

MIB = 2**20


class FakeJob(SimpleNamespace):
    def snapshot(self):
        return self.records, []


def job(budget_gb: float, peak: int, running: bool = True) -> FakeJob:
    return FakeJob(name="big", running=running, predicted_bytes=None,
                   cfg=apply_overrides(RunConfig(), {"budget_gb": budget_gb}),
                   records=[{"peak_bytes": peak, "memory_source": "tracker"}])


def test_room_refuses_when_the_job_leaves_too_little_and_names_the_figures():
    room = generation.room_for_generation(300 * MIB, job(1.0, 900 * 10**6))
    assert not room.fits
    assert "generation needs 0.315 GB (predicted)" in room.message and "(tracker)" in room.message
    assert generation.room_for_generation(50 * MIB, job(1.0, 900 * 10**6)).fits
    assert generation.room_for_generation(10**12, job(1.0, 0, running=False)).fits


def test_text_prediction_counts_weights_and_kv_cache(builtin_model_dir, tmp_path):
    small = generation.text_generation_bytes(builtin_model_dir, tmp_path, 64)
    large = generation.text_generation_bytes(builtin_model_dir, tmp_path, 2048)
    weights = (builtin_model_dir / "model.safetensors").stat().st_size
    assert small > weights  # errs high: weights x margin plus cache
    kv_per_token = 2 * 4 * 4 * 64 * 4  # K and V x 4 layers x 4 kv heads x 64 dims x fp32 bytes
    assert abs((large - small) - kv_per_token * (2048 - 64) * generation.TEXT_MARGIN) <= 1


def test_generate_refuses_beside_a_big_job_and_bad_input(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "r"
    (run / "adapter").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(RunConfig().to_dict()))
    (run / "adapter" / "adapter_config.json").write_text("{}")
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path / "runs")
    assert try_handlers.finished_runs() == [str(run)]
    monkeypatch.setattr(try_handlers, "_running_job", lambda: job(0.01, 9 * 10**6))
    *_, message = list(try_handlers.generate(str(run), "hello", 16, 0.0, 0, 1.0))[-1]
    assert message.startswith("Not enough memory to try a run while 'big' trains")
    assert "Type a prompt" in list(try_handlers.generate(str(run), " ", 16, 0.0, 0, 1.0))[-1][-1]
    empty = tmp_path / "runs" / "empty"
    empty.mkdir()
    assert "not a run folder" in list(try_handlers.generate(str(empty), "hi", 16, 0, 0, 1))[-1][-1]
    assert "Error:" in try_handlers.export(str(empty), str(tmp_path / "x"), False)
    assert not (tmp_path / "x").exists()
