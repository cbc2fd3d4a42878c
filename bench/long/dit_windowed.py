"""Windowed attention over DiT image tokens (``image_window``) against full attention: memory,
speed and quality, measured side by side in one process.

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/long/dit_windowed.py`` (CPU; a few
minutes on 2 shared cores). Prints Markdown and writes bench/results/dit_windowed.md.

1. Memory of one LoRA step of the tiny SD3 / Flux transformers (float32, LoRA r4, 16 text
   tokens, batch 1): the fake-tensor trace (source: predicted) for SDPA, eager and windowed at
   radius 2 and 4; at 512 px the same step on real CPU tensors (source: tracker) checks it.
2. Speed of the attention op alone at Flux.1 shapes (4 of its 24 heads x 128, 512 text tokens; 1024 px
   = 4,096 image tokens), forward + backward, float32 on this CPU: SDPA (CPU flash kernel),
   the dense masked reference (what a mask on SDPA costs), windowed; median of 3.
3. Quality: the tiny Flux pipeline trained the same steps on the demo pictures with full
   attention and with the window (radius 2): final training loss and the held-out loss
   (eval_loss, fixed noise and timesteps). The tiny pipeline's weights are random, so this
   says whether the window changes what LoRA fits on the same data, not picture quality.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from lora_gui.attention.image_window import ImageLayout, dense_image_window_attention, image_window_attention
from lora_gui.memory.predict.dit_trace import trace_dit_step
from lora_gui.models.build_dit import FLUX_TRANSFORMER, SD3_TRANSFORMER

COMMAND = "OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/long/dit_windowed.py"
MIB = 2**20
TINY = {"tiny SD3": {"_class_name": "SD3Transformer2DModel", **SD3_TRANSFORMER},
        "tiny Flux": {"_class_name": "FluxTransformer2DModel", **FLUX_TRANSFORMER}}
QUALITY_STEPS = 40


def memory_table() -> list[str]:
    lines = ["## Memory: one LoRA step (MiB; fake-tensor trace, real CPU step at 512 px in brackets)", "",
             "| model | px | image tokens | SDPA | eager | window r2 | window r4 |",
             "|---|---|---|---|---|---|---|"]
    kw = {"batch_size": 1, "lora_rank": 4, "dtype": "float32", "device": "cpu", "text_seq_len": 16}
    for name, cfg in TINY.items():
        for px in (512, 1024):
            cells = []
            for attention, window in (("sdpa", 0), ("eager", 0), ("sdpa", 2), ("sdpa", 4)):
                fake = trace_dit_step(cfg, resolution=px, attention=attention, image_window=window, **kw)
                cell = f"{fake.traced_peak_bytes / MIB:.1f}"
                if px == 512:
                    real = trace_dit_step(cfg, resolution=px, attention=attention, image_window=window,
                                          fake=False, **kw)
                    cell += f" ({real.traced_peak_bytes / MIB:.1f})"
                cells.append(cell)
            lines.append(f"| {name} | {px} | {(px // 16) ** 2} | " + " | ".join(cells) + " |")
    return lines


def _timed(fn, q, k, v) -> float:
    times = []
    for _ in range(3):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        start = time.perf_counter()
        fn(qq, kk, vv).sum().backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def speed_table() -> list[str]:
    lines = ["## Speed: the attention op at Flux.1 shapes, 4 heads x 128, 512 text tokens "
             "(seconds, forward + backward, median of 3)", "",
             "| px | image tokens | SDPA | dense masked | window r2 | window r4 | window r8 | r4 vs SDPA |",
             "|---|---|---|---|---|---|---|---|"]
    heads, dim, text = 4, 128, 512  # 4 of Flux.1's 24 heads: the ratios do not depend on the head count
    for px in (512, 1024):
        grid = (px // 16, px // 16)
        layout = ImageLayout(text, grid, text_first=True)
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, heads, layout.seq_len, dim, generator=gen) for _ in range(3))
        sdpa = _timed(torch.nn.functional.scaled_dot_product_attention, q, k, v)
        dense = _timed(lambda a, b, c, lay=layout: dense_image_window_attention(a, b, c, lay, 4), q, k, v)
        win = {r: _timed(lambda a, b, c, r=r, lay=layout: image_window_attention(a, b, c, lay, r), q, k, v)
               for r in (2, 4, 8)}
        lines.append(f"| {px} | {grid[0] * grid[1]} | {sdpa:.2f} | {dense:.2f} | {win[2]:.2f} | "
                     f"{win[4]:.2f} | {win[8]:.2f} | {win[4] / sdpa:.2f}x |")
        print(f"speed {px} done", file=sys.stderr)
    return lines


def quality_table() -> list[str]:
    from lora_gui.data.build_images import build as build_pictures
    from lora_gui.engine.image.train import train_image
    from lora_gui.models.build_dit import build as build_dit
    from lora_gui.presets import load_config

    lines = [f"## Quality: tiny Flux pipeline, {QUALITY_STEPS} steps on 12 demo pictures (2 held out)", "",
             "| attention | final train loss | eval loss before | eval loss after | "
             "step peak MiB (tracker) | predicted MiB | images/s |", "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pictures, model = root / "pictures", build_dit(root / "flux", "flux")
        build_pictures(pictures, count=12)
        for label, window in (("full (SDPA)", 0), ("window r2", 2), ("window r4", 4)):
            cfg = load_config("image-512", {"model": str(model), "data": str(pictures),
                                            "max_steps": QUALITY_STEPS, "batch_size": 2, "monitor_hz": 0,
                                            "eval_fraction": 0.2,
                                            "sample_images": 0, "text_max_length": 16, "precision": "fp32",
                                            "lr": 1e-3, "seed": 0, "image_window": window})
            s = train_image(cfg, root / f"run-{window}", progress=False)
            lines.append(f"| {label} | {s['final_loss']:.4f} | {s['base_eval_loss']:.4f} | "
                         f"{s['eval_loss']:.4f} | {s['train_peak_bytes'] / MIB:.1f} | "
                         f"{s['predicted_peak_bytes'] / MIB:.1f} | "
                         f"{s['images_per_s']:.1f} |")
            figures = {k: s[k] for k in ("final_loss", "eval_loss")}
            print(f"quality {label}: {json.dumps(figures)}", file=sys.stderr)
    return lines


def main() -> int:
    out = ["# DiT windowed image attention", "", f"Command: `{COMMAND}` (shared 2-core machine)", ""]
    for part in (memory_table, speed_table, quality_table):
        out += part() + [""]
        print(f"{part.__name__} done", file=sys.stderr)
    text = "\n".join(out)
    print(text)
    (Path(__file__).resolve().parents[1] / "results" / "dit_windowed.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
