"""Two more things a DiT step kept that it can rebuild from what it keeps anyway: what it saves
and what it costs.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/speed/ffn_rebuild.py [--rounds 9] [--no-plans]

- A DiT block's feed-forward is ``net.2(gelu(net.0.proj(x)))`` (diffusers' ``GELU``; a UNet's:
  ``net.2(h * gelu(g))``, ``GEGLU``). With a LoRA on ``net.2`` (one of Flux's default targets,
  and any "all linear layers" choice) its adapter kept what it reads, the activation, beside the
  projection that gelu's backward keeps anyway. ``lean_backward`` now marks the activation as
  rebuilt from the projection (``LeanGELU``, ``LeanGEGLU``).
- What a DiT's attention hands ``to_out`` and ``to_add_out`` can be a copy of the kernel's
  output, which the kernel keeps for its backward: Flux under CUDA's autocast hands it on in
  float32 (its query / key norms are float32), and the adapters kept a bf16 copy of it; SD3's
  kernel output is heads first and the tokens-first reshape copies it (at a batch of one the
  adapters' inputs are views of that copy). The lean processors (``lean_attention``) mark those
  parts as rebuilt from the kernel's output.

Arms: "before" (neither; every other lean layer on), "ffn" (the activations rebuilt), "after"
(both: as shipped); in models at least ``MIN_REBUILD_WIDTH`` (256) features wide.

1. Planned peaks at the real models' shapes (source: predicted; the fake-tensor trace of one
   LoRA step on CUDA in bf16 under CUDA's autocast, SDPA, float32 adapters): Flux.1-dev and
   SD3.5 with the scripts' default targets, and SD3.5-medium and SDXL with ``ff.net.2`` added.
2. Measured on this CPU (source: tracker), fp32: the 256-wide Flux-shaped model of
   ``bench/speed/norm_rebuild.py`` (1 double, 2 single blocks) at 256 px, batch 2: bytes alive between
   the forward and the backward, the step peak, and the seconds of a forward and backward, the
   arms alternating, the order flipped every round; the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.speed import norm_rebuild  # noqa: E402
from lora_gui.memory.predict.dit_trace import trace_dit_step  # noqa: E402
from lora_gui.memory.predict.trace import trace_unet_step  # noqa: E402
from lora_gui.models import lean_attention, lean_backward, stand_ins  # noqa: E402
from lora_gui.models.dit import FLUX_LORA_TARGETS, SD3_LORA_TARGETS  # noqa: E402

MiB = 2**20
UNET_DEFAULT = ["to_q", "to_k", "to_v", "to_out.0"]
PLANS = (  # (trace, model, shape, targets: None for the trace's default)
    (trace_dit_step, "flux.1-dev", {"resolution": 1024, "batch_size": 1}, None),
    (trace_dit_step, "flux.1-dev", {"resolution": 512, "batch_size": 4}, None),
    (trace_dit_step, "sd3.5-medium", {"resolution": 1024, "batch_size": 1}, None),
    (trace_dit_step, "sd3.5-medium", {"resolution": 1024, "batch_size": 1}, [*SD3_LORA_TARGETS, "ff.net.2"]),
    (trace_dit_step, "sd3.5-large", {"resolution": 1024, "batch_size": 1}, None),
    (trace_unet_step, "sdxl-unet", {"resolution": 1024, "batch_size": 1}, [*UNET_DEFAULT, "ff.net.2"]),
)
ARMS = ("before", "ffn", "after")
assert "ff.net.2" in FLUX_LORA_TARGETS  # the plans' premise: Flux's default targets read the activation


def _is_activation_rebuild(fn: object) -> bool:
    return fn is lean_backward._geglu_product or (
        isinstance(fn, functools.partial) and fn.func is torch.nn.functional.gelu)


def _is_kernel_output_rebuild(fn: object) -> bool:
    return isinstance(fn, functools.partial) and fn.func is lean_attention._kernel_output_part


@contextlib.contextmanager
def arm(name: str) -> Iterator[None]:
    """"before": neither change (every other lean layer on); "ffn": the feed-forward activations
    rebuilt; "after": and the attention outputs (as shipped)."""
    shipped = stand_ins.rebuilt_from
    skip = {"before": lambda fn: _is_activation_rebuild(fn) or _is_kernel_output_rebuild(fn),
            "ffn": _is_kernel_output_rebuild}.get(name)
    if skip is not None:
        stand_ins.rebuilt_from = lambda out, x, fn: None if skip(fn) else shipped(out, x, fn)
    try:
        yield
    finally:
        stand_ins.rebuilt_from = shipped


def planned() -> None:
    print("| model | shape | LoRA targets | planned peak MiB: before / ffn / after | change | "
          "activations MiB: before / after | change |")
    print("|---|---|---|---|---|---|---|")
    for trace, name, shape, targets in PLANS:
        results = []
        for a in ARMS:
            with arm(a):
                results.append(trace(name, dtype=torch.bfloat16, device="cuda", target_modules=targets,
                                     **shape))
        px = ", ".join(f"{k} {v}" for k, v in shape.items())
        which = "the script's defaults" if targets is None else "defaults + ff.net.2"
        before, after = results[0], results[-1]
        a_off, a_on = before.breakdown["activations"], after.breakdown["activations"]
        peaks = " / ".join(f"{r.peak_bytes / MiB:,.0f}" for r in results)
        print(f"| {name} | {px} | {which} | {peaks} | "
              f"{after.peak_bytes / before.peak_bytes - 1:+.2%} | {a_off / MiB:,.0f} / {a_on / MiB:,.0f} | "
              f"{a_on / a_off - 1:+.1%} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--no-plans", action="store_true")
    a = parser.parse_args()
    torch.set_num_threads(1)
    if not a.no_plans:
        planned()
    # the measuring loop of bench/speed/norm_rebuild.py, with these arms
    norm_rebuild.measured("Flux-shaped, 256 wide, 1 + 2 blocks, 2 x 256 px", norm_rebuild._flux_256, a.rounds,
                          ARMS, arm_of=arm)


if __name__ == "__main__":
    main()
