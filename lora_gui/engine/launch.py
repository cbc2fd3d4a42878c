"""A dashboard job on several local GPUs: ``accelerate launch`` as a subprocess, followed by files.

The UI process cannot host the N training processes, so the job runs the same CLI as a user
would (``accelerate launch --multi_gpu --num_processes N -m lora_gui train ...``) and follows
the run folder the main process writes: metrics.jsonl, events.jsonl and memory.jsonl (one
sample a second per rank, labelled ``rank``) feed the job's records, and run.json ends it. A
stop request writes ``RUN/STOP``, which the main process reads after each step and every rank
obeys at the same step (:func:`lora_gui.engine.core.distributed.stop_agreed`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from lora_gui.config import diff_from_defaults
from lora_gui.engine import check_inputs
from lora_gui.engine.core.distributed import STOP_FILE
from lora_gui.engine.core.lock import LOCK_FILE, lock_is_live, release_run_folder
from lora_gui.engine.core.preflight import check_before_replacing
from lora_gui.engine.core.rundir import prepare_run_dir
from lora_gui.engine.core.runstate import died_message

POLL_S = 0.5  # seconds between reads of the run folder
REPO = Path(__file__).resolve().parents[2]  # where `python -m lora_gui` is importable from


def launch_command(preset_file: Path, out: Path, processes: int, resume: bool) -> list[str]:
    """The accelerate launch command line for a run of ``processes`` local processes."""
    run = ["--resume", str(out)] if resume else [
        "--preset", str(preset_file), "--out", str(out), "--overwrite"]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
            str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "-m", "lora_gui", "train", *run, "--quiet"]


class _Tail:
    """New complete JSON lines of a file that only grows (or is rewritten on resume)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def read(self) -> tuple[list[dict[str, Any]], bool]:
        """(new records, whether the file was rewritten from the start)."""
        if not self.path.is_file():
            return [], False
        size = self.path.stat().st_size
        restarted = size < self.offset
        if restarted:
            self.offset = 0
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1  # a half-written last line waits for the next read
        self.offset += end
        return [json.loads(line) for line in chunk[:end].decode().splitlines() if line.strip()], restarted


def run_launched(job, processes: int, resume: bool, overwrite: bool, launch_dir: Path) -> None:
    """Runs the job as a launched subprocess and mirrors its run folder into ``job`` (a
    :class:`lora_gui.engine.jobs.Job`) until it exits; sets the job's status and summary."""
    # bad input is refused before an older run is replaced: nothing lost
    check_before_replacing(job.cfg, job.out, check_inputs, resume=resume, overwrite=overwrite)
    prepare_run_dir(job.out, resume=resume, overwrite=overwrite)  # folder errors show in the UI at once
    release_run_folder(job.out)  # the launch's main process takes the folder's lock itself
    launch_dir.mkdir(parents=True, exist_ok=True)
    preset = launch_dir / f"{job.name}.yaml"
    settings = diff_from_defaults(job.cfg) or {"seed": job.cfg.seed}
    preset.write_text("# Settings of a dashboard run launched on several GPUs.\n" + yaml.safe_dump(settings),
                      encoding="utf-8")
    log_path = launch_dir / f"{job.name}.log"
    with log_path.open("w", encoding="utf-8") as log:
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        proc = subprocess.Popen(launch_command(preset, job.out, processes, resume), stdout=log,
                                stderr=subprocess.STDOUT, env=env)
        _follow(job, proc)
    if job.status == "failed":  # seen dead by _follow while the launcher still ran
        return
    summary_path = job.out / "run.json"
    if proc.returncode == 0 or (proc.returncode == 130 and summary_path.is_file()):
        job.summary = json.loads(summary_path.read_text(encoding="utf-8"))
        job.status = job.summary["status"]
        job.add_event(f"{job.status}: adapter saved in {job.summary['adapter']}")
        return
    tail = [line for line in log_path.read_text(encoding="utf-8").splitlines() if line.startswith("error:")]
    job.status = "failed"
    job.error = tail[-1] if tail else _died(job.out, proc.returncode, log_path)
    job.add_event(f"failed: {job.error}")


def _died(out: Path, returncode: int | None, log_path: Path) -> str:
    """Why a launch ended without a summary: killed by a signal, or its training process gone."""
    how = (f"was killed (signal {-returncode})" if returncode is not None and returncode < 0 else
           f"ended without finishing (accelerate launch exited with {returncode}, see {log_path})")
    return died_message(out, how)


def _writer_gone(out: Path, seen_writer: bool) -> bool:
    """True once the launch's main process took the folder's lock and no longer holds it while
    no run.json was written: it died from outside (kill -9, the out-of-memory killer)."""
    return seen_writer and not lock_is_live(out) and not (out / "run.json").is_file()


def _follow(job, proc: subprocess.Popen) -> None:
    tails = {name: _Tail(job.out / name) for name in ("metrics.jsonl", "events.jsonl", "memory.jsonl")}
    stop_sent, seen_writer = False, False
    while True:
        done = proc.poll() is not None
        seen_writer = seen_writer or ((job.out / LOCK_FILE).is_file() and lock_is_live(job.out))
        if job.control.stop.is_set() and not stop_sent and job.out.is_dir():
            (job.out / STOP_FILE).touch()
            stop_sent = True
        records, restarted = tails["metrics.jsonl"].read()
        if restarted:
            with job._lock:
                job.records.clear()
        for record in records:
            job.add_record(record)
        for event in tails["events.jsonl"].read()[0]:
            if event.get("event") == "plan" and job.phase == "loading":
                job.on_engine_event({"event": "phase", "phase": "training", "time": event["time"]})
            job.on_engine_event(event)
        for sample in tails["memory.jsonl"].read()[0]:
            job.add_sample(sample)
        if done:
            return
        if _writer_gone(job.out, seen_writer):  # the launcher may still wait on the other ranks
            job.status, job.error = "failed", died_message(job.out, "was killed from outside")
            job.add_event(f"failed: {job.error}")
            _end(proc)
            return
        time.sleep(POLL_S)


def _end(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stops a launcher whose main process is gone (terminate, then kill after ``grace_s``)."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

