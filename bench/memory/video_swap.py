"""Block swap on the CPU with the built-in tiny Wan pipeline (2 blocks): the video demo's clips,
a few steps with and without ``blocks_to_swap``, checkpointing off and on; each run's tracked
device peak and host peak against its own prediction (run.json), printed as the rows of the
table in docs/guide/video.md. About a minute a run on a 2-core CPU.

    python -m bench.memory.video_swap [--steps 4]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from lora_gui.engine import train
from lora_gui.presets import load_config


def row(checkpointing: bool, swap: int, steps: int, folder: Path) -> dict:
    cfg = load_config("video-demo", {
        "max_steps": steps, "sample_images": 0, "measure_every_step": True, "eval_fraction": 0.0,
        "gradient_checkpointing": checkpointing, "blocks_to_swap": swap})
    s = train(cfg, folder / f"ckpt{int(checkpointing)}-swap{swap}", progress=False)
    return {"checkpointing": checkpointing, "swap": swap, "loss": s["final_loss"],
            "train_peak": s["train_peak_bytes"], "predicted_train_peak": s["prediction"]["train_peak_bytes"],
            "host": s["host_peak_bytes"], "predicted_host": s["prediction"]["host_bytes"],
            "error": s["memory_report"]["predicted_vs_measured"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for checkpointing in (False, True):
            plain = row(checkpointing, 0, args.steps, Path(tmp))
            for swap in (2,):
                r = row(checkpointing, swap, args.steps, Path(tmp))
                print(f"| checkpointing {checkpointing}, blocks_to_swap {swap} | {r['train_peak']:,} B | "
                      f"{plain['train_peak']:,} B | {r['predicted_train_peak'] / r['train_peak'] - 1:+.2%} "
                      f"(run {r['error']:+.2%}) | {r['host']:,} / {r['predicted_host']:,} B |"
                      f" loss {r['loss']:.6f} vs {plain['loss']:.6f}", flush=True)


if __name__ == "__main__":
    main()
