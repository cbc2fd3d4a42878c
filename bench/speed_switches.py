"""Each speed switch on and off, side by side in one process (CPU): step time and tracked peak.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed_switches [--rounds 9] [--batch 8] [--seq 256]

The text demo's model and LoRA (r8, all linear layers), one batch of ``--batch`` rows of
``--seq`` tokens, a full training step (forward, loss, backward, AdamW step). Each round times
one step of both arms, the order reversed every round; the figure is the median over rounds of
the per-round ratio (off / on). Peak: live tensor bytes by lora_gui's tracker (source ``tracker``)
over one step, weights, gradients and optimizer state counted first.

- ``lora_fused``: the adapter's output added inside one addmm (on) vs peft's forward (off).
- ``--compile``: regional ``torch.compile`` of the decoder block (``layer.compile(dynamic=True)``
  on every layer: one graph serves every layer and, with dynamic shapes, every bucket length) vs
  eager, both with ``lora_fused`` on, on several bucket shapes. The compile time (first step of
  each shape, compiled, minus the same eager step) is reported apart AND inside a whole-run figure
  (compile + the steps of the TRL bench's epoch), since the TRL bench times the whole training
  loop. Timed without the tracker; one step is then run under the tracker to show what a CPU run
  (which always measures its peak with the tracker's Python dispatch mode) gets: dynamo skips
  compiled code while a dispatch mode is active, so the step runs eagerly, at the eager peak.
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


COMPILE_SHAPES = ((4, 448), (8, 256), (2, 960), (16, 128))  # (rows, padded length) buckets


def compile_bench(base, rounds: int, run_steps: int = 3) -> None:
    """Regional torch.compile of the decoder block vs eager (see the module doc)."""
    gen = torch.Generator().manual_seed(0)
    batches = {s: torch.randint(3, base.config.vocab_size, s, generator=gen) for s in COMPILE_SHAPES}
    eager, compiled = _arm(True, base), _arm(True, base)
    for layer in compiled[0].base_model.model.model.layers:
        layer.compile(dynamic=True)
    for s in COMPILE_SHAPES:
        _step(*eager, batches[s])  # warm: optimizer state, kernels
    first = {s: _step(*compiled, batches[s]) for s in COMPILE_SHAPES}  # compiles (once per shape)
    times: dict[str, dict[tuple, list[float]]] = {"eager": {}, "compiled": {}}
    for r in range(rounds):
        for s in COMPILE_SHAPES:
            for k in (("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")):
                arm = eager if k == "eager" else compiled
                times[k].setdefault(s, []).append(_step(*arm, batches[s]))
    print(f"regional torch.compile (decoder block, dynamic=True), {rounds} rounds; command: "
          f"{COMMAND} --compile")
    print("| rows x length | compile s (first step - eager step) | eager step s (median) "
          "| compiled step s (median) | speed-up (median of rounds) | per round |")
    print("|---|---|---|---|---|---|")
    compile_s = 0.0
    for s in COMPILE_SHAPES:
        e, c = times["eager"][s], times["compiled"][s]
        ratios = [a / b for a, b in zip(e, c, strict=True)]
        extra = max(0.0, first[s] - statistics.median(e))
        compile_s += extra
        print(f"| {s[0]} x {s[1]} | {extra:.1f} | {statistics.median(e):.3f} | {statistics.median(c):.3f} "
              f"| {statistics.median(ratios):.2f}x | {', '.join(f'{x:.2f}' for x in ratios)} |")
    step_e = statistics.median(t for v in times["eager"].values() for t in v)
    step_c = statistics.median(t for v in times["compiled"].values() for t in v)
    whole_e, whole_c = run_steps * step_e, compile_s + run_steps * step_c
    after = (f"compiled wins after {compile_s / (step_e - step_c):.0f} steps" if step_c < step_e
             else "the compiled step is not faster")
    print(f"\nwhole run of {run_steps} steps (the TRL bench's epoch): eager {whole_e:.1f} s, compiled "
          f"{whole_c:.1f} s (compile {compile_s:.1f} s included): {whole_e / whole_c:.2f}x; {after} "
          f"(median step {step_e:.3f} s eager, {step_c:.3f} s compiled)")
    tracked = StorageTracker()
    state = [t for s in compiled[1].state.values() for t in s.values() if torch.is_tensor(t)]
    tracked.track(list(compiled[0].parameters()) + list(compiled[0].buffers()) + state)
    with tracked:
        seconds = _step(*compiled, batches[COMPILE_SHAPES[0]])
    print(f"under the tracker (a CPU run): {seconds:.3f} s, peak {tracked.peak_bytes / 2**20:.1f} MiB "
          f"(eager peak {_peak(*eager, batches[COMPILE_SHAPES[0]]) / 2**20:.1f} MiB): dynamo runs the "
          "block eagerly while the dispatch mode is active")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--compile", action="store_true",
                        help="regional torch.compile of the decoder block on / off instead")
    args = parser.parse_args()
    source = text_models.resolve_model_source(load_config("text-demo").model)
    base = text_models.load_base_model(source, "sdpa")
    if args.compile:
        return compile_bench(base, args.rounds)
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
