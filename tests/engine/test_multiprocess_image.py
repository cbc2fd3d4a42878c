"""Image runs on two processes (CPU, gloo) through `accelerate launch`: the same losses and adapter
as one process with the same global batch and seed, every image once per epoch across ranks, an
out-of-memory split decided on both ranks, a resume from two processes into one, FSDP refused.

Five 512 px demo pictures, all in one square bucket, batch_size 4: epoch 0 is one step of 4
images (2 per rank) and one of 1 image (rank 1 trains nothing and adds zero gradients).
One thread per process: the machine has two cores.
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

from lora_gui.config import ConfigError
from lora_gui.data.build_images import build
from lora_gui.engine.core import distributed
from lora_gui.engine.core.records import read_records
from lora_gui.engine.image.train import epoch_plan, load_image_data, train_image
from lora_gui.presets import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # starts accelerate launches
ROOT = Path(__file__).resolve().parents[2]
ACCEL = ROOT / "presets" / "accelerate"
SETTINGS = {"batch_size": 4, "max_steps": 2, "lr": 5e-3, "checkpoint_every": 1, "eval_fraction": 0.0,
            "warmup_steps": 0, "precision": "fp32", "monitor_hz": 0.0, "sample_images": 0,
            "aspect_buckets": "off", "lora_rank": 4}
ADAPTER = "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pictures")
    build(out, count=5)
    return out


def config(folder: Path, **extra):
    return load_config("image-512", {**SETTINGS, "data": str(folder), **extra})


def free_port() -> int:
    with socket.socket() as sock:  # other test sessions on this machine launch too
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(tmp: Path, folder: Path, out: Path, env: dict | None = None,
           ) -> subprocess.CompletedProcess:
    """`accelerate launch` of an image run with 2 processes (gloo on a machine without a GPU)."""
    args = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--num_cpu_threads_per_process", "1",
            "--main_process_port", str(free_port()), "--config_file", str(ACCEL / "multi-gpu.yaml"),
            "-m", "lora_gui", "train", "--json", "--preset", "image-512", "--out", str(out), "--quiet"]
    for key, value in {**SETTINGS, "data": folder}.items():
        args += ["--set", f"{key}={value}"]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(args, cwd=tmp, env=full_env, capture_output=True, text=True, timeout=300)


def close(a: Path, b: Path) -> None:
    left, right = load_file(a), load_file(b)
    assert sorted(left) == sorted(right)
    for key in left:  # summation order over ranks differs: ~1e-7, grown by Adam at lr 5e-3
        torch.testing.assert_close(left[key], right[key], rtol=1e-3, atol=2e-4)


@pytest.fixture(scope="module")
def four_image_step(folder) -> int:
    """The 1-based step of epoch 0 that holds 4 images (the other holds 1)."""
    plan = epoch_plan(config(folder), load_image_data(config(folder)).buckets, 0)
    assert sorted(len(s.indices) for s in plan) == [1, 4]
    return next(k for k, s in enumerate(plan, 1) if len(s.indices) == 4)


@pytest.fixture(scope="module")
def single(folder, tmp_path_factory) -> Path:
    """The reference: one process, the same global batch and seed, 2 steps."""
    out = tmp_path_factory.mktemp("single") / "run"
    train_image(config(folder), out, progress=False)
    return out


@pytest.fixture(scope="module")
def ddp(folder, four_image_step, tmp_path_factory) -> Path:
    """Two processes, 2 steps; rank 1 runs out of memory once in the 4-image step (test hook)."""
    tmp = tmp_path_factory.mktemp("ddp")
    res = launch(tmp, folder, tmp / "run", env={distributed.DEBUG_SAMPLES_ENV: "1",
                                                distributed.INJECT_OOM_ENV: f"1:{four_image_step}"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count('"status": "completed"') == 1  # one summary per launch
    return tmp / "run"


def test_two_processes_train_the_same_image_adapter_as_one(single, ddp, four_image_step):
    close(single / "checkpoints" / "step-00000002" / "adapter.safetensors",
          ddp / "checkpoints" / "step-00000002" / "adapter.safetensors")
    one, two = read_records(single / "metrics.jsonl"), read_records(ddp / "metrics.jsonl")
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-5)
    assert [r["images"] for r in two] == [r["images"] for r in one]
    assert all(len(r["peak_bytes_by_rank"]) == 2 and r["peak_bytes"] == max(r["peak_bytes_by_rank"])
               for r in two if r["peak_bytes"] is not None)  # None: a step the CPU meter skipped
    assert two[0]["peak_bytes"] is not None
    # every image of epoch 0 exactly once across ranks; the 4-image step dealt 2 + 2
    seen = sorted(i for r in two for rank in r["samples_by_rank"] for i in rank)
    assert seen == list(range(5))
    assert [len(rank) for rank in two[four_image_step - 1]["samples_by_rank"]] == [2, 2]
    run = json.loads((ddp / "run.json").read_text())
    assert run["world_size"] == 2 and len(run["peak_bytes_by_rank"]) == 2
    assert (ddp / "adapter" / ADAPTER).is_file() and not list(ddp.glob("*.rank*"))


def test_out_of_memory_on_one_rank_splits_images_on_both(ddp, four_image_step):
    ooms = [e for e in read_records(ddp / "events.jsonl") if e["event"] == "oom"]
    assert [(e["rank"], e["step"], e["new_cap"]) for e in ooms] == [(1, four_image_step, 1)]
    record = read_records(ddp / "metrics.jsonl")[four_image_step - 1]
    assert record["micro_batches"] == 2  # 2 images a rank, cap 1 after the agreed split


def test_image_resume_from_two_processes_into_one(single, ddp, folder):
    train_image(config(folder, max_steps=3), single, resume=True, progress=False)  # the same schedule
    summary = train_image(config(folder, max_steps=3), ddp, resume=True, progress=False)
    assert summary["status"] == "completed" and summary["world_size"] == 1
    records = read_records(ddp / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[2]["loss"] == pytest.approx(read_records(single / "metrics.jsonl")[2]["loss"], rel=1e-5)
    close(single / "adapter" / ADAPTER, ddp / "adapter" / ADAPTER)


def test_fsdp_image_run_is_refused_before_writing(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what an accelerate FSDP config sets
    with pytest.raises(ConfigError, match=r"image runs \(task=image\) do not support FSDP"):
        train_image(config(folder), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_resume_with_another_global_batch_is_refused(single, folder):
    before = (single / "config.json").read_text()
    with pytest.raises(ConfigError, match="incompatible run: batch_size 4 then, 2 now"):
        train_image(config(folder, batch_size=2, max_steps=4), single, resume=True, progress=False)
    assert (single / "config.json").read_text() == before  # nothing in the folder changed
