"""``lora-gui generate``: a finished run's base and adapter outputs from one prompt, side by side
(text: streamed to the terminal; image: two PNGs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``generate`` subcommand on ``sub`` (the CLI's subparsers)."""
    gen = sub.add_parser("generate", help="base and adapter outputs of a finished run, side by side")
    gen.add_argument("--run", required=True, help="run folder (with adapter/)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=64, help="text: tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.7, help="text: 0 = greedy")
    gen.add_argument("--seed", type=int, default=0, help="the same seed for base and adapter")
    gen.add_argument("--scale", type=float, default=1.0, help="image: LoRA scale")
    gen.add_argument("--steps", type=int, help="image: denoising steps (default: the run's sample_steps)")
    gen.add_argument("--out", help="image: folder for base.png and adapter.png (default RUN/try)")
    gen.set_defaults(func=cmd_generate)
    return gen


def cmd_generate(args: argparse.Namespace) -> int:
    """Base and adapter outputs of a run from one prompt (text: streamed; image: two PNGs)."""
    from lora_gui.engine.generate import ImageTrial, TextTrial, open_run

    run = open_run(args.run)
    if run.cfg.task == "image":
        out = Path(args.out or run.out / "try")
        out.mkdir(parents=True, exist_ok=True)
        base, tuned = ImageTrial(run).pictures(args.prompt, seed=args.seed, scale=args.scale,
                                               steps=args.steps)
        base.save(out / "base.png")
        tuned.save(out / "adapter.png")
        print(f"base: {out / 'base.png'}")
        print(f"adapter (LoRA scale {args.scale:g}): {out / 'adapter.png'}")
        return 0
    trial = TextTrial(run)
    for label, adapter in (("base", False), ("adapter", True)):
        print(f"--- {label} ---", flush=True)
        shown = ""
        for text in trial.stream(args.prompt, adapter=adapter, max_new_tokens=args.max_new_tokens,
                                 temperature=args.temperature, seed=args.seed):
            print(text[len(shown):], end="", flush=True)
            shown = text
        print(flush=True)
    return 0
