"""lean_backward on and off: what a LoRA step holds and what it costs in time.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/speed/lean_backward.py [--rounds 7]

1. Planned peaks at the real models' shapes (source: predicted; the fake-tensor trace of one
   LoRA step on CUDA in bf16, SDPA, float32 adapters as peft keeps them): SD 1.5 at 512 px x 4
   and 1024 px x 1, SDXL at 1024 px x 1 (diffusers' default targets); SD3.5-medium and Flux.1-dev
   at 1024 px; Llama-3.1-8B at 2k and 8k tokens and Qwen2.5-0.5B at 4k (all-linear, without and
   with gradient checkpointing), with the switch off and on.
2. Measured on this CPU (source: tracker) on the tiny SDXL the tests build: the bytes alive
   between the forward and the backward and the step's peak, off and on, and the seconds of a
   forward and backward (batch 4, 64 px, fp32), off and on alternating, the order flipped every
   round; the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import pin_threads, round_order  # noqa: E402
from lora_gui.memory.predict.dit_trace import trace_dit_step  # noqa: E402
from lora_gui.memory.predict.trace import trace_text_step, trace_unet_step  # noqa: E402
from lora_gui.memory.runtime.tracker import StorageTracker  # noqa: E402
from lora_gui.models.build_diffusion import build_sdxl_pipeline  # noqa: E402
from lora_gui.models.lean_backward import lean_frozen_layers  # noqa: E402

MiB = 2**20
PLANS = (  # (trace, model, shape)
    (trace_unet_step, "sd15-unet", {"resolution": 512, "batch_size": 4}),
    (trace_unet_step, "sd15-unet", {"resolution": 1024, "batch_size": 1}),
    (trace_unet_step, "sdxl-unet", {"resolution": 1024, "batch_size": 1}),
    (trace_dit_step, "sd3.5-medium", {"resolution": 1024, "batch_size": 1}),
    (trace_dit_step, "flux.1-dev", {"resolution": 1024, "batch_size": 1}),
    (trace_text_step, "qwen2.5-0.5b", {"seq_len": 4096, "batch_size": 1}),
    (trace_text_step, "llama-3.1-8b", {"seq_len": 2048, "batch_size": 1}),
    (trace_text_step, "llama-3.1-8b", {"seq_len": 8192, "batch_size": 1}),
    (trace_text_step, "llama-3.1-8b",
     {"seq_len": 8192, "batch_size": 1, "gradient_checkpointing": True}),
)


def planned() -> None:
    print("| model | shape | planned peak MiB off / on | change | activations MiB off / on | change |")
    print("|---|---|---|---|---|---|")
    for trace, name, shape in PLANS:
        off, on = (trace(name, dtype=torch.bfloat16, device="cuda", lean_backward=lean, **shape)
                   for lean in (False, True))
        px = ", ".join(f"{k} {v}" for k, v in shape.items())
        a_off, a_on = off.breakdown["activations"], on.breakdown["activations"]
        print(f"| {name} | {px} | {off.peak_bytes / MiB:,.0f} / {on.peak_bytes / MiB:,.0f} | "
              f"{on.peak_bytes / off.peak_bytes - 1:+.1%} | {a_off / MiB:,.0f} / {a_on / MiB:,.0f} | "
              f"{a_on / a_off - 1:+.1%} |")


def measured(rounds: int) -> None:
    from peft import LoraConfig

    plain = build_sdxl_pipeline(seed=0).unet
    plain.requires_grad_(False)
    plain.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                 init_lora_weights="gaussian"))
    lean = copy.deepcopy(plain)
    lean_frozen_layers(lean)
    torch.manual_seed(1)
    inputs = (torch.randn(4, 4, 8, 8), torch.rand(4) * 1000)
    kwargs = {"encoder_hidden_states": torch.randn(4, 77, 64),
              "added_cond_kwargs": {"text_embeds": torch.randn(4, 32), "time_ids": torch.randn(4, 6)}}

    def step(m: torch.nn.Module) -> None:
        m(*inputs, **kwargs).sample.square().sum().backward()

    print("\n| tiny SDXL, 4 x 64 px, fp32 | kept after the forward (bytes) | step peak (bytes) |")
    print("|---|---|---|")
    for label, m in (("off", plain), ("on", lean)):
        tracker = StorageTracker()
        with tracker:
            out = m(*inputs, **kwargs).sample
            kept = tracker.live_bytes
            out.square().sum().backward()
        print(f"| {label} | {kept:,} | {tracker.peak_bytes:,} |")
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds):
        for label, m in round_order((("off", plain), ("on", lean)), r):
            step(m)
            start = time.perf_counter()
            for _ in range(20):
                step(m)
            times[label].append((time.perf_counter() - start) / 20)
    ratios = [b / a for a, b in zip(times["off"], times["on"], strict=True)]
    print(f"\nforward + backward ms, off: {[round(t * 1e3, 2) for t in times['off']]}")
    print(f"forward + backward ms, on:  {[round(t * 1e3, 2) for t in times['on']]}")
    print(f"on / off per round: {[round(x, 3) for x in ratios]}; median {statistics.median(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    a = parser.parse_args()
    pin_threads(1)
    planned()
    measured(a.rounds)


if __name__ == "__main__":
    main()
