"""Each speed switch on and off, side by side in one process (CPU): step time and tracked peak.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed_switches [--rounds 9] [--batch 8] [--seq 256]

The text demo's model and LoRA (r8, all linear layers), one batch of ``--batch`` rows of
``--seq`` tokens, a full training step (forward, loss, backward, AdamW step). Each round times
one step of both arms, the order reversed every round; the figure is the median over rounds of
the per-round ratio (off / on). Peak: live tensor bytes by lora_gui's tracker (source ``tracker``)
over one step, weights, gradients and optimizer state counted first.

- ``lora_fused``: the adapter's output added inside one addmm (on) vs peft's forward (off).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from lora_gui.config import apply_overrides
from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models import text as text_models
from lora_gui.presets import load_config

COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed_switches"


def _arm(fused: bool, base):
    cfg = apply_overrides(load_config("text-demo"), {"lora_fused": fused})
    torch.manual_seed(0)
    model = text_models.attach_lora(copy.deepcopy(base), cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model.train(), opt


def _step(model, opt, ids) -> float:
    t0 = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def _peak(model, opt, ids) -> int:
    tracker = StorageTracker()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    tracker.track(list(model.parameters()) + list(model.buffers()) + state)
    with tracker:
        _step(model, opt, ids)
    return tracker.peak_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    source = text_models.resolve_model_source(load_config("text-demo").model)
    base = text_models.load_base_model(source, "sdpa")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, base.config.vocab_size, (args.batch, args.seq), generator=gen)
    arms = {"on": _arm(True, base), "off": _arm(False, base)}
    for model, opt in arms.values():
        _step(model, opt, ids)  # warm: optimizer state, kernels
    peaks = {k: _peak(m, o, ids) for k, (m, o) in arms.items()}
    times: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for k in (("on", "off") if r % 2 == 0 else ("off", "on")):
            times[k].append(_step(*arms[k], ids))
    ratios = [off / on for on, off in zip(times["on"], times["off"], strict=True)]
    print(f"lora_fused, {args.batch} x {args.seq} tokens, {args.rounds} rounds; command: {COMMAND}")
    print("| switch | step s on (median) | step s off (median) | speed-up off/on (median of rounds) "
          "| per round | peak MiB on / off (tracker) |")
    print("|---|---|---|---|---|---|")
    print(f"| lora_fused | {statistics.median(times['on']):.3f} | {statistics.median(times['off']):.3f} | "
          f"{statistics.median(ratios):.3f}x | {', '.join(f'{x:.2f}' for x in ratios)} | "
          f"{peaks['on'] / 2**20:.1f} / {peaks['off'] / 2**20:.1f} |")


if __name__ == "__main__":
    main()
