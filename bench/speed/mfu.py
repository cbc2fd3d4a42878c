"""Model FLOPs utilisation on this machine: the text demo, an 8k-token long-context step and an
image step at 1024 px.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.mfu [--steps 3]

Each row: useful FLOPs of a step (lora_gui.models.flops: forward, activation gradients, LoRA
weight gradients; no recompute, no frozen-weight gradients), the step's median wall seconds,
useful FLOP/s, and MFU against the machine's matmul peak in the run's dtype (measured here,
largest FLOP/s a plain GEMM reaches, cached per device and dtype).

- text demo: the engine's own run (``text-demo`` preset, ``--steps`` steps); MFU from run.json.
- text 8k: the built-in model, one 8,192-token row, LoRA as in ``text-demo``, gradient
  checkpointing (the long-context setting), full training steps (forward, backward, AdamW).
- image 1024: the engine's own run (``image-1024`` preset, batch 1, ``--steps`` steps, pictures
  built at 1024 px); MFU from run.json (the denoiser's FLOPs; the one-time latent cache apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lora_gui.config import apply_overrides
from lora_gui.data.build_images import build
from lora_gui.engine.image.train import train_image
from lora_gui.engine.text.train import train_text
from lora_gui.models import flops
from lora_gui.models import text as text_models
from lora_gui.models.checkpointing import enable_checkpointing
from lora_gui.presets import load_config

COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.mfu"


def _row(name: str, step_flops: float, seconds: float, peak: flops.MachinePeak, mfu: float | None) -> dict:
    return {"row": name, "useful_gflop_per_step": step_flops / 1e9, "step_s": seconds,
            "gflop_per_s": step_flops / seconds / 1e9, "peak_gflop_per_s": peak.flops_per_s / 1e9,
            "dtype": peak.dtype, "mfu": mfu}


def text_demo(work: Path, steps: int) -> dict:
    cfg = apply_overrides(load_config("text-demo"), {"max_steps": steps, "monitor_hz": 0})
    run = train_text(cfg, work / "text", progress=False)
    records = [json.loads(x) for x in (work / "text" / "metrics.jsonl").read_text().splitlines()]
    peak = flops.MachinePeak(run["peak_flops_per_s"], run["peak_device"], run["peak_dtype"])
    return _row(f"text demo ({steps} steps, {run['real_tokens']} tokens)", run["useful_flops"] / len(records),
                run["train_seconds"] / len(records), peak, run["mfu"])


def text_long(steps: int, length: int = 8192) -> dict:
    cfg = load_config("text-demo")
    source = text_models.resolve_model_source(cfg.model)
    base = text_models.load_base_model(source, "sdpa")
    model = text_models.attach_lora(base, cfg)
    enable_checkpointing(model)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(3, base.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    step_flops = flops.text_flops(model).step([length])
    peak = flops.machine_peak("cpu", flops.compute_dtype("no", model))
    return _row(f"text {length} tokens, one row, checkpointing", step_flops, seconds, peak,
                flops.mfu(step_flops, seconds, peak.flops_per_s))


def image_1024(work: Path, steps: int) -> dict:
    build(work / "pics", count=steps + 1)
    cfg = apply_overrides(load_config("image-1024"), {
        "data": str(work / "pics"), "max_steps": steps, "batch_size": 1, "monitor_hz": 0,
        "eval_fraction": 1 / (steps + 1), "sample_images": 0, "aspect_buckets": "off"})
    run = train_image(cfg, work / "image", progress=False)
    records = [json.loads(x) for x in (work / "image" / "metrics.jsonl").read_text().splitlines()]
    peak = flops.MachinePeak(run["peak_flops_per_s"], run["peak_device"], run["peak_dtype"])
    return _row(f"image 1024 px, batch 1 ({steps} steps, checkpointing)", run["useful_flops"] / len(records),
                run["train_seconds"] / len(records), peak, run["mfu"])


def _print(r: dict) -> None:
    mfu = "—" if r["mfu"] is None else f"{r['mfu']:.2%}"
    print(f"| {r['row']} | {r['useful_gflop_per_step']:.2f} | {r['step_s']:.3f} | {r['gflop_per_s']:.2f} "
          f"| {r['peak_gflop_per_s']:.1f} ({r['dtype']}) | {mfu} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", default="demo,8k,image", help="rows to run: demo, 8k, image")
    args = parser.parse_args()
    wanted = args.rows.split(",")
    print(f"MFU on {torch.get_num_threads()} CPU thread(s); command: {COMMAND}")
    print("| step | useful GFLOP / step | s / step | useful GFLOP/s | matmul peak GFLOP/s (dtype) | MFU |")
    print("| --- | --- | --- | --- | --- | --- |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if "demo" in wanted:
            _print(text_demo(Path(tmp), args.steps))
        if "8k" in wanted:
            _print(text_long(args.steps))
        if "image" in wanted:
            _print(image_1024(Path(tmp), args.steps))


if __name__ == "__main__":
    main()
