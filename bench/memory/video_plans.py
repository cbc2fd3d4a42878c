"""What `plan` says for video LoRA at real shapes, written as a docs table:

    python -m bench.memory.video_plans           # 480p and 720p rows, then the peers' shapes
    python -m bench.memory.video_plans --quick   # 480p rows and the peers' shapes only

For each bundled video config (Wan 2.1 1.3B and 14B, Wan 2.2 TI2V 5B, LTX-Video 2B;
``presets/models/*.json``) and clip shape, the predicted peak on a CUDA card (bf16 weights, LoRA
rank 16 on the attention projections, latents and embeddings cached unless a row says otherwise)
without and with gradient checkpointing, and with every switch that moves memory off the card
(checkpointing, fp8 base weights, every transformer block swapped to RAM, with the RAM it needs),
each with the smallest of the 12 / 16 / 24 / 48 / 80 GB cards whose memory holds it (source:
predicted, fake-tensor traces of one training step on this CPU; no weights read). Beside them,
the shapes the peer trainers published figures for, planned the same way. Writes
``bench/results/tables/video_plans.json``, which ``python -m bench.docs`` turns into
``docs/results/video.md``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from bench.common import RESULTS, write_results
from lora_gui.cards import card_by_name
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.memory.predict import predict
from lora_gui.memory.predict.video_run import bundled_video_config
from lora_gui.units import gb

OUT = RESULTS / "tables" / "video_plans.json"
CARDS = ("12gb", "16gb", "24gb", "l40s", "h100-80gb")  # the 12 / 16 / 24 / 48 / 80 GB cards
MODELS = ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-ti2v-5b", "ltx-video-2b")
# 720p: Wan 2.1 places clips on a 16 px grid (720 = 45 x 16); Wan 2.2 5B and LTX-Video on a 32 px
# grid (their VAE's 16x / 32x times the transformer's patch), where 704 is the nearest side to 720
SIZES = {"480p": {"wan2.1-t2v-1.3b": "832x480", "wan2.1-t2v-14b": "832x480",
                  "wan2.2-ti2v-5b": "832x480", "ltx-video-2b": "832x480"},
         "720p": {"wan2.1-t2v-1.3b": "1280x720", "wan2.1-t2v-14b": "1280x720",
                  "wan2.2-ti2v-5b": "1280x704", "ltx-video-2b": "1280x704"}}
# 33 / 49 / 81 are 4k+1 (Wan's temporal factor 4) and 8k+1 (LTX-Video's 8) alike: one set for all
FRAMES = (33, 49, 81)


@dataclass(frozen=True)
class PeerShape:
    """A shape a peer trainer published a memory figure for, and the figure as they gave it."""

    model: str
    size: str  # WxH px
    frames: int
    figure: str
    batch: int = 1
    settings: tuple[tuple[str, Any], ...] = ()


PEERS = (
    # the quote does not name the Wan model: both sizes are planned at its shapes
    *(PeerShape(model, "512x512", frames, f"diffusion-pipe: {figure} (some block swap; model not named)")
      for model in ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b")
      for frames, figure in ((21, "12.2 GB"), (41, "15.7 GB"))),
    # SimpleTuner's Wan quickstart gives the size and batch, not the frames: planned at Wan's 81
    PeerShape("wan2.1-t2v-1.3b", "832x480", 81, "SimpleTuner: \"a bit more than 12G\" at batch 4 "
              "(frames not given; 81 planned)", batch=4),
    PeerShape("ltx-video-2b", "768x512", 49, "finetrainers: ~11 GB with precomputed latents"),
    PeerShape("ltx-video-2b", "768x512", 49, "finetrainers: ~18 GB without (here: text encoder on "
              "the card, the VAE not planned)", settings=(("cache_latents", "off"),)),
)


def smallest_card(peak: int) -> str:
    """The smallest card whose memory (as torch reports it) holds ``peak`` bytes, or none."""
    fits = [name for name in CARDS if peak <= card_by_name(name).total_bytes]
    return fits[0] if fits else "none of them"


def planned_cells(model: str, size: str, frames: int, batch: int = 1,
                  settings: tuple[tuple[str, Any], ...] = ()) -> list[str]:
    """[peak GB, smallest card] for one clip shape with no switch, with gradient checkpointing,
    and with every switch that moves memory off the card (checkpointing, fp8 base weights, every
    transformer block swapped to RAM), that arm's host memory last."""
    cfg = apply_overrides(RunConfig(), {"task": "video", "model": model, "resolution": size,
                                        "video_frames": frames, "batch_size": batch, **dict(settings)})
    blocks = int(bundled_video_config(model)["num_layers"])
    arms = ({"gradient_checkpointing": False}, {"gradient_checkpointing": True},
            {"gradient_checkpointing": True, "quantization": "fp8", "blocks_to_swap": blocks})
    cells = []
    for switches in arms:
        pred = predict(apply_overrides(cfg, switches), None, "cuda")
        cells += [gb(pred.peak_bytes, unit=False), smallest_card(pred.peak_bytes)]
    return [*cells, gb(int(pred.step.info.get("host_bytes", 0) or 0), unit=False)]


def rows(quick: bool) -> list[list[str]]:
    """The table's rows: the grid (480p only when ``quick``), then the peers' shapes."""
    out = []
    for model in MODELS:
        for name, sizes in SIZES.items():
            if quick and name != "480p":
                continue
            for frames in FRAMES:
                out.append([model, f"{sizes[model]}x{frames}", "1",
                            *planned_cells(model, sizes[model], frames), "-"])
                print(out[-1], flush=True)
    for peer in PEERS:
        cells = planned_cells(peer.model, peer.size, peer.frames, peer.batch, peer.settings)
        out.append([peer.model, f"{peer.size}x{peer.frames}", str(peer.batch), *cells, peer.figure])
        print(out[-1], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="480p rows and the peers' shapes only")
    args = parser.parse_args()
    start = time.perf_counter()
    table = rows(args.quick)
    seconds = time.perf_counter() - start
    command = "python -m bench.memory.video_plans" + (" --quick" if args.quick else "")
    left_out = " The 720p rows are left out (`--quick`); the command without it adds them." \
        if args.quick else ""
    write_results(OUT, {
        "meta": {"command": command,
                 "made_by": f"bench/memory/video_plans.py on this project's 2-core CPU machine (no GPU), "
                            f"{seconds:.0f} s; source of every figure: predicted (fake-tensor traces)"},
        "title": "Video LoRA: the planned peak per clip shape and the smallest card that holds it",
        "note": ("bf16 weights, LoRA rank 16 on the attention projections, latents and text embeddings "
                 "cached (the text encoder and VAE off the card) unless the row says otherwise; peaks in "
                 "GB (10^9 bytes) on a CUDA card, the CUDA context included. Smallest card: the first of "
                 "12gb / 16gb / 24gb / l40s (48 GB) / h100-80gb whose memory (as torch reports it) holds "
                 "the peak. Every switch: gradient checkpointing, `quantization: fp8` and `blocks_to_swap` "
                 "equal to the model's block count (the least the card can hold with the switches lora_gui "
                 "has; the swapped weights need the host GB beside it). Peers' figures are theirs, with "
                 "their own switches." + left_out),
        "columns": ["model", "clip (WxHxframes)", "batch", "peak GB", "smallest card",
                    "peak GB, checkpointed", "smallest card, checkpointed",
                    "peak GB, checkpointed + fp8 + every block swapped", "smallest card, so",
                    "host GB, so (swapped blocks)", "peer's published figure"],
        "rows": table})
    print(f"wrote {OUT} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
