"""Fault-suite helpers: a finished tiny run to damage, the CLI in-process and as a subprocess,
and the check every case ends with (the last good checkpoint still loads)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lora_gui.cli import main
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.core import checkpoint as ckpt
from lora_gui.engine.core.records import read_records
from lora_gui.engine.text.train import train_text

ROOT = Path(__file__).resolve().parents[2]
INJECT = Path(__file__).with_name("inject.py")
TINY = {"max_seq_len": 64, "batch_size": 4, "lr": 5e-3, "eval_fraction": 0.1, "warmup_steps": 1,
        "precision": "fp32", "monitor_hz": 0.0, "checkpoint_every": 2}


def tiny_sets(data: Path, **extra) -> list[str]:
    """``--set`` arguments of a tiny text run on ``data``."""
    values = {**TINY, "data": str(data), **extra}
    return [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]


def tiny_cfg(data: Path, **extra) -> RunConfig:
    return apply_overrides(RunConfig(), {**TINY, "data": str(data), **extra})


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """40 short documents (the same words as tests/conftest.py's small corpus)."""
    words = "to be or not that is the question whether tis nobler in mind suffer".split()
    docs = [" ".join(words[(i + j) % len(words)] for j in range(3 + (i * 7) % 60)) for i in range(40)]
    path = tmp_path_factory.mktemp("faults") / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, corpus) -> Path:
    """A completed 2-step run with its checkpoint (copied by :func:`good_run`, never changed)."""
    out = tmp_path_factory.mktemp("faults") / "finished"
    train_text(tiny_cfg(corpus, max_steps=2), out, progress=False)
    return out


@pytest.fixture()
def good_run(finished_run, tmp_path) -> Path:
    """A fresh copy of the finished run to damage."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    return out


def assert_checkpoint_loads(out: Path, step: int | None = None) -> int:
    """The newest complete checkpoint reads back (adapter tensors, optimizer state, trainer
    state); returns its step."""
    path = ckpt.latest_checkpoint(out)
    assert path is not None, f"no complete checkpoint in {out}"
    contents = ckpt.read_checkpoint(path)
    assert contents["adapter"] and all(t.isfinite().all() for t in contents["adapter"].values())
    assert contents["state"]["optimizer"]["state"], "optimizer state is empty"
    if step is not None:
        assert contents["trainer"]["step"] == step
    return contents["trainer"]["step"]


def steps_of(out: Path) -> list[int]:
    return [r["step"] for r in read_records(out / "metrics.jsonl")]


@pytest.fixture()
def cli(capsys):
    """Runs ``python -m lora_gui ARGS`` in this process: (exit code, stderr). Signal handlers the
    CLI installs are put back afterwards."""

    def run(*args: str) -> tuple[int, str]:
        saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = main([str(a) for a in args])
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        return code, capsys.readouterr().err

    return run


def assert_clear_error(code: int, err: str, *needles: str) -> None:
    """A failed command: exit 2, one ``error:`` line naming what was wrong, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err, err
    assert err.startswith("error: ") or "\nerror: " in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def spawn(args: list[str], **fault_env: str) -> subprocess.Popen:
    """The CLI in a subprocess with a fault of tests/faults/inject.py."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **fault_env}
    return subprocess.Popen([sys.executable, str(INJECT), *map(str, args)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(predicate, timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def checkpoint_step(out: Path) -> int:
    path = ckpt.latest_checkpoint(out)
    return json.loads((path / "trainer_state.json").read_text())["step"] if path else 0
