"""The text engine end to end on the built-in model, kept small: 64-token rows, a few steps."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from peft import PeftModel

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.data.batching import MicroBatch, Step
from lora_gui.engine.core import checkpoint as ckpt
from lora_gui.engine.core.records import read_records
from lora_gui.engine.core.rundir import RunDirError
from lora_gui.engine.text.train import TrainControl, load_text_data, run_step, train_text
from lora_gui.models import text as text_models

ROOT = Path(__file__).resolve().parents[2]
STEP_KEYS = {"step", "loss", "lr", "real_tokens", "padded_tokens", "batch_size", "seq_len", "seconds",
             "peak_bytes", "memory_source"}
RUN_KEYS = {"final_loss", "eval_loss", "real_tokens", "padded_tokens", "padding_efficiency",
            "real_tokens_per_s", "peak_bytes", "memory_source", "config"}


def small_cfg(data: Path, **kw) -> RunConfig:
    base = {"data": str(data), "max_seq_len": 64, "batch_size": 4, "max_steps": 4, "lr": 5e-3,
            "checkpoint_every": 2, "eval_fraction": 0.1, "warmup_steps": 1}
    return apply_overrides(RunConfig(), {**base, **kw})


def test_run_folder_contract_and_adapter_loads(tmp_path, small_corpus, builtin_model_dir):
    out = tmp_path / "run"
    summary = train_text(small_cfg(small_corpus), out, progress=False)
    records = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(STEP_KEYS <= r.keys() for r in records)
    assert all(r["memory_source"] == "tracker" for r in records) and records[0]["peak_bytes"] > 0
    # later steps of an already measured step shape run without the tracker: no peak recorded
    assert all(r["peak_bytes"] is None or r["peak_bytes"] > 0 for r in records)
    run = json.loads((out / "run.json").read_text())
    assert RUN_KEYS <= run.keys() and run == summary and run["status"] == "completed"
    assert run["padding_efficiency"] == run["real_tokens"] / run["padded_tokens"]
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    base = text_models.load_base_model(str(builtin_model_dir), "sdpa")
    model = PeftModel.from_pretrained(base, str(out / "adapter"))
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # trained: B starts at zero
    events = read_records(out / "events.jsonl")
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [2, 4, 4]


def test_resume_continues_the_same_loss_curve(tmp_path, small_corpus):
    # precision pinned: with 'auto' the two fresh runs each time the CPU and, on a loaded machine,
    # may pick different precisions (a resumed run keeps its own, which is what is tested here)
    cfg = small_cfg(small_corpus, max_steps=6, precision="fp32")
    train_text(cfg, tmp_path / "full", progress=False)
    control = TrainControl()
    control.on_record = lambda r: control.stop.set() if r["step"] == 3 else None
    stopped = train_text(cfg, tmp_path / "cut", control=control, progress=False)
    assert stopped["status"] == "stopped" and stopped["steps"] == 3
    resumed = train_text(cfg, tmp_path / "cut", resume=True, progress=False)
    assert resumed["status"] == "completed"
    full = [r["loss"] for r in read_records(tmp_path / "full" / "metrics.jsonl")]
    cut = [r["loss"] for r in read_records(tmp_path / "cut" / "metrics.jsonl")]
    assert len(cut) == 6
    assert cut == pytest.approx(full, rel=1e-5, abs=1e-6)


def test_refuses_a_folder_with_another_run(tmp_path, small_corpus):
    cfg = small_cfg(small_corpus, max_steps=1)
    train_text(cfg, tmp_path / "r", progress=False)
    before = (tmp_path / "r" / "run.json").read_text()
    with pytest.raises(RunDirError, match="--resume.*--overwrite"):
        train_text(cfg, tmp_path / "r", progress=False)
    assert (tmp_path / "r" / "run.json").read_text() == before
    train_text(cfg, tmp_path / "r", overwrite=True, progress=False)


def test_max_seq_len_above_model_limit(tmp_path, small_corpus):
    with pytest.raises(ConfigError, match="max_seq_len: 4096 is above the model's limit of 2048"):
        train_text(small_cfg(small_corpus, max_seq_len=4096), tmp_path / "r", progress=False)


def test_unknown_hub_id_fails_fast_offline(monkeypatch):
    for offline in ("1", None):
        if offline is None:
            monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        start = time.monotonic()
        with pytest.raises(text_models.ModelError, match="no-such-org/no-such-model"):
            text_models.resolve_model_source("no-such-org/no-such-model")
        assert time.monotonic() - start < 15


def test_missing_local_model_dir():
    with pytest.raises(text_models.ModelError, match="not found"):
        text_models.resolve_model_source("./no/such/dir")


def test_micro_batch_split_gives_the_same_gradient(small_corpus, builtin_model_dir):
    cfg = small_cfg(small_corpus)
    tok = text_models.load_tokenizer(str(builtin_model_dir))
    data = load_text_data(cfg, tok)
    torch.manual_seed(0)
    model = text_models.attach_lora(text_models.load_base_model(str(builtin_model_dir), "sdpa"), cfg)
    accel = Accelerator(cpu=True)
    ids = (0, 1, 2, 3)
    seq = max(len(data.train[i]) for i in ids)

    def grads(step: Step) -> list[torch.Tensor]:
        model.zero_grad()
        run_step(model, accel, data, step)
        return [p.grad.clone() for p in model.parameters() if p.requires_grad]

    whole = grads(Step((MicroBatch(ids, seq),)))
    split = grads(Step((MicroBatch(ids[:1], seq), MicroBatch(ids[1:3], seq), MicroBatch(ids[3:], seq))))
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_crash_while_checkpointing_keeps_the_last_good_one(tmp_path, small_corpus, monkeypatch):
    out = tmp_path / "r"
    train_text(small_cfg(small_corpus, max_steps=2, checkpoint_every=2), out, progress=False)
    good = ckpt.latest_checkpoint(out)
    assert good is not None and good.name == "step-00000002"
    real_save = torch.save

    def crash(obj, path, *a, **k):
        real_save(obj, path, *a, **k)
        raise KeyboardInterrupt("power cut while writing")

    monkeypatch.setattr(ckpt.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        train_text(small_cfg(small_corpus, max_steps=4, checkpoint_every=2), out, resume=True,
                   progress=False)
    assert ckpt.latest_checkpoint(out) == good
    assert json.loads((good / "trainer_state.json").read_text())["step"] == 2


def test_traditional_and_optimized_train_the_same_tokens(tmp_path, small_corpus):
    one_epoch = {"max_steps": 0, "epochs": 1, "pad_multiple": 8}
    trad = train_text(small_cfg(small_corpus, mode="traditional", **one_epoch), tmp_path / "t",
                      progress=False)
    opt = train_text(small_cfg(small_corpus, **one_epoch), tmp_path / "o", progress=False)
    packed = train_text(small_cfg(small_corpus, batching="packed", **one_epoch), tmp_path / "p",
                        progress=False)
    assert trad["real_tokens"] == opt["real_tokens"] == packed["real_tokens"]
    assert trad["steps"] == opt["steps"] == packed["steps"]
    assert trad["padded_tokens"] > opt["padded_tokens"] >= packed["padded_tokens"] >= packed["real_tokens"]
    # a packed row is padded only to the next multiple of 8: less than 8 tokens a row
    assert packed["padded_tokens"] - packed["real_tokens"] < 8 * packed["steps"] * 4


def test_ctrl_c_saves_a_checkpoint_and_resume_finishes(tmp_path, small_corpus):
    out = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "lora_gui", "train", "--set", f"data={small_corpus}", "--set",
           "max_seq_len=64", "--set", "batch_size=2", "--set", "max_steps=400", "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(read_records(out / "metrics.jsonl")) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr.decode()[-2000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "stopped"
    latest = ckpt.latest_checkpoint(out)
    assert json.loads((latest / "trainer_state.json").read_text())["step"] == run["steps"]
    resumed = subprocess.run([sys.executable, "-m", "lora_gui", "train", "--resume", str(out), "--set",
                              f"max_steps={run['steps'] + 2}", "--quiet"], env=env, cwd=ROOT,
                             capture_output=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert [r["step"] for r in read_records(out / "metrics.jsonl")] == list(range(1, run["steps"] + 3))


def test_cli_reports_bad_input_without_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"oops": 1}\n', encoding="utf-8")
    res = subprocess.run([sys.executable, "-m", "lora_gui", "train", "--set", f"data={bad}", "--out",
                          str(tmp_path / "r")], env=env, cwd=ROOT, capture_output=True, timeout=120)
    assert res.returncode == 2
    err = res.stderr.decode()
    assert "bad.jsonl:2" in err and "Traceback" not in err
