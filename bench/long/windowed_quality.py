"""Quality of windowed-attention LoRA training, reported honestly.

    .venv/bin/python -m bench.long.windowed_quality [--steps 60] [--window 128] [--global-tokens 4]

Trains the bundled base model on the fine-tune corpus twice with the text-demo preset and the
same steps: full attention (SDPA) and windowed attention (W, G). Both adapters are then
evaluated on the held-out split with full attention (how an adapter is used at inference); the
windowed run's loss under its own window is shown too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lora_gui.engine.text.train import train_text
from lora_gui.presets import load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--global-tokens", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-windowed-quality"))
    args = parser.parse_args()
    rows = {}
    for name, extra in (("full", {}), ("windowed", {"attention": "windowed", "window": args.window,
                                                     "global_tokens": args.global_tokens})):
        cfg = load_config("text-demo", {"max_steps": args.steps, **extra})
        s = train_text(cfg, args.out / name, overwrite=True, progress=False)
        rows[name] = s
        print(json.dumps({"run": name, "eval_loss": s["eval_loss"],
                          "eval_loss_full_attention": s["eval_loss_full_attention"],
                          "base_eval_loss": s["base_eval_loss"], "peak_bytes": s["peak_bytes"],
                          "real_tokens_per_s": s["real_tokens_per_s"]}), flush=True)
    full, win = rows["full"], rows["windowed"]
    print(f"\n| training attention | eval loss, full attention | eval loss, own attention | "
          f"peak MiB (tracker) | real tokens/s |\n|---|---|---|---|---|\n"
          f"| full (SDPA) | {full['eval_loss']:.4f} | {full['eval_loss']:.4f} | "
          f"{full['peak_bytes'] / 2**20:.0f} | {full['real_tokens_per_s']:.0f} |\n"
          f"| windowed W={args.window} G={args.global_tokens} | {win['eval_loss_full_attention']:.4f} | "
          f"{win['eval_loss']:.4f} | {win['peak_bytes'] / 2**20:.0f} | {win['real_tokens_per_s']:.0f} |")
    print(f"\nbase model (no LoRA), full attention: {full['base_eval_loss']:.4f}; "
          f"{args.steps} steps, text-demo preset")


if __name__ == "__main__":
    main()
