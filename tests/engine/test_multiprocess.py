"""Two processes on the CPU (gloo) through `accelerate launch`: the same adapter as one process with
the same global batch, every sample once, resume into one process, FSDP, and bad launches.

`accelerate launch --cpu --num_processes 2` starts ONE process (accelerate's CPU launcher needs
mpirun for more), so the launches use the MULTI_GPU and FSDP configs of presets/accelerate/, which
on a machine without a GPU start two processes with the gloo backend. One thread per process:
the machine has two cores.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core import distributed, fsdp
from lora_gui.engine.core.records import read_records
from lora_gui.engine.text.train import train_text
from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.model_configs import load_model_config
from lora_gui.memory.predict.parallel import Parallel, per_gpu

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # starts accelerate launches
ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"max_seq_len": 64, "batch_size": 4, "max_steps": 6, "lr": 5e-3, "checkpoint_every": 3,
            "eval_fraction": 0.1, "warmup_steps": 1, "precision": "fp32", "monitor_hz": 0.0}
ACCEL = ROOT / "presets" / "accelerate"
EPOCH_STEPS = 9  # 36 training documents of the small corpus / 4 a step


def launch(tmp: Path, data: Path, out: Path, *extra: str, env: dict | None = None,
           settings: dict | None = None, config: str = "multi-gpu.yaml") -> subprocess.CompletedProcess:
    """`accelerate launch` with one of presets/accelerate/ (on a CPU they start gloo processes)."""
    args = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--num_cpu_threads_per_process", "1",
            "--main_process_port", str(free_port()), "--config_file", str(ACCEL / config), *extra,
            "-m", "lora_gui", "train", "--json",
            "--set", f"data={data}", "--out", str(out), "--quiet"]
    for key, value in {**SETTINGS, **(settings or {})}.items():
        args[-3:-3] = ["--set", f"{key}={value}"]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(args, cwd=tmp, env=full_env, capture_output=True, text=True, timeout=300)


def free_port() -> int:
    with socket.socket() as sock:  # other test sessions on this machine launch too
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def step6(run: Path) -> Path:
    return run / "checkpoints" / "step-00000006" / "adapter.safetensors"


def adapters_close(a: Path, b: Path) -> None:
    left, right = load_file(a), load_file(b)
    assert sorted(left) == sorted(right)
    for key in left:  # Adam at lr 5e-3 turns 1e-7 summation-order differences into ~1e-5
        torch.testing.assert_close(left[key], right[key], rtol=1e-3, atol=2e-4)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    words = "to be or not that is the question whether tis nobler in mind suffer".split()
    docs = [" ".join(words[(i + j) % len(words)] for j in range(3 + (i * 7) % 60)) for i in range(40)]
    path = tmp_path_factory.mktemp("data") / "small.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory) -> Path:
    """The reference: one process, the same global batch and seed, 6 steps."""
    out = tmp_path_factory.mktemp("single") / "run"
    train_text(apply_overrides(RunConfig(), {**SETTINGS, "data": str(corpus)}), out, progress=False)
    return out


@pytest.fixture(scope="module")
def ddp(corpus, tmp_path_factory) -> Path:
    """Two processes; rank 1 runs out of memory once at step 2 (test hook) and both split."""
    tmp = tmp_path_factory.mktemp("ddp")
    res = launch(tmp, corpus, tmp / "run", env={distributed.DEBUG_SAMPLES_ENV: "1",
                                                distributed.INJECT_OOM_ENV: "1:2"},
                 settings={"report_to": "tensorboard"})  # the main process alone logs to it
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count('"status": "completed"') == 1  # one summary per launch
    return tmp / "run"


def test_two_processes_train_the_same_adapter_as_one(single, ddp):
    adapters_close(step6(single), step6(ddp))
    one = read_records(single / "metrics.jsonl")[:6]
    two = read_records(ddp / "metrics.jsonl")[:6]
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-5)
    assert [r["real_tokens"] for r in two] == [r["real_tokens"] for r in one]
    assert all(len(r["peak_bytes_by_rank"]) == 2 and r["peak_bytes"] == max(r["peak_bytes_by_rank"])
               for r in two if r["peak_bytes"] is not None)  # None: a step the CPU meter skipped
    assert two[0]["peak_bytes"] is not None
    run = json.loads((ddp / "run.json").read_text())
    assert run["world_size"] == 2 and len(run["peak_bytes_by_rank"]) == 2
    assert not list(ddp.glob("*.rank*"))  # the main process wrote the folder alone


def test_only_the_main_process_logs_to_the_tracker(ddp):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(list((ddp / "tensorboard").glob("events.out.tfevents.*"))) == 1  # one writer
    acc = EventAccumulator(str(ddp / "tensorboard"))
    acc.Reload()
    records = read_records(ddp / "metrics.jsonl")[:6]
    logged = {e.step: e.value for e in acc.Scalars("loss")}
    assert sorted(logged) == [r["step"] for r in records]
    assert [logged[r["step"]] for r in records] == pytest.approx([r["loss"] for r in records], rel=1e-6)
    assert {e.step: e.value for e in acc.Scalars("peak_bytes_by_rank/1")}[2] == \
        pytest.approx(records[1]["peak_bytes_by_rank"][1], rel=1e-6)


def test_out_of_memory_on_one_rank_splits_on_both(ddp):
    ooms = [e for e in read_records(ddp / "events.jsonl") if e["event"] == "oom"]
    assert [(e["rank"], e["step"], e["new_cap"]) for e in ooms] == [(1, 2, 1)]
    records = read_records(ddp / "metrics.jsonl")[:6]
    assert [r["micro_batches"] for r in records] == [1, 2, 2, 2, 2, 2]  # 2 samples a rank, cap 1


def test_resume_from_two_processes_into_one(single, ddp, corpus, monkeypatch):
    monkeypatch.setenv(distributed.DEBUG_SAMPLES_ENV, "1")
    more = {**SETTINGS, "data": str(corpus), "max_steps": EPOCH_STEPS}
    train_text(apply_overrides(RunConfig(), more), single, resume=True, progress=False)
    summary = train_text(apply_overrides(RunConfig(), more), ddp, resume=True, progress=False)
    assert summary["status"] == "completed" and summary["world_size"] == 1
    records = read_records(ddp / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, EPOCH_STEPS + 1))
    assert [len(r["samples_by_rank"]) for r in records] == [2] * 6 + [1] * 3
    seen = sorted(i for r in records for rank in r["samples_by_rank"] for i in rank)
    assert seen == list(range(36))  # one epoch across both launches: every sample exactly once
    adapters_close(single / "adapter" / "adapter_model.safetensors",
                   ddp / "adapter" / "adapter_model.safetensors")


def test_fsdp_two_processes_shard_frozen_weights_and_match(single, corpus, tmp_path):
    res = launch(tmp_path, corpus, tmp_path / "run", config="fsdp.yaml")
    assert res.returncode == 0, res.stderr[-3000:]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    full = sum(p.numel() * 4 for p in load_file(
        ROOT / "assets" / "base-model" / "model.safetensors").values())
    assert run["fsdp"] is True
    assert run["frozen_bytes_by_rank"] == [full // 2] * 2  # each rank holds half the frozen weights
    one_gpu = estimate_text_step(load_model_config(str(ROOT / "assets" / "base-model")), batch_size=1,
                                 seq_len=64, lora_rank=8, dtype="float32", device="cpu")
    planned = per_gpu(one_gpu, load_model_config(str(ROOT / "assets" / "base-model")), Parallel(2, True))
    assert planned.breakdown["frozen_weights"] == pytest.approx(full // 2, rel=0.01)  # the planner agrees
    adapters_close(step6(single), step6(tmp_path / "run"))
    losses = [r["loss"] for r in read_records(tmp_path / "run" / "metrics.jsonl")]
    assert losses == pytest.approx([r["loss"] for r in read_records(single / "metrics.jsonl")][:6], rel=1e-5)


def test_more_processes_than_samples_is_refused(tmp_path):
    data = tmp_path / "one.txt"
    data.write_text("a single short document here\n", encoding="utf-8")
    res = launch(tmp_path, data, tmp_path / "run", settings={"eval_fraction": 0.0})
    assert res.returncode != 0
    assert "2 processes but only 1 training samples" in res.stderr
    assert res.stderr.count("error: 2 processes") == 1  # said once, by the main process


def test_cpu_launch_that_starts_one_process_is_refused(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="--multi_gpu --num_processes N"):
        distributed.Dist.from_env()


def test_batch_smaller_than_processes_is_refused():
    with pytest.raises(ConfigError, match="batch_size: 2 samples .* 4 processes"):
        distributed.check_world_size(4, 100, 2)


def test_fsdp_refuses_a_model_it_cannot_wrap(monkeypatch):
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))

    monkeypatch.delenv("FSDP_TRANSFORMER_CLS_TO_WRAP", raising=False)
    with pytest.raises(ConfigError, match="cannot wrap Plain: it declares no transformer layer"):
        fsdp.layer_classes(Plain())
    with pytest.raises(ConfigError, match="has no layer class LlamaDecoderLayer"):
        fsdp.layer_classes(Plain(), ["LlamaDecoderLayer"])
    assert fsdp.layer_classes(Plain(), ["Linear"]) == (torch.nn.Linear,)


@pytest.mark.parametrize("name", ["one-gpu", "multi-gpu", "multi-node", "fsdp"])
def test_accelerate_config_files_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ACCEL / f"{name}.yaml"))
    assert config.distributed_type.value == {"one-gpu": "NO", "fsdp": "FSDP"}.get(name, "MULTI_GPU")
    assert (ACCEL / f"{name}.yaml").read_text().startswith("# ")
