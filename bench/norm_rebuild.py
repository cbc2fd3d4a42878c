"""LoRA layers after a LayerNorm or a DiT's adaptive norm keep the norm's input: what it saves
and what it costs.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/norm_rebuild.py [--rounds 15] [--no-plans]

q, k and v (a Flux single block: and its MLP) read a norm's output: a UNet transformer block's
``norm1`` / ``norm2``, a DiT block's ``norm(x) * (1 + scale) + shift``. Their adapters kept that
output (under CUDA's autocast, one bf16 copy of the float32 output) for their weight gradients,
although the norm keeps its input for its own backward. With the rebuild they keep the input and
the output is recomputed once in the backward (``lora_gui.models.lean_backward._rebuilt_from``).
Both arms run every other ``lean_backward`` layer.

1. Planned peaks at the real models' shapes (source: predicted; the fake-tensor trace of one
   LoRA step on CUDA in bf16 under CUDA's autocast, SDPA, float32 adapters; UNets with diffusers'
   default targets, DiTs with the scripts' defaults), rebuild off and on.
2. Measured on this CPU (source: tracker): the tiny SDXL UNet the tests build and the bundled
   drawing model's SD3 transformer, batch 4, 64 px, fp32: the bytes alive between the forward
   and the backward and the step peak, off and on; the seconds of a forward and backward, off
   and on alternating, the order flipped every round; the median of the per-round ratios.
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


@contextlib.contextmanager
def rebuilds(on: bool) -> Iterator[None]:
    """The norm-output rebuild on (as shipped) or off (every other lean layer still on)."""
    original = lean_backward._rebuilt_from
    if not on:
        lean_backward._rebuilt_from = lambda *args: None
    try:
        yield
    finally:
        lean_backward._rebuilt_from = original


def planned() -> None:
    print("| model | shape | planned peak MiB, rebuild off / on | change | activations MiB off / on "
          "| change |")
    print("|---|---|---|---|---|---|")
    for trace, name, shape in PLANS:
        results = []
        for on in (False, True):
            with rebuilds(on):
                results.append(trace(name, dtype=torch.bfloat16, device="cuda", lean_backward=True, **shape))
        off, on_ = results
        px = ", ".join(f"{k} {v}" for k, v in shape.items())
        a_off, a_on = off.breakdown["activations"], on_.breakdown["activations"]
        print(f"| {name} | {px} | {off.peak_bytes / MiB:,.0f} / {on_.peak_bytes / MiB:,.0f} | "
              f"{on_.peak_bytes / off.peak_bytes - 1:+.2%} | {a_off / MiB:,.0f} / {a_on / MiB:,.0f} | "
              f"{a_on / a_off - 1:+.1%} |", flush=True)


def _sdxl() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    from peft import LoraConfig

    from lora_gui.models.build_diffusion import build_sdxl_pipeline

    unet = build_sdxl_pipeline(seed=0).unet
    unet.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                init_lora_weights="gaussian"))
    torch.manual_seed(1)
    inputs = (torch.randn(4, 4, 8, 8), torch.rand(4) * 1000)
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
    # 64 px through the drawing model's VAE (4x): 16 x 16 latents; 12 CLIP + 12 T5 tokens
    inputs = {"hidden_states": torch.randn(4, cfg.in_channels, 16, 16),
              "encoder_hidden_states": torch.randn(4, 24, cfg.joint_attention_dim),
              "pooled_projections": torch.randn(4, cfg.pooled_projection_dim),
              "timestep": torch.rand(4) * 1000}
    return model, lambda m: m(**inputs).sample


def measured(name: str, build: Callable, rounds: int) -> None:
    plain, forward = build()
    arms = {}
    for on in (False, True):
        arms[on] = copy.deepcopy(plain)  # a plain diffusers model: its own modules, nothing patched yet
        with rebuilds(on):
            lean_frozen_layers(arms[on])

    def step(on: bool) -> None:
        with rebuilds(on):
            forward(arms[on]).square().sum().backward()

    print(f"\n| {name}, 4 x 64 px, fp32 | kept after the forward (bytes) | step peak (bytes) |")
    print("|---|---|---|")
    for on in (False, True):
        tracker = StorageTracker()
        with tracker, rebuilds(on):
            out = forward(arms[on])
            kept = tracker.live_bytes
            out.square().sum().backward()
        print(f"| rebuild {'on' if on else 'off'} | {kept:,} | {tracker.peak_bytes:,} |")
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            step(on)
            start = time.perf_counter()
            for _ in range(20):
                step(on)
            times[on].append((time.perf_counter() - start) / 20)
    ratios = [b / a for a, b in zip(times[False], times[True], strict=True)]
    print(f"forward + backward ms, off: {[round(t * 1e3, 2) for t in times[False]]}")
    print(f"forward + backward ms, on:  {[round(t * 1e3, 2) for t in times[True]]}")
    print(f"on / off per round: {[round(x, 3) for x in ratios]}; median {statistics.median(ratios):.3f}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-plans", action="store_true", help="the CPU measurements only")
    a = parser.parse_args()
    torch.set_num_threads(1)
    if not a.no_plans:
        planned()
    measured("tiny SDXL UNet", _sdxl, a.rounds)
    measured("drawing model (SD3)", _drawing_sd3, a.rounds)


if __name__ == "__main__":
    main()
