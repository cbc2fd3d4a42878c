"""The throughput-aware plan against the largest micro-batch that fits, side by side (CPU).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.plan_speed [--budgets 2.0,0.25] [--rounds 5] \
        [--max-seq-len 1024] [--curve] [--checkpointing]

The text demo (built-in 4M-parameter Llama, LoRA r8 on every linear layer, its settings: 8 rows
a step, buckets 64...1024 tokens) planned under each budget twice: ``batch_choice=largest``
(the plan before the step-time model) and ``fastest`` (the default now), with the step-time model
calibrated on this machine (its source is printed). Each arm then trains one step of 8 rows per
bucket, cut into its plan's micro-batches (forward, backward and an AdamW update); a round times
both arms, the order reversed every round; tokens/s is the median over rounds of all buckets'
tokens over all buckets' seconds, and the ratio the median of the per-round ratios. The
predicted peaks are the plan's (source: predicted). ``--curve`` also times every micro-batch
from 1 to the largest that fits at each bucket (one step of 8 rows each, median of rounds), the
measured answer to "is the largest micro-batch the fastest on this machine".

``--checkpointing``: the same demo with ``gradient_checkpointing: true`` and no layer count.
``largest`` checkpoints every layer at the largest micro-batches (the plan before the
throughput-aware choice); ``fastest`` lets the plan choose how many layers to checkpoint
(:mod:`lora_gui.memory.predict.checkpoint_choice`, weighted as this bench trains: 8 rows of every
bucket) and its micro-batches. ``largest`` is planned under ``--budgets``, ``fastest`` under the
peak the ``largest`` plan predicts (its largest bucket's), so the fastest plan's predicted peak is
the same or lower. (Planning ``largest`` again at its own peak is not stable: the estimate that
bounds the search is a little above the trace, so a bucket can lose a row each time.)
Each arm trains its own copy of the model (same weights) checkpointed as its plan says.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from bench.common import write_results
from lora_gui.config import apply_overrides
from lora_gui.memory.predict.checkpoint_choice import choose_checkpoint_layers
from lora_gui.memory.predict.run_plan import plan_run
from lora_gui.models import text as text_models
from lora_gui.models.checkpointing import enable_checkpointing
from lora_gui.presets import load_config
from lora_gui.units import GB

COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.plan_speed"


def _model(cfg):
    source = text_models.resolve_model_source(cfg.model)
    torch.manual_seed(0)  # the same LoRA weights in every arm
    model = text_models.attach_lora(text_models.load_model_for(cfg, source), cfg).train()
    if cfg.gradient_checkpointing:
        enable_checkpointing(model, cfg.checkpoint_layers)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt


def _plans(base, gb: float, checkpointing: bool) -> tuple[dict, dict]:
    """Each choice's plan and resolved settings. With ``checkpointing``: both under the largest
    plan's own predicted peak, the fastest with the depth its plan chooses."""
    budget = int(gb * GB)
    largest_cfg = apply_overrides(base, {"batch_choice": "largest", "budget_gb": gb})
    largest = plan_run(largest_cfg, budget, "cpu")
    if checkpointing:  # the fastest plan under the peak the largest plan reaches: never above it
        budget = max(b.peak_bytes for b in largest.buckets if b.micro_batch)
    fast_cfg = apply_overrides(base, {"batch_choice": "fastest", "budget_gb": budget / GB})
    rows = [b.bucket for b in largest.buckets if b.micro_batch for _ in range(base.batch_size)]
    depth = choose_checkpoint_layers(fast_cfg, None, budget, "cpu", None, rows)
    fast_cfg = depth.applied(fast_cfg) if depth is not None else fast_cfg
    return ({"largest": largest, "fastest": plan_run(fast_cfg, budget, "cpu")},
            {"largest": largest_cfg, "fastest": fast_cfg})


def _depth(cfg) -> str:
    """The decoder layers a plan's settings checkpoint, in words."""
    if not cfg.gradient_checkpointing:
        return "none"
    return f"the first {cfg.checkpoint_layers}" if cfg.checkpoint_layers else "every one"


def _step(model, opt, rows: torch.Tensor, micro_batch: int) -> float:
    """Seconds of one optimizer step over ``rows`` cut into micro-batches of ``micro_batch``."""
    start = time.perf_counter()
    for i in range(0, len(rows), micro_batch):
        ids = rows[i:i + micro_batch]
        (model(input_ids=ids, labels=ids).loss * len(ids) / len(rows)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="2.0,0.25", help="GB, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-seq-len", type=int, default=1024, help="the longest bucket (tokens)")
    parser.add_argument("--curve", action="store_true", help="also time every micro-batch that fits")
    parser.add_argument("--checkpointing", action="store_true",
                        help="gradient checkpointing on: the plan also chooses how many layers")
    parser.add_argument("--out", help="also write the table as a stamped results file (bench.docs reads it)")
    args = parser.parse_args()
    table: list[list[str]] = []
    load = os.getloadavg()[0]
    base = apply_overrides(load_config("text-demo"), {"max_seq_len": args.max_seq_len,
                                                      "gradient_checkpointing": args.checkpointing})
    gen = torch.Generator().manual_seed(0)
    command = (f"{COMMAND} --budgets {args.budgets} --rounds {args.rounds} --max-seq-len {args.max_seq_len}"
               f"{' --curve' if args.curve else ''}{' --checkpointing' if args.checkpointing else ''}")
    print(f"command: {command}; torch threads {torch.get_num_threads()}")
    for gb in (float(x) for x in args.budgets.split(",")):
        plans, cfgs = _plans(base, gb, args.checkpointing)
        models = {c: _model(cfgs[c]) for c in plans}
        buckets = [b.bucket for b in plans["largest"].buckets if b.micro_batch]
        rows = {n: torch.randint(3, 1000, (base.batch_size, n), generator=gen) for n in buckets}
        batch = {c: {b.bucket: b.micro_batch for b in p.buckets} for c, p in plans.items()}
        for c in plans:  # warm: kernels, optimizer state
            for n in buckets:
                _step(*models[c], rows[n], batch[c][n])
        tokens = base.batch_size * sum(buckets)
        speeds: dict[str, list[float]] = {"largest": [], "fastest": []}
        seconds: dict[tuple[str, int], list[float]] = {(c, n): [] for c in speeds for n in buckets}
        for r in range(args.rounds):
            for c in (("largest", "fastest") if r % 2 == 0 else ("fastest", "largest")):
                for n in buckets:
                    seconds[c, n].append(_step(*models[c], rows[n], batch[c][n]))
                speeds[c].append(tokens / sum(seconds[c, n][-1] for n in buckets))
        ratios = [f / s for f, s in zip(speeds["fastest"], speeds["largest"], strict=True)]
        peak = {c: max(b.peak_bytes for b in p.buckets if b.micro_batch) for c, p in plans.items()}
        fast = plans["fastest"].buckets
        print(f"\nbudget {plans['largest'].budget_bytes / GB:g} GB (fastest: "
              f"{plans['fastest'].budget_bytes / GB:g} GB); step time: {_source(fast)}")
        print("| choice | checkpointed | micro-batch per bucket | predicted peak MiB (largest bucket's plan) "
              "| tokens/s (median of rounds) | per round |")
        print("|---|---|---|---|---|---|")
        for c in ("largest", "fastest"):
            print(f"| {c} | {_depth(cfgs[c])} | {', '.join(f'{n}: {batch[c][n]}' for n in buckets)} "
                  f"| {peak[c] / 2**20:.1f} "
                  f"| {statistics.median(speeds[c]):,.0f} | {', '.join(f'{x:,.0f}' for x in speeds[c])} |")
        for c in ("largest", "fastest"):
            table.append([f"{plans[c].budget_bytes / GB:.4g} GB", c, _depth(cfgs[c]),
                          ", ".join(f"{n}: {batch[c][n]}" for n in buckets), f"{peak[c] / 2**20:.1f}",
                          f"{statistics.median(speeds[c]):,.0f}", ", ".join(f"{x:,.0f}" for x in speeds[c]),
                          "" if c == "largest" else f"{statistics.median(ratios):.3f}x (per round: "
                          f"{', '.join(f'{x:.2f}' for x in ratios)})"])
        print(f"fastest / largest: {statistics.median(ratios):.3f}x (median of per-round ratios: "
              f"{', '.join(f'{x:.2f}' for x in ratios)}); predicted tokens/s of the fastest plan: "
              f"{', '.join(f'{b.bucket}: {b.tokens_per_s:,.0f}' for b in fast if b.tokens_per_s)}")
        _per_bucket(plans, buckets, base.batch_size, seconds)
        if batch["largest"] == batch["fastest"] and _depth(cfgs["largest"]) == _depth(cfgs["fastest"]):
            print("the two plans train the same micro-batches at this budget: their ratio measures the "
                  "machine's noise, not the choice")
        if args.curve:
            _curve(*models["fastest"], rows, {b.bucket: b.largest_fitting or b.micro_batch for b in fast},
                   base.batch_size, args.rounds)
    if args.out:
        write_results(args.out, {
            "meta": {"command": command,
                     "made_by": "bench/speed/plan_speed.py --out on the shared 2-core CPU, load average"
                     f" {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end "
                     "(compare arms within a budget only: they alternate in every round)"},
            "title": "Throughput-aware plan against the largest micro-batch that fits (text demo, CPU"
                     + (", gradient checkpointing on)" if args.checkpointing else ")"),
            "columns": ["budget", "batch_choice", "checkpointed layers", "micro-batch per bucket",
                        "predicted peak MiB (source: predicted)", "tokens/s (median of rounds)", "per round",
                        "fastest / largest (median of per-round ratios)"],
            "rows": table})


def _per_bucket(plans, buckets: list[int], samples: int, seconds: dict[tuple[str, int], list[float]]) -> None:
    """Each bucket's choice in both plans: the step-time model's predicted seconds of a step of
    ``samples`` rows (forward and backward) beside the measured median (with the update)."""
    model = next((b for b in plans["fastest"].buckets if b.tokens_per_s), None)
    print("| bucket | largest: micro-batch, predicted s, measured s | fastest: micro-batch, predicted s, "
          "measured s |\n|---|---|---|")
    for n in buckets:
        cells = []
        for c in ("largest", "fastest"):
            row = next(b for b in plans[c].buckets if b.bucket == n)
            predicted = samples * n / row.tokens_per_s if row.tokens_per_s else None
            guess = f"{predicted:.3f}" if predicted else ("-" if model is None else "(not timed)")
            cells.append(f"{row.micro_batch}, {guess}, {statistics.median(seconds[c, n]):.3f}")
        print(f"| {n} | {cells[0]} | {cells[1]} |")


def _source(buckets) -> str:
    return "the plan's step-time model (see run.json's speed_source)" if any(
        b.tokens_per_s for b in buckets) else "no step-time model: largest micro-batch"


def _curve(model, opt, rows, largest: dict[int, int], samples: int, rounds: int) -> None:
    """Measured tokens/s of a step of ``samples`` rows per micro-batch size, per bucket."""
    print("\nmeasured tokens/s per micro-batch (one step of "
          f"{samples} rows, median of {rounds} rounds; sizes alternate in order each round)")
    for n, top in largest.items():
        sizes = list(range(1, top + 1))
        times: dict[int, list[float]] = {m: [] for m in sizes}
        for r in range(rounds):
            for m in (sizes if r % 2 == 0 else sizes[::-1]):
                times[m].append(_step(model, opt, rows[n], m))
        cells = ", ".join(f"{m}: {samples * n / statistics.median(times[m]):,.0f}" for m in sizes)
        print(f"- {n} tokens: {cells}")


if __name__ == "__main__":
    main()
