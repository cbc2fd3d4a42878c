"""A resumed run trains in the same mode as a straight one: every module in training mode, so
gradient checkpointing and dropout are on from its first step, and its peak is the planned one.
(transformers loads the base in eval mode; the resumed run skips the first evaluation that used to
switch the layers to training mode, and its first step kept every activation: 8% over its plan.)"""

from __future__ import annotations

import pytest

from bench.memory.adapter_variants import tiny_qwen2
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.core.records import read_records
from lora_gui.engine.text import train as text_train

TINY = dict(max_steps=2, batch_size=1, max_seq_len=16, monitor_hz=0.0, eval_fraction=0.05,
            checkpoint_every=1, gradient_checkpointing=True, precision="fp32", warmup_steps=0,
            lr=1e-2, lora_rank=4)


def _run(over, out, **kw):
    return text_train.train_text(apply_overrides(RunConfig(), over), out, progress=False, **kw)


def test_a_resumed_checkpointed_run_peaks_where_planned(tmp_path, monkeypatch):
    model = tiny_qwen2(tmp_path / "wide", intermediate_size=4096)  # MLP activations dominate
    over = {**TINY, "model": str(model)}
    straight = _run(over, tmp_path / "straight")
    _run({**over, "max_steps": 1}, tmp_path / "resumed")

    modes = []
    real_step = text_train._one_step

    def spy(run, step, *a, **k):
        modes.append({m.training for m in run.model.modules()})
        return real_step(run, step, *a, **k)

    monkeypatch.setattr(text_train, "_one_step", spy)
    resumed = _run({**over, "max_steps": 2}, tmp_path / "resumed", resume=True)
    assert modes == [{True}]  # no module left in eval mode
    report = resumed["memory_report"]["predicted_vs_measured"]
    assert -0.01 <= report <= 0.03, resumed["memory_report"]
    peaks = {name: [r["peak_bytes"] for r in read_records(tmp_path / name / "metrics.jsonl")]
             for name in ("straight", "resumed")}
    assert peaks["resumed"][1] == peaks["straight"][1]  # the resumed step is the straight one
    assert straight["peak_bytes"] == resumed["peak_bytes"]
    assert pytest.approx(straight["prediction"]["peak_bytes"]) == resumed["prediction"]["peak_bytes"]
