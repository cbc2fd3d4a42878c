"""FSDP over a 4-bit (nf4) base on the CPU: 2 and 3 gloo processes through `accelerate launch`
with presets/accelerate/fsdp.yaml, against one process and against the per-rank plan.

Each launch runs in a session of its own, killed when the test ends early (timeout, interrupt,
failure) with every process below it: accelerate's launcher starts the ranks as its children, each
in a session of its own. One thread per process.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.core.records import read_records
from lora_gui.engine.text.train import train_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # starts accelerate launches
ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"quantization": "nf4", "precision": "fp32", "max_seq_len": 64, "batch_size": 6,
            "max_steps": 4, "lr": 5e-3, "checkpoint_every": 2, "eval_fraction": 0.1,
            "warmup_steps": 1, "monitor_hz": 0.0}
LAUNCH_SECONDS = 300


def free_port() -> int:
    import socket

    with socket.socket() as sock:  # other test sessions on this machine launch too
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc. torch's launcher starts each rank in a
    session of its own, so killing the launcher's process group alone would leave them running."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:  # "pid (name) state ppid ...": the name may hold spaces and parentheses
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # ended meanwhile
                continue
    found, frontier = [], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += sorted(frontier)
    return found


def launch(tmp: Path, out: Path, processes: int, resume: bool = False, stop_after: int | None = None,
           **settings) -> subprocess.CompletedProcess:
    """`accelerate launch` of `train` with the FSDP config; the whole process group is killed on
    any way out but a normal end. ``stop_after``: touch the run's STOP file (as the dashboard's
    Stop does) once that many steps are recorded."""
    args = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--num_cpu_threads_per_process", "1", "--main_process_port", str(free_port()),
            "--config_file", str(ROOT / "presets" / "accelerate" / "fsdp.yaml"),
            "-m", "lora_gui", "train", "--json", "--quiet",
            *(["--resume", str(out)] if resume else ["--out", str(out)])]
    for key, value in (settings if resume else {**SETTINGS, **settings}).items():  # a resume: its own
        args += ["--set", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    logs = tmp / f"launch-{time.monotonic_ns()}"
    with open(f"{logs}.out", "w") as stdout, open(f"{logs}.err", "w") as stderr:
        proc = subprocess.Popen(args, cwd=tmp, env=env, stdout=stdout, stderr=stderr,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + LAUNCH_SECONDS
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"launch still running after {LAUNCH_SECONDS} s: {args}")
            metrics = out / "metrics.jsonl"
            if stop_after and metrics.exists() and len(metrics.read_text().splitlines()) >= stop_after:
                (out / "STOP").touch()
            time.sleep(0.2)
    finally:
        if proc.poll() is None or proc.returncode != 0:  # interrupted, timed out or failed: no orphans
            for pid in descendants(proc.pid):  # the ranks first: sessions of their own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, Path(f"{logs}.out").read_text(),
                                       Path(f"{logs}.err").read_text())


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_records(run / "metrics.jsonl")]


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    """The reference: one process, the same global batch, seed and steps."""
    out = tmp_path_factory.mktemp("single") / "run"
    train_text(apply_overrides(RunConfig(), SETTINGS), out, progress=False)
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("two")
    res = launch(tmp, tmp / "run", 2)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "run"


def check_ranks_against_plan(run: Path, processes: int) -> None:
    """Every rank's tracked peak within -1%...+3% of the per-rank plan (source: predicted)."""
    summary = json.loads((run / "run.json").read_text())
    report = summary["memory_report"]
    assert summary["fsdp"] is True and summary["world_size"] == processes
    assert report["source"] == "tracker" and report["predicted_source"] == "predicted"
    planned = report["predicted_peak_bytes"]
    peaks = summary["peak_bytes_by_rank"]
    assert len(peaks) == processes
    for rank, peak in enumerate(peaks):
        assert -0.01 <= (planned - peak) / peak <= 0.03, (rank, planned, peaks)


def test_two_processes_shard_the_4bit_base_and_match_one(single, two):
    assert losses(two) == pytest.approx(losses(single), rel=1e-5)
    summary = json.loads((two / "run.json").read_text())
    one = json.loads((single / "run.json").read_text())
    # each rank holds half of the frozen parameters (packed 4-bit layers, fp32 embedding, norms)
    assert summary["frozen_bytes_by_rank"][0] == summary["frozen_bytes_by_rank"][1]
    assert summary["peak_bytes_by_rank"][0] < one["memory_report"]["peak_bytes"]
    check_ranks_against_plan(two, 2)
    left, right = load_file(single / "adapter" / "adapter_model.safetensors"), \
        load_file(two / "adapter" / "adapter_model.safetensors")
    assert sorted(left) == sorted(right)
    for key in left:  # Adam at lr 5e-3 turns summation-order differences into ~1e-5
        torch.testing.assert_close(left[key], right[key], rtol=1e-3, atol=2e-4)


def test_only_the_main_process_loads_the_base(two):
    """The other rank builds the model on the meta device and receives its shards: while loading
    it holds no weights (the rotary frequencies only), the main process the whole base."""
    summary = json.loads((two / "run.json").read_text())
    loaded, frozen = summary["loaded_bytes_by_rank"], summary["frozen_bytes_by_rank"]
    assert loaded[0] >= sum(frozen)  # the whole 4-bit base: both ranks' shards
    assert 0 < loaded[1] < 0.001 * loaded[0], loaded


def test_the_adapter_is_saved_once_and_loads_with_peft(two):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert len(list(two.rglob("adapter_model.safetensors"))) == 1  # the main process wrote it once
    base = AutoModelForCausalLM.from_pretrained(ROOT / "assets" / "base-model")
    model = PeftModel.from_pretrained(base, two / "adapter")
    saved = load_file(two / "adapter" / "adapter_model.safetensors")
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(saved)
    key = next(iter(saved))
    assert torch.equal(loaded[key.replace(".weight", ".default.weight")], saved[key])


def test_resume_under_fsdp_is_exact(two, tmp_path):
    launch(tmp_path, tmp_path / "run", 2, stop_after=2)  # stopped as the dashboard stops it (exit 130)
    stopped = json.loads((tmp_path / "run" / "run.json").read_text())
    assert stopped["status"] == "stopped" and len(losses(tmp_path / "run")) < 4
    res = launch(tmp_path, tmp_path / "run", 2, resume=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert losses(tmp_path / "run") == losses(two)  # the same numbers, step for step
    left = load_file(two / "adapter" / "adapter_model.safetensors")
    right = load_file(tmp_path / "run" / "adapter" / "adapter_model.safetensors")
    for key in left:
        torch.testing.assert_close(left[key], right[key], rtol=0, atol=0)


def test_three_processes_per_rank_peaks_as_planned(single, tmp_path):
    res = launch(tmp_path, tmp_path / "run", 3)
    assert res.returncode == 0, res.stderr[-3000:]
    check_ranks_against_plan(tmp_path / "run", 3)
    assert losses(tmp_path / "run") == pytest.approx(losses(single), rel=1e-5)
