"""What `plan` says for video LoRA at real shapes: `python -m bench.memory.video_plans [--quick]`.

For each bundled Wan config and clip shape, the predicted peak on a CUDA card (bf16 weights,
LoRA rank 16 on the attention projections, batch 1, latents and embeddings cached) with and
without gradient checkpointing, and the smallest of the 12 / 16 / 24 / 48 / 80 GB cards each fits
(source: predicted, fake-tensor traces on this CPU; no weights read). Prints a markdown table
(docs/guide/video.md holds its output). ``--quick``: 480p rows only.
"""

from __future__ import annotations

import argparse
import time

from lora_gui.cards import card_by_name
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.memory.predict import predict

CARDS = ("12gb", "16gb", "24gb", "l40s", "h100-80gb")  # 12 / 16 / 24 / 48 / 80 GB cards
MODELS = ("wan2.1-t2v-1.3b", "wan2.2-ti2v-5b", "wan2.1-t2v-14b")
SIZES = {"480p": "832x480", "720p": "1280x704"}  # 720p: 704 is the nearest multiple of 32 to 720
FRAMES = (33, 49, 81)


def smallest_card(peak: int) -> str:
    """The smallest card whose memory (as torch reports it) holds ``peak`` bytes."""
    fits = [name for name in CARDS if peak <= card_by_name(name).total_bytes]
    return fits[0] if fits else "none"


def row(model: str, size: str, frames: int) -> list[str]:
    cfg = apply_overrides(RunConfig(), {"task": "video", "model": model, "resolution": size,
                                        "video_frames": frames, "batch_size": 1})
    cells = []
    for checkpointing in (False, True):
        switched = apply_overrides(cfg, {"gradient_checkpointing": checkpointing})
        peak = predict(switched, None, "cuda").peak_bytes
        cells += [f"{peak / 2**30:,.1f}", smallest_card(peak)]
    return [model, f"{size}x{frames}", *cells]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="480p rows only")
    args = parser.parse_args()
    start = time.perf_counter()
    print("| model | clip (WxHxframes) | peak GiB | smallest card | peak GiB, checkpointed | smallest card |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model in MODELS:
        for name, size in SIZES.items():
            if args.quick and name != "480p":
                continue
            for frames in FRAMES:
                print("| " + " | ".join(row(model, size, frames)) + " |", flush=True)
    print(f"\n({time.perf_counter() - start:.0f} s on this machine)")


if __name__ == "__main__":
    main()
