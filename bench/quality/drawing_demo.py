"""The image demo's before / after figure: does the LoRA teach the drawing model the star?

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.quality.drawing_demo [--samples 32] [--steps 20]

Trains the image-demo preset (a LoRA on the built-in drawing model, builtin:drawing, from the
24 star pictures of builtin:stars) through the engine, then draws the same star prompts with
the same seeds from the base pipeline and from the pipeline with the adapter, and reads every
picture with :mod:`lora_gui.data.drawing_detector`. Reported: the fraction of pictures the
detector calls a star (target: at least 3x more after the LoRA), how often the colour and the
background match the prompt, a control (circle prompts: still circles after the LoRA?), and the
held-out flow-matching loss of the run before and after. Sample strips are written to
bench/results/drawing_demo_{before,after}.png and the table to bench/results/drawing_demo.md.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lora_gui.config import parse_set_args
from lora_gui.data.drawing_detector import detect
from lora_gui.data.drawings import NEW_SHAPE, caption, combos, picture
from lora_gui.engine.image.train import train_image
from lora_gui.models import diffusion as dm
from lora_gui.models.build_drawing import draw_pictures
from lora_gui.models.diffusion_files import load_pipeline
from lora_gui.presets import load_config

RESULTS = Path(__file__).resolve().parents[1] / "results"


def prompts_for(shape: str, count: int) -> list[str]:
    """``count`` prompts of a large ``shape``, cycling through its visible colour / background
    pairs (a small star is about 13 px across: the VAE already blurs it into a pentagon)."""
    pairs = combos((shape,))
    return [caption(shape, c, b, "large") for _, c, b in (pairs[i % len(pairs)] for i in range(count))]


def vae_ceiling(pipe, shape: str, count: int) -> float:
    """Share of drawn large ``shape`` pictures still read as one after the VAE's encode / decode:
    the most any denoiser on this VAE can reach."""
    rng = random.Random(5)
    pictures = [picture(shape, c, b, "large", rng) for _, c, b in
                (combos((shape,))[i % len(combos((shape,)))] for i in range(count))]
    x = torch.stack([torch.from_numpy(np.asarray(p, dtype=np.float32) / 127.5 - 1).permute(2, 0, 1)
                     for p in pictures])
    with torch.no_grad():
        y = pipe.vae.decode(pipe.vae.encode(x).latent_dist.mode()).sample
    arrays = ((y.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    return sum(detect(a).shape == shape for a in arrays) / count


def read(pictures: list[Image.Image], prompts: list[str], shape: str) -> dict[str, float]:
    """Shares of pictures the detector reads as ``shape``, with the prompt's colour / background."""
    seen = [detect(p) for p in pictures]
    words = [p.split() for p in prompts]
    n = len(seen)
    return {"shape": sum(d.shape == shape for d in seen) / n,
            "colour": sum(d.colour in w for d, w in zip(seen, words, strict=True)) / n,
            "background": sum(d.background in w for d, w in zip(seen, words, strict=True)) / n,
            "shapes_seen": {s: sum(d.shape == s for d in seen) for s in sorted({d.shape for d in seen})}}


def strip(pictures: list[Image.Image], path: Path, count: int = 8, zoom: int = 2) -> None:
    """The first ``count`` pictures side by side, ``zoom`` x (nearest), as one PNG."""
    side = pictures[0].width * zoom
    out = Image.new("RGB", (side * count, side), "white")
    for i, one in enumerate(pictures[:count]):
        out.paste(one.resize((side, side), Image.Resampling.NEAREST), (i * side, 0))
    out.save(path)


def base_readout(count: int, steps: int) -> str:
    """The base model alone: for each pretrained shape, ``count`` prompts (colour / background
    pairs cycled, size unnamed) and how the detector reads the pictures (markdown table)."""
    from lora_gui.data.drawings import PRETRAIN_SHAPES

    pipe = load_pipeline(dm.resolve_pipeline_source("builtin:drawing"))
    lines = ["| prompt shape | read as that shape | colour right | background right | shapes seen |",
             "|---|---|---|---|---|"]
    for shape in PRETRAIN_SHAPES:
        pairs = combos((shape,))
        prompts = [caption(shape, c, b) for _, c, b in (pairs[i % len(pairs)] for i in range(count))]
        r = read(draw_pictures(pipe, prompts, steps=steps), prompts, shape)
        lines.append(f"| {shape} | {r['shape']:.0%} ({count}) | {r['colour']:.0%} | {r['background']:.0%} | "
                     f"{', '.join(f'{k} {v}' for k, v in r['shapes_seen'].items())} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32, help="star prompts (one seed each)")
    parser.add_argument("--controls", type=int, default=12, help="circle prompts (control)")
    parser.add_argument("--steps", type=int, default=20, help="denoising steps per picture")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-drawing-demo"))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="preset overrides")
    parser.add_argument("--base", action="store_true", help="only read the base model's circles, "
                        "squares and triangles (no training)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # fastest on the shared 2-core machine
    if args.base:
        print(base_readout(args.samples, args.steps))
        return
    cfg = load_config("image-demo", parse_set_args(args.set))
    t0 = time.time()
    summary = train_image(cfg, args.out, overwrite=True, progress=False)
    train_seconds = time.time() - t0
    source = dm.resolve_pipeline_source(cfg.model)
    stars, circles = prompts_for(NEW_SHAPE, args.samples), prompts_for("circle", args.controls)
    rows, pictures = {}, {}
    for name, adapter in (("before", None), ("after", args.out / "adapter")):
        pipe = load_pipeline(source, adapter)
        pictures[name] = draw_pictures(pipe, stars, steps=args.steps)
        controls = draw_pictures(pipe, circles, steps=args.steps)
        rows[name] = {"star": read(pictures[name], stars, NEW_SHAPE),
                      "circle_control": read(controls, circles, "circle")}
        strip(pictures[name], RESULTS / f"drawing_demo_{name}.png")
    ceiling = vae_ceiling(pipe, NEW_SHAPE, args.samples)
    before, after = rows["before"]["star"]["shape"], rows["after"]["star"]["shape"]
    result = {"star_fraction_before": before, "star_fraction_after": after,
              "ratio": after / before if before else None, "target_met": after >= 3 * before and after > 0,
              "vae_round_trip_star_fraction": ceiling,
              "eval_loss_before": summary["base_eval_loss"], "eval_loss_after": summary["eval_loss"],
              "train_seconds": round(train_seconds), "steps": summary["steps"], "rows": rows,
              "samples": args.samples, "controls": args.controls, "denoising_steps": args.steps}
    print(json.dumps(result, indent=1))
    lines = ["| | star prompts read as a star | colour right | background right | "
             "circle prompts read as a circle |", "|---|---|---|---|---|"]
    for name in ("before", "after"):
        r = rows[name]
        lines.append(f"| {name} the LoRA | {r['star']['shape']:.0%} ({args.samples}) | "
                     f"{r['star']['colour']:.0%} | {r['star']['background']:.0%} | "
                     f"{r['circle_control']['shape']:.0%} ({args.controls}) |")
    lines.append(f"\nlarge star pictures read as a star after the VAE's encode / decode alone: {ceiling:.0%}")
    lines.append(f"held-out loss (flow matching, {cfg.eval_fraction:.0%} of the star pictures): "
                 f"{summary['base_eval_loss']:.4f} before, {summary['eval_loss']:.4f} after; "
                 f"{summary['steps']} LoRA steps in {train_seconds:.0f} s (training + samples)")
    (RESULTS / "drawing_demo.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
