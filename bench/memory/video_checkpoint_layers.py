"""``checkpoint_layers`` on the built-in tiny Wan pipeline (4 blocks), through lora_gui's real
engine on this CPU: for every block checkpointed, the first 3 / 2 / 1, and none, each run's own
prediction against its tracked peak (training steps) and the final loss.

    PYTHONPATH=. .venv/bin/python -m bench.memory.video_checkpoint_layers [--steps 4]

The clips are six synthetic ones in two sizes and two frame buckets (tests/engine/test_video_run.py).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    from lora_gui.engine import train
    from tests.data.test_videos import clip
    from tests.engine.test_video_run import video_cfg

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "clips"
        folder.mkdir()
        shapes = [((48, 32), 5), ((48, 32), 9), ((32, 48), 9), ((32, 48), 6), ((48, 32), 9), ((32, 48), 12)]
        for i, (size, frames) in enumerate(shapes):
            clip(folder / f"c{i}.mp4", frames, size=size,
                 caption=f"a red square moving {'left' if i % 2 else 'right'}")
        print("| checkpointed blocks | predicted train peak | tracked train peak | error | final loss |")
        print("|---|---|---|---|---|")
        for label, layers in (("4 of 4 (every block)", 0), ("3 of 4", 3), ("2 of 4", 2), ("1 of 4", 1),
                              ("none", None)):
            cfg = video_cfg(folder, gradient_checkpointing=True, max_steps=args.steps,
                            checkpoint_layers=layers or 0)
            if layers is None:
                cfg = replace(cfg, gradient_checkpointing=False)
            summary = train(cfg, Path(tmp) / f"run{layers}", progress=False)
            predicted, measured = summary["prediction"]["train_peak_bytes"], summary["train_peak_bytes"]
            print(f"| {label} | {predicted:,} B | {measured:,} B | {predicted / measured - 1:+.3%} | "
                  f"{summary['final_loss']:.9f} |",
                  flush=True)


if __name__ == "__main__":
    main()
