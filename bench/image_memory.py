"""Traditional vs optimized image LoRA on the built-in diffusion model, side by side in one run.

    .venv/bin/python -m bench.image_memory [--resolutions 512,768] [--images 10,5] [--batch 2,1]

For each resolution both modes train the same pictures (a fresh demo set with the same number
of images in each of five aspect ratios, so every bucket step is full) for the same epochs
(default one) with the same batch size: the same images and the same number of optimizer steps.
Memory is the tracker's peak of live tensor bytes (source: tracker) on this CPU: the larger of
the training steps and, for the optimized mode, the one-time caching pass. images/s is given for
training alone and including the caching pass. Eval and samples are off (training only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

import torch

from bench.docs.meta import with_stamp
from lora_gui.data.build_images import SIZES, build
from lora_gui.engine.image.train import train_image
from lora_gui.presets import load_config

MODES = ("traditional", "optimized")
MIB = 2**20


def run_pair(resolution: int, images: int, batch: int, data: Path, out: Path, epochs: int = 1) -> list[dict]:
    """Both modes at one resolution; returns one row each."""
    rows = []
    for mode in MODES:
        cfg = load_config(None, {"task": "image", "mode": mode, "resolution": resolution, "data": str(data),
                                 "batch_size": batch, "epochs": epochs, "eval_fraction": 0.0,
                                 "sample_images": 0, "monitor_hz": 0, "seed": 0})
        s = train_image(cfg, out / f"{resolution}-{mode}", overwrite=True, progress=False)
        keys = ("images", "steps", "peak_bytes", "train_peak_bytes", "cache_peak_bytes",
                "predicted_peak_bytes", "images_per_s", "images_per_s_with_caching", "train_seconds",
                "cache_seconds", "memory_source", "switches")
        rows.append({"resolution": resolution, "mode": mode, "batch": batch, **{k: s[k] for k in keys}})
    return rows


def print_table(rows: list[dict]) -> None:
    print("| res | mode | images x steps | peak MiB (tracker) | predicted MiB | images/s train | "
          "images/s incl. caching |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['resolution']} | {r['mode']} | {r['images']} x {r['steps']} (batch {r['batch']}) | "
              f"{r['peak_bytes'] / MIB:,.0f} | {r['predicted_peak_bytes'] / MIB:,.0f} | "
              f"{r['images_per_s']:.3f} | {r['images_per_s_with_caching']:.3f} |")
    print()
    for res in sorted({r["resolution"] for r in rows}):
        trad, opt = ({r["mode"]: r for r in rows if r["resolution"] == res}[m] for m in MODES)
        peak = opt["peak_bytes"] / trad["peak_bytes"]
        speed = opt["images_per_s"] / trad["images_per_s"]
        with_cache = opt["images_per_s_with_caching"] / trad["images_per_s"]
        print(f"{res} px: optimized peak = {peak:.3f} x traditional (target <= 0.5); images/s = "
              f"{speed:.2f} x training only, {with_cache:.2f} x including caching (target >= 1.5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolutions", default="512,768")
    parser.add_argument("--images", default="10,5", help="pictures per resolution (multiples of 5)")
    parser.add_argument("--batch", default="2,1", help="batch size per resolution")
    parser.add_argument("--epochs", type=int, default=1, help="passes (the cache is built once)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-image"))
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    resolutions = [int(x) for x in args.resolutions.split(",")]
    counts = [int(x) for x in args.images.split(",")]
    batches = [int(x) for x in args.batch.split(",")]
    print(f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for res, count, batch in zip(resolutions, counts, batches, strict=True):
            if count % len(SIZES):
                raise SystemExit(f"--images: {count} is not a multiple of {len(SIZES)} (aspect ratios)")
            data = Path(tmp) / f"pictures-{count}"
            if not data.exists():
                build(data, count=count)
            rows += run_pair(res, count, batch, data, args.out, args.epochs)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(with_stamp(rows), indent=1))


if __name__ == "__main__":
    main()
