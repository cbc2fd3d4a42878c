"""What lora_gui's CPU memory tracker costs a training step, and what it costs TRL in the peer bench.

    OMP_NUM_THREADS=1 python -m bench.peers.tracker_cost [--rounds 9] [--batch 1] [--seq 256] [--trl 2]

Part 1: one full training step (forward, loss, backward, AdamW) of the text demo's model with its
LoRA (fused forward), ``--batch`` x ``--seq`` tokens, under no mode, under an empty
``TorchDispatchMode`` (the cost of any Python dispatch mode) and under ``StorageTracker``; the
order of the three reversed every round; medians of seconds per step, and the tracker's peak.

Part 2 (``--trl N``): N alternating rounds of TRL's ``micro-batch 1 x 8`` epoch of
``bench.peers.trl_sft`` (24 documents) with the tracker around ``trainer.train()`` (as that bench runs
it) and without (as a TRL user runs it); real tokens/s per round.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models import text as text_models
from lora_gui.presets import load_config


@contextlib.contextmanager
def without_cpu_tracker() -> Any:
    """lora_gui's engine with its CPU step-peak tracker never pushed (a diagnosis of what the
    tracker costs, not how users run it: the run's step peaks are then not measured)."""
    from lora_gui.memory.runtime.meter import PeakMeter

    enter, exit_ = PeakMeter.__enter__, PeakMeter.__exit__
    PeakMeter.__enter__ = lambda self: self  # ``_inside`` stays False: start_step never pushes
    PeakMeter.__exit__ = lambda self, *exc: None
    try:
        yield
    finally:
        PeakMeter.__enter__, PeakMeter.__exit__ = enter, exit_


class EmptyMode(TorchDispatchMode):
    """A dispatch mode that only runs each op: the floor any Python dispatch mode pays."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def step_costs(rounds: int, batch: int, seq: int) -> None:
    cfg = load_config("text-demo")
    base = text_models.load_base_model(text_models.resolve_model_source(cfg.model), "sdpa")
    torch.manual_seed(0)
    model = text_models.attach_lora(copy.deepcopy(base), cfg).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(3, base.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))

    def step(mode: contextlib.AbstractContextManager) -> float:
        t0 = time.perf_counter()
        with mode:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    modes = {"no mode": contextlib.nullcontext, "empty dispatch mode": EmptyMode, "tracker": StorageTracker}
    for make in modes.values():
        step(make())  # warm: optimizer state, kernels
    times: dict[str, list[float]] = {k: [] for k in modes}
    for r in range(rounds):
        for k in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            times[k].append(step(modes[k]()))
    tracker = StorageTracker()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    tracker.track(list(model.parameters()) + list(model.buffers()) + state)
    step(tracker)
    print(f"one step, {batch} x {seq} tokens, {rounds} rounds (median s / step); tracker peak "
          f"{tracker.peak_bytes:,} bytes")
    print("| " + " | ".join(modes) + " |\n|" + "---|" * len(modes))
    print("| " + " | ".join(f"{statistics.median(v):.4f}" for v in times.values()) + " |")


def trl_costs(rounds: int) -> None:
    import bench.peers.trl_sft as peer
    from lora_gui.config import apply_overrides

    class Untracked(StorageTracker):
        def __enter__(self):
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    folder = Path(tempfile.mkdtemp(prefix="tracker-cost-"))
    base = load_config("text-demo", {"max_steps": 0, "epochs": 1, "max_seq_len": 1024})
    corpus, ids = peer.bench_documents(base, 24, folder)
    cfg = apply_overrides(base, {"data": str(corpus), "eval_fraction": 0.0, "precision": "auto",
                                 "monitor_hz": 0.0, "checkpoint_every": 1_000_000})
    speeds: dict[str, list[float]] = {"tracked": [], "untracked": []}
    for r in range(rounds):
        for k in (("tracked", "untracked") if r % 2 == 0 else ("untracked", "tracked")):
            peer.StorageTracker = StorageTracker if k == "tracked" else Untracked
            speeds[k].append(peer.run_trl("trl-mb1x8", ids, cfg, folder)["real_tokens_per_s"])
    peer.StorageTracker = StorageTracker
    print("TRL micro-batch 1 x 8, real tok/s per round: " + "; ".join(
        f"{k} {[round(v) for v in vs]} (median {statistics.median(vs):.0f})" for k, vs in speeds.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--trl", type=int, default=0, help="rounds of TRL tracked / untracked (0: skip)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    step_costs(args.rounds, args.batch, args.seq)
    if args.trl:
        trl_costs(args.trl)


if __name__ == "__main__":
    main()
