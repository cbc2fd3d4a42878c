"""What the LoRA layers after a norm and a DiT's attention kernel keep: rebuilt from the norms'
inputs, or kept. What it saves and what it costs.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/speed/norm_rebuild.py [--rounds 9] [--no-plans]

Three changes in ``lean_backward``, each keeping a norm's input (kept for its own backward anyway)
instead of what is computed from it:

- torch's ``nn.RMSNorm`` (Flux's query / key norms), which CUDA's autocast runs in float32 keeping a
  float32 copy of its bf16 input, keeps the input (``LeanRMSNorm``), as LayerNorm already did;
- q, k and v (a Flux single block: and its MLP) read a norm's output: a UNet transformer block's
  ``norm1`` / ``norm2``, a DiT block's ``norm(x) * (1 + scale) + shift``. Their adapters kept that
  output (under CUDA's autocast, one bf16 copy of the float32 output); now it is rebuilt once in
  the backward (``lora_gui.models.stand_ins.rebuilt_from``);
- a DiT's attention kernel kept its query and key, ``cat(norm_q(q), norm_added_q(q_text))`` (Flux:
  with rotary embeddings); now they are recomputed from the norms' inputs
  (``lora_gui.models.lean_attention``).

Arms: "before" (every other lean layer, none of the three), "rmsnorm", "norms" (and the rebuilt
norm outputs), "all" (as shipped). The last two apply in models at least ``MIN_REBUILD_WIDTH``
(256) features wide; "forced" runs "all" at every width. (The feed-forward activation and
attention output rebuilds, added later, go with "norms" and "all": ``bench/speed/ffn_rebuild.py``
measures them apart.)

1. Planned peaks at the real models' shapes (source: predicted; the fake-tensor trace of one
   LoRA step on CUDA in bf16 under CUDA's autocast, SDPA, float32 adapters; UNets with diffusers'
   default targets, DiTs with the scripts' defaults).
2. Measured on this CPU (source: tracker), fp32: 256-wide SD-, SD3.5- and Flux-shaped models built
   from configs at 256 px, batch 2 (where the recomputes apply), and the bundled drawing model
   (64 wide: they do not; forced, to show why) at 64 px, batch 4 (the peer bench's) and 16: the
   bytes alive between the forward and the backward and the step peak; the seconds of a forward
   and backward, the arms alternating, the order flipped every round; the median of the
   per-round ratios to "before".
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import pin_threads, round_order  # noqa: E402
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


ARMS = ("before", "rmsnorm", "norms", "all")


@contextlib.contextmanager
def arm(name: str) -> Iterator[None]:
    """The changes of ``name`` on (every other lean layer on in every arm)."""
    from torch import nn

    from lora_gui.models import stand_ins

    saved = (stand_ins.rebuilt_from, lean_backward.lean_dit_attention, lean_backward.LeanRMSNorm,
             stand_ins.MIN_REBUILD_WIDTH)
    if name == "before":
        lean_backward.LeanRMSNorm = nn.RMSNorm  # swapped for itself: torch's own
    if name in ("before", "rmsnorm"):
        stand_ins.rebuilt_from = lambda *args: None
    if name in ("before", "rmsnorm", "norms"):
        lean_backward.lean_dit_attention = lambda module: 0
    if name == "forced":
        stand_ins.MIN_REBUILD_WIDTH = 0
    try:
        yield
    finally:
        (stand_ins.rebuilt_from, lean_backward.lean_dit_attention, lean_backward.LeanRMSNorm,
         stand_ins.MIN_REBUILD_WIDTH) = saved


def planned() -> None:
    print("| model | shape | planned peak MiB: before / rmsnorm / norms / all | change | activations MiB: "
          "before / all | change |")
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


def _lora(model: torch.nn.Module, targets: list[str]) -> torch.nn.Module:
    from peft import LoraConfig

    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    return model


def _unet_256() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    """An SD-1.x-shaped UNet, 256 wide (two levels, one transformer block each)."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(block_out_channels=(256, 256), layers_per_block=1, cross_attention_dim=256,
                                attention_head_dim=8, norm_num_groups=32,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    _lora(unet, ["to_q", "to_k", "to_v", "to_out.0"])
    inputs = (torch.randn(2, 4, 32, 32), torch.rand(2) * 1000)  # 256 px
    kwargs = {"encoder_hidden_states": torch.randn(2, 77, 256)}
    return unet, lambda m: m(*inputs, **kwargs).sample


def _sd35_256() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    """An SD3.5-shaped transformer (query / key RMSNorms), 256 wide, 2 blocks."""
    from diffusers import SD3Transformer2DModel

    from lora_gui.models.dit import lora_targets

    torch.manual_seed(0)
    model = SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=16, num_layers=2,
                                  attention_head_dim=64, num_attention_heads=4, joint_attention_dim=256,
                                  caption_projection_dim=256, pooled_projection_dim=256, out_channels=16,
                                  pos_embed_max_size=32, qk_norm="rms_norm")
    _lora(model, lora_targets("sd3", "all-linear"))
    inputs = {"hidden_states": torch.randn(2, 16, 32, 32), "encoder_hidden_states": torch.randn(2, 77, 256),
              "pooled_projections": torch.randn(2, 256), "timestep": torch.rand(2) * 1000}
    return model, lambda m: m(**inputs).sample


def _flux_256() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    """A Flux-shaped transformer, 256 wide, 1 double and 2 single blocks."""
    from diffusers import FluxTransformer2DModel

    from lora_gui.models.dit import lora_targets

    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=2,
                                   attention_head_dim=64, num_attention_heads=4, joint_attention_dim=256,
                                   pooled_projection_dim=256, guidance_embeds=True,
                                   axes_dims_rope=(8, 28, 28))
    _lora(model, lora_targets("flux", "all-linear"))
    grid = torch.stack(torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij"), -1).reshape(256, 2)
    inputs = {"hidden_states": torch.randn(2, 256, 64), "encoder_hidden_states": torch.randn(2, 64, 256),
              "pooled_projections": torch.randn(2, 256), "timestep": torch.rand(2),
              "img_ids": torch.cat([torch.zeros(256, 1), grid.float()], 1), "txt_ids": torch.zeros(64, 3),
              "guidance": torch.full((2,), 3.5)}  # 256 px: 16 x 16 packed latents
    return model, lambda m: m(**inputs).sample


def _drawing_sd3(batch: int) -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    from diffusers import SD3Transformer2DModel

    from lora_gui.models.dit import lora_targets

    model = SD3Transformer2DModel.from_pretrained(ROOT / "assets" / "drawing-model", subfolder="transformer")
    _lora(model, lora_targets("sd3", "all-linear"))
    cfg = model.config
    torch.manual_seed(1)
    # 64 px (the largest it takes) through its VAE (4x): 16 x 16 latents; 12 CLIP + 12 T5 tokens
    inputs = {"hidden_states": torch.randn(batch, cfg.in_channels, 16, 16),
              "encoder_hidden_states": torch.randn(batch, 24, cfg.joint_attention_dim),
              "pooled_projections": torch.randn(batch, cfg.pooled_projection_dim),
              "timestep": torch.rand(batch) * 1000}
    return model, lambda m: m(**inputs).sample


def measured(name: str, build: Callable, rounds: int, arms_: tuple[str, ...] = ARMS,
             arm_of: Callable[[str], contextlib.AbstractContextManager] | None = None) -> None:
    """Bytes and seconds of each arm (``arm_of``: the arms' context managers, this bench's by
    default; the first arm is the baseline)."""
    arm_of = arm_of or arm
    plain, forward = build()
    arms = {}
    for a in arms_:
        arms[a] = copy.deepcopy(plain)  # a plain diffusers model: its own modules, nothing patched yet
        with arm_of(a):
            lean_frozen_layers(arms[a])

    def step(a: str) -> None:
        with arm_of(a):
            forward(arms[a]).square().sum().backward()

    print(f"\n| {name}, fp32 | kept after the forward (bytes) | step peak (bytes) |")
    print("|---|---|---|")
    for a in arms_:
        tracker = StorageTracker()
        with tracker, arm_of(a):
            out = forward(arms[a])
            kept = tracker.live_bytes
            out.square().sum().backward()
        print(f"| {a} | {kept:,} | {tracker.peak_bytes:,} |")
    times: dict[str, list[float]] = {a: [] for a in arms_}
    for r in range(rounds):
        for a in round_order(arms_, r):
            step(a)
            start = time.perf_counter()
            for _ in range(5):
                step(a)
            times[a].append((time.perf_counter() - start) / 5)
    for a in arms_:
        ratios = [b / x for x, b in zip(times[arms_[0]], times[a], strict=True)]
        print(f"{a}: forward + backward ms {[round(t * 1e3, 1) for t in times[a]]}; / {arms_[0]} per round "
              f"{[round(x, 3) for x in ratios]}; median {statistics.median(ratios):.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-plans", action="store_true", help="the CPU measurements only")
    a = parser.parse_args()
    pin_threads(1)
    if not a.no_plans:
        planned()
    measured("SD-1.x-shaped UNet, 256 wide, 2 x 256 px", _unet_256, a.rounds, ("before", "norms"))
    measured("SD3.5-shaped, 256 wide, 2 x 256 px", _sd35_256, a.rounds, ("before", "norms", "all"))
    measured("Flux-shaped, 256 wide, 2 x 256 px", _flux_256, a.rounds)
    for batch in (4, 16):  # the peer bench's batch, and 16
        measured(f"drawing model (SD3, 64 wide), {batch} x 64 px", functools.partial(_drawing_sd3, batch),
                 a.rounds, ("before", "all", "forced"))


if __name__ == "__main__":
    main()
