"""The video demo's before / after figure: does the LoRA teach the built-in video model pink?

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.quality.video_demo [--seeds 2] [--steps 10]

Trains the ``video-demo`` preset (a LoRA on the built-in video model, builtin:video, from the 16
clips of a pink square of assets/video-clips; no pretraining caption names pink) through the
engine, then draws the same prompts with the same seeds from the base pipeline and from the
pipeline with the adapter, and reads every clip with :mod:`lora_gui.data.clip_detector`.
Reported: the share of pink-prompt clips that show a pink square (the effect), the share moving
the prompt's direction, a control (prompts of the pretrained colours: still their colour after the
LoRA?), the held-out loss before and after, and the run's wall time. Writes
bench/results/video_demo.json (commit and planner fingerprint named), video_demo.md, and
video_demo.png: for each direction the base clip's 9 frames above the adapter's (same prompt and
seed).

    .venv/bin/python -m bench.quality.video_demo --vae WORK/vae.pt

reads a VAE checkpoint of the build (``--work`` of lora_gui.models.build_video) alone: 40 drawn
clips of every colour encoded and decoded (posterior mean), their error against a plain gray
output's, and what the detector reads in the round trips (the most any denoiser on it can reach).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bench.docs.meta import stamp
from lora_gui.config import parse_set_args
from lora_gui.data.build_clips import DEMO_COLOUR, DIRECTIONS, PRETRAIN_COLOURS, caption
from lora_gui.data.clip_detector import read_clip
from lora_gui.engine import train
from lora_gui.models import diffusion as dm
from lora_gui.models.build_video import draw_clips
from lora_gui.models.diffusion_files import load_pipeline
from lora_gui.presets import load_config

RESULTS = Path(__file__).resolve().parents[1] / "results"


def prompts_for(colours: list[str], seeds: int) -> list[str]:
    """Every direction for each colour, ``seeds`` times (prompt i is drawn with seed i)."""
    return [caption(c, d) for _ in range(seeds) for c in colours for d in DIRECTIONS]


def read(clips: np.ndarray, prompts: list[str]) -> dict:
    """Shares of clips that show a square of the prompt's colour / moving the prompt's way."""
    seen = [read_clip(c) for c in clips]
    words = [p.split() for p in prompts]
    n = len(seen)
    return {"colour": sum(r.colour == w[1] for r, w in zip(seen, words, strict=True)) / n,
            "direction": sum(r.direction == w[-1] for r, w in zip(seen, words, strict=True)) / n,
            "shape": sum(r.shape_frames >= r.frames - 1 for r in seen) / n,
            "colours_seen": dict(sorted(Counter(r.colour or "none" for r in seen).items()))}


def strip(before: np.ndarray, after: np.ndarray, path: Path, zoom: int = 2, gap: int = 4) -> None:
    """For each clip pair: the base clip's frames in a row, the adapter's under it; white gaps."""
    count, frames, side = before.shape[0], before.shape[1], before.shape[2] * zoom
    out = Image.new("RGB", (frames * side, count * (2 * side + gap) - gap), "white")
    for i in range(count):
        for row, clips in enumerate((before, after)):
            for f in range(frames):
                tile = Image.fromarray(clips[i, f]).resize((side, side), Image.Resampling.NEAREST)
                out.paste(tile, (f * side, i * (2 * side + gap) + row * side))
    out.save(path)


def vae_round_trip(checkpoint: Path, count: int = 40) -> dict:
    """A build's VAE checkpoint: round-trip error, a plain gray output's, and the detector's reads."""
    from diffusers import AutoencoderKLWan

    from lora_gui.data.build_clips import COLOURS, clip_batch
    from lora_gui.models.build_video import VAE, to_pixels

    vae = AutoencoderKLWan(**VAE)
    vae.load_state_dict(torch.load(checkpoint, weights_only=True))
    clips, prompts = clip_batch(count, 99, tuple(COLOURS))
    x = to_pixels(clips)
    with torch.no_grad():
        y = vae.eval().decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
    back = ((y + 1) * 127.5).round().byte().permute(0, 2, 3, 4, 1).numpy()
    return {"mse": float(((y - x) ** 2).mean()), "gray_mse": float(((x[..., :1, :1] - x) ** 2).mean()),
            "clips": count, **read(back, prompts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="clips per prompt (one seed each)")
    parser.add_argument("--steps", type=int, default=10, help="denoising steps per clip")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-video-demo"))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="preset overrides")
    parser.add_argument("--vae", type=Path, default=None, help="only read this VAE checkpoint")
    args = parser.parse_args()
    torch.set_num_threads(1)  # fastest on the shared 2-core machine
    if args.vae:
        print(json.dumps(vae_round_trip(args.vae), indent=1))
        return
    cfg = load_config("video-demo", parse_set_args(args.set))
    t0 = time.time()
    summary = train(cfg, args.out, overwrite=True, progress=False)
    train_seconds = time.time() - t0
    source = dm.resolve_pipeline_source(cfg.model)
    pink = prompts_for([DEMO_COLOUR], args.seeds)
    control = prompts_for(list(PRETRAIN_COLOURS), 1)
    rows, clips = {}, {}
    for name, adapter in (("before", None), ("after", args.out / "adapter")):
        pipe = load_pipeline(source, adapter)
        clips[name] = draw_clips(pipe, pink, steps=args.steps)
        rows[name] = {"pink": read(clips[name], pink),
                      "control": read(draw_clips(pipe, control, steps=args.steps), control)}
    strip(clips["before"][:len(DIRECTIONS)], clips["after"][:len(DIRECTIONS)], RESULTS / "video_demo.png")
    result = {"meta": {**stamp(), "command": "OMP_NUM_THREADS=1 python -m bench.quality.video_demo"},
              "pink_before": rows["before"]["pink"]["colour"], "pink_after": rows["after"]["pink"]["colour"],
              "eval_loss_before": summary["base_eval_loss"], "eval_loss_after": summary["eval_loss"],
              "train_seconds": round(train_seconds), "steps": summary["steps"], "rows": rows,
              "prompts": len(pink), "controls": len(control), "denoising_steps": args.steps,
              "memory_report": summary.get("memory_report")}
    (RESULTS / "video_demo.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    lines = ["| | pink prompts: a pink square | moving the prompt's way | a square in every frame | "
             "colours seen | control prompts: their colour | control: their way |",
             "|---|---|---|---|---|---|---|"]
    for name in ("before", "after"):
        p, c = rows[name]["pink"], rows[name]["control"]
        seen = ", ".join(f"{k} {v}" for k, v in p["colours_seen"].items())
        lines.append(f"| {name} the LoRA | {p['colour']:.0%} ({len(pink)}) | {p['direction']:.0%} | "
                     f"{p['shape']:.0%} | {seen} | {c['colour']:.0%} ({len(control)}) | "
                     f"{c['direction']:.0%} |")
    lines.append(f"\nheld-out loss (flow matching, {cfg.eval_fraction:.1%} of the pink clips): "
                 f"{summary['base_eval_loss']:.4f} before, {summary['eval_loss']:.4f} after; "
                 f"{summary['steps']} LoRA steps in {train_seconds:.0f} s (caching, training and samples)")
    (RESULTS / "video_demo.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
