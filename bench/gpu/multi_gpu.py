"""The 2-GPU check: FSDP over an nf4 base on two GPUs, each rank's measured peak beside the
per-rank plan (``python -m bench.gpu.check --sections multi_gpu``).

Runs only where ``torch.cuda.device_count() >= 2``; elsewhere it writes one row that says
``skipped: N GPUs``. The shape is Llama-2-70B's (presets/models/llama-2-70b.json) cut to 2 decoder
layers: the published 70B rows' layer, head and vocabulary sizes (FSDP's units are one layer each),
random bf16 weights built from the config and saved to a temporary folder (nothing downloaded),
with the bundled demo's tokenizer (4,096 ids, inside the 32,000-row embedding). The run is
``accelerate launch --config_file presets/accelerate/fsdp.yaml --num_processes 2 -m lora_gui train``
with PEFT's 70B settings where they apply (nf4 base, LoRA r 8, batch 2, gradient checkpointing,
2,048-token rows), for a few steps on the text demo's data.

Measured: each rank's largest step peak (``peak_bytes_by_rank`` in the run's run.json:
``torch.cuda.max_memory_allocated`` on a GPU, the tracker on a CPU) and rank 0's largest reserved
bytes (the monitor samples the main process only: ``cuda_allocator_reserved_bytes`` in
memory.jsonl). Planned: ``lora_gui.memory.predict.predict(cfg, processes=2, fsdp=True)`` for the
same settings, as ``plan --world-size 2 --fsdp --json`` prints it (allocated and reserved per GPU).

Smoke mode (a CPU): the same launch, records and comparison with 2 gloo processes on the bundled
demo model, planned for the CPU (the tracker's figures; no reserved figure there).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
FSDP_CONFIG = ROOT / "presets" / "accelerate" / "fsdp.yaml"
LAYERS = 2  # decoder layers kept of Llama-2-70B's 80
PROCESSES = 2
# PEFT's 70B QLoRA + FSDP settings where lora_gui has them (the published rows)
GPU_SETTINGS = {"quantization": "nf4", "lora_rank": 8, "batch_size": 2, "max_seq_len": 2048,
                "gradient_checkpointing": True, "max_steps": 3, "eval_fraction": 0.0, "monitor_hz": 5.0,
                "budget_gb": 0, "batching": "fixed"}
# batching fixed: every micro-batch is the planned shape (rows at max_seq_len). With bucketed
# batches a few steps train whichever length buckets the seed draws, and the plan is for the
# longest: the smoke row read +5.2% (14 MiB measured) that way, +0.4% (17 MiB) with fixed rows
SMOKE_SETTINGS = {"quantization": "nf4", "precision": "fp32", "max_seq_len": 64, "batch_size": 4,
                  "max_steps": 2, "eval_fraction": 0.0, "monitor_hz": 0.0, "budget_gb": 0,
                  "batching": "fixed"}
LAUNCH_SECONDS = 480  # the whole launch: loading both ranks, the steps, the adapter


def check_multi_gpu(smoke: bool = False) -> list[dict[str, Any]]:
    """One row per rank of the 2-process FSDP nf4 run (or one "skipped" row without 2 GPUs)."""
    gpus = torch.cuda.device_count()
    if not smoke and gpus < PROCESSES:
        return [{"row": "2 GPUs, FSDP, nf4 base", "skipped": f"skipped: {gpus} GPUs"}]
    with tempfile.TemporaryDirectory(prefix="multi_gpu_") as tmp:
        folder = Path(tmp)
        if smoke:
            model, device, settings = str(ROOT / "assets" / "base-model"), "cpu", dict(SMOKE_SETTINGS)
        else:
            model, device, settings = str(_model_folder(folder / "model")), "cuda", dict(GPU_SETTINGS)
        settings["model"] = model
        planned = _plan(settings, device)
        out = folder / "run"
        _launch(folder, out, settings, cpu=smoke)
        return _rows(out, planned, settings, device)


def _model_folder(folder: Path) -> Path:
    """Llama-2-70B's config cut to LAYERS layers, random bf16 weights, the demo's tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from lora_gui.config import BUILTIN_MODEL_DIR

    shape = json.loads((ROOT / "presets" / "models" / "llama-2-70b.json").read_text(encoding="utf-8"))
    config = LlamaConfig(**{**shape, "num_hidden_layers": LAYERS})
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(BUILTIN_MODEL_DIR) / name, folder / name)
    return folder


def _config(settings: dict[str, Any]):
    from lora_gui.presets import load_config

    return load_config("text-demo", settings)


def _plan(settings: dict[str, Any], device: str) -> dict[str, Any]:
    """The per-GPU plan, as ``plan --world-size 2 --fsdp --json`` gives it (source: predicted)."""
    from lora_gui.memory.predict import predict, report

    cfg = _config(settings)
    pred = predict(cfg, None, device, processes=PROCESSES, fsdp=True)
    kernels, short = report.cuda_rows(cfg, pred, None)
    return report.plan_json(pred, kernels, short, None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(folder: Path, out: Path, settings: dict[str, Any], cpu: bool) -> None:
    """accelerate launch of ``train`` with the FSDP config; the whole process group is killed on
    any way out but a normal end (accelerate starts the ranks as its children)."""
    args = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG),
            "--num_processes", str(PROCESSES), "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
            *(["--num_cpu_threads_per_process", "1"] if cpu else []),
            "-m", "lora_gui", "train", "--preset", "text-demo", "--out", str(out), "--json", "--quiet"]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log_path = folder / "launch.log"
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        proc.wait(timeout=LAUNCH_SECONDS)
    finally:
        if proc.poll() is None or proc.returncode != 0:  # timed out, interrupted or failed: no orphans
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8")[-3000:]
        raise RuntimeError(f"the 2-process FSDP launch exited with {proc.returncode}:\n{tail}")


def _rank0_reserved(out: Path) -> int | None:
    """Rank 0's largest reserved bytes from the monitor's samples (None where none were taken)."""
    path = out / "memory.jsonl"
    if not path.is_file():
        return None
    seen = [json.loads(line).get("cuda_allocator_reserved_bytes") for line in
            path.read_text(encoding="utf-8").splitlines() if line.strip()]
    seen = [s for s in seen if s]
    return max(seen) if seen else None


def _rows(out: Path, planned: dict[str, Any], settings: dict[str, Any], device: str) -> list[dict[str, Any]]:
    summary = json.loads((out / "run.json").read_text(encoding="utf-8"))
    report = summary["memory_report"]
    reserved0 = _rank0_reserved(out) if device == "cuda" else None
    model = f"Llama-2-70B shape, {LAYERS} layers" if device == "cuda" else "bundled demo model"
    rows = []
    for rank, peak in enumerate(summary["peak_bytes_by_rank"]):
        row = {"row": f"2 GPUs, FSDP, nf4 base, rank {rank}", "model": model, "rank": rank,
               "world_size": summary["world_size"], "fsdp": summary["fsdp"],
               "seq_len": settings["max_seq_len"], "batch_size": settings["batch_size"],
               "measured_bytes": peak, "measured_source": report["source"],
               "predicted_bytes": planned["allocated_bytes"] if device == "cuda" else planned["peak_bytes"],
               "predicted_reserved_bytes": planned.get("reserved_bytes"),
               "run_predicted_bytes": report["predicted_peak_bytes"],  # the run's own plan, logged
               "frozen_bytes": summary["frozen_bytes_by_rank"][rank]}
        row["error"] = (row["predicted_bytes"] - peak) / peak if peak else None
        if rank == 0 and reserved0 is not None:
            row["measured_reserved_bytes"] = reserved0  # the monitor samples the main process only
            row["reserved_error"] = (row["predicted_reserved_bytes"] - reserved0) / reserved0
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The report's section for these rows."""
    mib = 2**20
    out = ["## Several GPUs: FSDP over an nf4 base, per rank", ""]
    if rows and "skipped" in rows[0]:
        return [*out, f"{rows[0]['row']}: {rows[0]['skipped']}"]
    out += ["| model | rank | seq x batch | measured MiB (source) | planned MiB | error | "
            "measured reserved MiB | planned reserved MiB |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        res = f"{r['measured_reserved_bytes'] / mib:,.0f}" if "measured_reserved_bytes" in r else "-"
        planned_res = f"{r['predicted_reserved_bytes'] / mib:,.0f}" if r["predicted_reserved_bytes"] else "-"
        out.append(f"| {r['model']} | {r['rank']} | {r['seq_len']} x {r['batch_size']} | "
                   f"{r['measured_bytes'] / mib:,.0f} ({r['measured_source']}) | "
                   f"{r['predicted_bytes'] / mib:,.0f} | {err} | {res} | {planned_res} |")
    return out
