"""A dashboard run in its own process, followed by files.

Every run the dashboard starts is the same CLI a user would run (``python -m lora_gui train ...``,
or ``accelerate launch --multi_gpu --num_processes N -m lora_gui train ...`` on N local GPUs),
started in a session of its own so that it outlives the dashboard: closing the terminal, a crash
or restart of the web server, or the out-of-memory killer picking the server leaves the training
running. The job follows the run folder the run's main process writes: metrics.jsonl,
events.jsonl and memory.jsonl feed the job's records, and run.json ends it. A dashboard started
later re-attaches to a run whose folder lock is live (:func:`follow_existing`). A stop request
writes ``RUN/STOP``, which the main process reads after each step and every rank obeys at the
same step (:func:`lora_gui.engine.core.distributed.stop_agreed`); a second stop ends the process.
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
from lora_gui.engine.jobs.card_guard import note_pid
from lora_gui.memory.runtime.alloc_conf import use_expandable_segments

POLL_S = 0.5  # seconds between reads of the run folder
REPO = Path(__file__).resolve().parents[3]  # where `python -m lora_gui` is importable from


FSDP_CONFIG = REPO / "presets" / "accelerate" / "fsdp.yaml"  # FSDP2, one unit per decoder layer


def launch_command(preset_file: Path, out: Path, processes: int, resume: bool, *, fsdp: bool = False,
                   offload: bool = False) -> list[str]:
    """The command line of a run: the CLI itself for one process, accelerate launch for
    ``processes`` local processes: replicated (DDP), or with ``fsdp`` the frozen weights sharded
    by presets/accelerate/fsdp.yaml (``offload``: the shards in host memory), as the plan for
    ``--world-size N --fsdp [--offload]`` assumes."""
    run = ["--resume", str(out)] if resume else [
        "--preset", str(preset_file), "--out", str(out), "--overwrite"]
    if processes <= 1:
        return [sys.executable, "-m", "lora_gui", "train", *run, "--quiet"]
    how = (["--config_file", str(FSDP_CONFIG), "--fsdp_offload_params", "true" if offload else "false"]
           if fsdp else ["--multi_gpu"])
    return [sys.executable, "-m", "accelerate.commands.launch", *how, "--num_processes",
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


def run_launched(job, processes: int, resume: bool, overwrite: bool, launch_dir: Path, *,
                 fsdp: bool = False, offload: bool = False) -> None:
    """Runs the job as a process of its own and mirrors its run folder into ``job`` (a
    :class:`lora_gui.engine.jobs.manager.Job`) until it exits; sets the job's status and summary.
    ``fsdp`` / ``offload``: how several processes share the model (:func:`launch_command`)."""
    # bad input is refused before an older run is replaced: nothing lost
    check_before_replacing(job.cfg, job.out, check_inputs, resume=resume, overwrite=overwrite)
    prepare_run_dir(job.out, resume=resume, overwrite=overwrite)  # folder errors show in the UI at once
    release_run_folder(job.out)  # the launch's main process takes the folder's lock itself
    launch_dir.mkdir(parents=True, exist_ok=True)
    preset = launch_dir / f"{job.name}.yaml"
    settings = diff_from_defaults(job.cfg) or {"seed": job.cfg.seed}
    preset.write_text("# Settings of a run started from the dashboard.\n" + yaml.safe_dump(settings),
                      encoding="utf-8")
    log_path = launch_dir / f"{job.name}.log"
    with log_path.open("w", encoding="utf-8") as log:
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        use_expandable_segments(env)  # the run's CUDA allocator, as its plan models it
        # a session of its own: the run outlives the dashboard and its terminal's Ctrl-C
        command = launch_command(preset, job.out, processes, resume, fsdp=fsdp, offload=offload)
        proc = subprocess.Popen(command, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        job.pid = proc.pid
        note_pid(job.out.parent, job.out, proc.pid)  # the card stays claimed while it lives
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
    # the CLI's "error: ..." line without its prefix: the page says "Error:" itself
    job.error = tail[-1][len("error:"):].strip() if tail else _died(job.out, proc.returncode, log_path)
    job.add_event(f"failed: {job.error}")
    record_early_failure(job.out, job.cfg, job.error)


def record_early_failure(out: Path, cfg, message: str) -> None:
    """A run that failed before it wrote its settings (bad data or model found by the run itself)
    leaves its settings and a run.json saying "failed" and why, so the Runs tab lists it as a
    failed run with its reason instead of an empty folder no tab shows."""
    from lora_gui.engine.core.checkpoint import write_atomic
    from lora_gui.engine.core.rundir import save_run_config

    if not out.is_dir() or (out / "config.json").is_file() or (out / "run.json").is_file():
        return
    try:
        save_run_config(out, cfg)
        write_atomic(out / "run.json", json.dumps({"status": "failed", "error": message, "steps": 0,
                                                   "adapter": None}, indent=1))
    except OSError:  # a folder that cannot be written keeps the job's own message
        pass


def _died(out: Path, returncode: int | None, log_path: Path) -> str:
    """Why a launch ended without a summary: killed by a signal, or its training process gone."""
    how = (f"was killed (signal {-returncode})" if returncode is not None and returncode < 0 else
           f"ended without finishing (accelerate launch exited with {returncode}, see {log_path})")
    return died_message(out, how)


def _writer_gone(out: Path, seen_writer: bool) -> bool:
    """True once the launch's main process took the folder's lock and no longer holds it while
    no run.json was written: it died from outside (kill -9, the out-of-memory killer)."""
    return seen_writer and not lock_is_live(out) and not (out / "run.json").is_file()


def follow_existing(job) -> None:
    """Follows a run another process started (a dashboard restarted while it trains) until its
    writer lets the folder go; sets the job's status and summary from run.json, or "failed"
    with the last step and the resume command when the writer died without one."""
    _follow(job, None)
    summary_path = job.out / "run.json"
    if job.status == "failed":
        return
    if summary_path.is_file():
        job.summary = json.loads(summary_path.read_text(encoding="utf-8"))
        job.status = job.summary["status"]
        job.add_event(f"{job.status}: adapter saved in {job.summary['adapter']}")
        return
    job.status, job.error = "failed", died_message(job.out, "ended without finishing")
    job.add_event(f"failed: {job.error}")


def _follow(job, proc: subprocess.Popen | None) -> None:
    """Mirrors the run folder into ``job`` until ``proc`` exits (or, without a process handle,
    until the folder's writer lets it go)."""
    tails = {name: _Tail(job.out / name) for name in ("metrics.jsonl", "events.jsonl", "memory.jsonl")}
    stop_sent, seen_writer = False, proc is None
    while True:
        done = proc.poll() is not None if proc is not None else not lock_is_live(job.out)
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
        if proc is not None and _writer_gone(job.out, seen_writer):  # the launcher may wait on other ranks
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

