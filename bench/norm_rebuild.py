"""What the LoRA layers after a norm and a DiT's attention kernel keep: rebuilt from the norms'
inputs, or kept. What it saves and what it costs.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/norm_rebuild.py [--rounds 15] [--no-plans]

Two recomputes in ``lean_backward``, both from the inputs the norms keep for their own backward:

- q, k and v (a Flux single block: and its MLP) read a norm's output: a UNet transformer block's
  ``norm1`` / ``norm2``, a DiT block's ``norm(x) * (1 + scale) + shift``. Their adapters kept that
  output (under CUDA's autocast, one bf16 copy of the float32 output) for their weight gradients;
  now it is rebuilt once in the backward (``lora_gui.models.lean_backward._rebuilt_from``).
- a DiT's attention kernel kept its query and key, ``cat(norm_q(q), norm_added_q(q_text))`` (Flux:
  with rotary embeddings); now they are recomputed from the norms' inputs
  (``lora_gui.models.lean_attention``).

Arms: "before" (every other lean layer, neither recompute), "norms" (the first) and "both" (as
shipped). Tensors under ``MIN_REBUILD_BYTES`` (256 KiB) are kept in every arm.

1. Planned peaks at the real models' shapes (source: predicted; the fake-tensor trace of one
   LoRA step on CUDA in bf16 under CUDA's autocast, SDPA, float32 adapters; UNets with diffusers'
   default targets, DiTs with the scripts' defaults).
2. Measured on this CPU (source: tracker): the tiny SDXL UNet the tests build, batch 4 at 256 px,
   and the bundled drawing model's SD3 transformer, batch 16 at 64 px (the largest it takes),
   where the recomputes apply (256 KiB-1 MiB tensors), fp32: the bytes alive between the forward and
   the backward and the step peak; the seconds of a forward and backward, the arms alternating,
   the order flipped every round; the median of the per-round ratios to "before".
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lora_gui.memory.predict.dit_trace import trace_dit_step  # noqa: E402
from lora_gui.memory.predict.trace import trace_unet_step  # noqa: E402
from lora_gui.memory.runtime.tracker import StorageTracker  # noqa: E402
from lora_gui.models import lean_backward  # noqa: E402
from lora_gui.models.lean_backward import lean_frozen_layers  # noqa: E402

MiB = 2**20
PLANS = (  # (trace, model, shape)
    (trace_unet_step, "sd15-unet", {"resolution": 512, "batch_size": 4}),
    (trace_unet_step, "sdxl-unet", {"resolution": 1024, "batch_size": 1}),
    (trace_dit_step, "sd3.5-medium", {"resolution": 1024, "batch_size": 1}),
    (trace_dit_step, "flux.1-dev", {"resolution": 1024, "batch_size": 1}),
)


ARMS = ("before", "norms", "both")


@contextlib.contextmanager
def arm(name: str) -> Iterator[None]:
    """The recomputes of ``name`` on (every other lean layer on in every arm)."""
    saved = lean_backward._rebuilt_from, lean_backward.lean_dit_attention
    if name == "before":
        lean_backward._rebuilt_from = lambda *args: None
    if name in ("before", "norms"):
        lean_backward.lean_dit_attention = lambda module: 0
    try:
        yield
    finally:
        lean_backward._rebuilt_from, lean_backward.lean_dit_attention = saved


def planned() -> None:
    print("| model | shape | planned peak MiB: before / norms / both | change | activations MiB: "
          "before / both | change |")
    print("|---|---|---|---|---|---|")
    for trace, name, shape in PLANS:
        results = []
        for a in ARMS:
            with arm(a):
                results.append(trace(name, dtype=torch.bfloat16, device="cuda", lean_backward=True, **shape))
        px = ", ".join(f"{k} {v}" for k, v in shape.items())
        peaks = " / ".join(f"{r.peak_bytes / MiB:,.0f}" for r in results)
        a_off, a_on = results[0].breakdown["activations"], results[-1].breakdown["activations"]
        print(f"| {name} | {px} | {peaks} | {results[-1].peak_bytes / results[0].peak_bytes - 1:+.2%} | "
              f"{a_off / MiB:,.0f} / {a_on / MiB:,.0f} | {a_on / a_off - 1:+.1%} |", flush=True)


def _sdxl() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    from peft import LoraConfig

    from lora_gui.models.build_diffusion import build_sdxl_pipeline

    unet = build_sdxl_pipeline(seed=0).unet
    unet.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                init_lora_weights="gaussian"))
    torch.manual_seed(1)
    inputs = (torch.randn(4, 4, 32, 32), torch.rand(4) * 1000)  # 256 px
    kwargs = {"encoder_hidden_states": torch.randn(4, 77, 64),
              "added_cond_kwargs": {"text_embeds": torch.randn(4, 32), "time_ids": torch.randn(4, 6)}}
    return unet, lambda m: m(*inputs, **kwargs).sample


def _drawing_sd3() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    from diffusers import SD3Transformer2DModel
    from peft import LoraConfig

    from lora_gui.models.dit import lora_targets

    model = SD3Transformer2DModel.from_pretrained(ROOT / "assets" / "drawing-model", subfolder="transformer")
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=lora_targets("sd3", "all-linear"),
                                 init_lora_weights="gaussian"))
    cfg = model.config
    torch.manual_seed(1)
    # 64 px (the largest it takes) through its VAE (4x): 16 x 16 latents; 12 CLIP + 12 T5 tokens;
    # batch 16: 256 KiB norm outputs, the smallest that is rebuilt
    inputs = {"hidden_states": torch.randn(16, cfg.in_channels, 16, 16),
              "encoder_hidden_states": torch.randn(16, 24, cfg.joint_attention_dim),
              "pooled_projections": torch.randn(16, cfg.pooled_projection_dim),
              "timestep": torch.rand(16) * 1000}
    return model, lambda m: m(**inputs).sample


def measured(name: str, build: Callable, rounds: int) -> None:
    plain, forward = build()
    arms = {}
    for a in ARMS:
        arms[a] = copy.deepcopy(plain)  # a plain diffusers model: its own modules, nothing patched yet
        with arm(a):
            lean_frozen_layers(arms[a])

    def step(a: str) -> None:
        with arm(a):
            forward(arms[a]).square().sum().backward()

    print(f"\n| {name}, fp32 | kept after the forward (bytes) | step peak (bytes) |")
    print("|---|---|---|")
    for a in ARMS:
        tracker = StorageTracker()
        with tracker, arm(a):
            out = forward(arms[a])
            kept = tracker.live_bytes
            out.square().sum().backward()
        print(f"| {a} | {kept:,} | {tracker.peak_bytes:,} |")
    times: dict[str, list[float]] = {a: [] for a in ARMS}
    for r in range(rounds):
        for a in (ARMS if r % 2 == 0 else ARMS[::-1]):
            step(a)
            start = time.perf_counter()
            for _ in range(5):
                step(a)
            times[a].append((time.perf_counter() - start) / 5)
    for a in ARMS:
        ratios = [b / x for x, b in zip(times["before"], times[a], strict=True)]
        print(f"{a}: forward + backward ms {[round(t * 1e3, 1) for t in times[a]]}; / before per round "
              f"{[round(x, 3) for x in ratios]}; median {statistics.median(ratios):.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-plans", action="store_true", help="the CPU measurements only")
    a = parser.parse_args()
    torch.set_num_threads(1)
    if not a.no_plans:
        planned()
    measured("tiny SDXL UNet, 4 x 256 px", _sdxl, a.rounds)
    measured("drawing model (SD3), 16 x 64 px", _drawing_sd3, a.rounds)


if __name__ == "__main__":
    main()
