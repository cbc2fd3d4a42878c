"""Plans for CUDA with and without CUDA's autocast: what tracing the step as a GPU run trains
(accelerate's mixed precision) changes, with lean_backward off and on.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/memory/cuda_autocast_plans.py

Source: predicted (the fake-tensor trace of one LoRA step on CUDA in bf16, SDPA, float32 adapters;
the shapes of bench/speed/lean_backward.py). "without" is the trace with the autocast emulation
switched off (how plans for CUDA were traced before: 16-bit norms and softmax, no matmul copies);
"under" is how they are traced now (:mod:`lora_gui.models.cuda_autocast`). Where "under" is
higher, a plan made without it was below what the card holds. Not a measurement on a card.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lora_gui.memory.predict.dit_trace as dit_trace  # noqa: E402
import lora_gui.memory.predict.trace as trace  # noqa: E402
from bench.speed.lean_backward import PLANS  # noqa: E402

MiB = 2**20


def _plan(fn, name: str, shape: dict, lean: bool, autocast: bool) -> int:  # noqa: ANN001
    own = trace.run_autocast
    chooser = own if autocast else (lambda device, dtype: None)
    trace.run_autocast = dit_trace.run_autocast = chooser
    try:
        return fn(name, dtype=torch.bfloat16, device="cuda", lean_backward=lean, **shape).peak_bytes
    finally:
        trace.run_autocast = dit_trace.run_autocast = own


def main() -> None:
    torch.set_num_threads(1)
    print("| model | shape | lean off: without / under autocast (MiB) | change | lean on: without / under "
          "(MiB) | change | lean on / off, under autocast |")
    print("|---|---|---|---|---|---|---|")
    for fn, name, shape in PLANS:
        off0, off1, on0, on1 = (_plan(fn, name, shape, lean, ac)
                                for lean in (False, True) for ac in (False, True))
        px = ", ".join(f"{k} {v}" for k, v in shape.items())
        print(f"| {name} | {px} | {off0 / MiB:,.0f} / {off1 / MiB:,.0f} | {off1 / off0 - 1:+.1%} | "
              f"{on0 / MiB:,.0f} / {on1 / MiB:,.0f} | {on1 / on0 - 1:+.1%} | {on1 / off1 - 1:+.1%} |",
              flush=True)


if __name__ == "__main__":
    main()
