"""The throughput-aware plan against the largest micro-batch that fits, side by side (CPU).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.plan_speed [--budgets 2.0,0.25] [--rounds 5] \
        [--max-seq-len 1024] [--curve]

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
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lora_gui.config import apply_overrides
from lora_gui.memory.predict.run_plan import plan_run
from lora_gui.models import text as text_models
from lora_gui.presets import load_config
from lora_gui.units import GB

COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.plan_speed"


def _model(cfg):
    source = text_models.resolve_model_source(cfg.model)
    model = text_models.attach_lora(text_models.load_model_for(cfg, source), cfg).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt


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
    args = parser.parse_args()
    base = apply_overrides(load_config("text-demo"), {"max_seq_len": args.max_seq_len})
    model, opt = _model(base)
    gen = torch.Generator().manual_seed(0)
    print(f"command: {COMMAND} --budgets {args.budgets} --rounds {args.rounds} --max-seq-len "
          f"{args.max_seq_len}{' --curve' if args.curve else ''}; torch threads {torch.get_num_threads()}")
    for gb in (float(x) for x in args.budgets.split(",")):
        plans = {c: plan_run(apply_overrides(base, {"batch_choice": c, "budget_gb": gb}), int(gb * GB), "cpu")
                 for c in ("largest", "fastest")}
        buckets = [b.bucket for b in plans["largest"].buckets if b.micro_batch]
        rows = {n: torch.randint(3, 1000, (base.batch_size, n), generator=gen) for n in buckets}
        batch = {c: {b.bucket: b.micro_batch for b in p.buckets} for c, p in plans.items()}
        for n in buckets:  # warm: kernels, optimizer state
            _step(model, opt, rows[n], batch["largest"][n])
        tokens = base.batch_size * sum(buckets)
        speeds: dict[str, list[float]] = {"largest": [], "fastest": []}
        seconds: dict[tuple[str, int], list[float]] = {(c, n): [] for c in speeds for n in buckets}
        for r in range(args.rounds):
            for c in (("largest", "fastest") if r % 2 == 0 else ("fastest", "largest")):
                for n in buckets:
                    seconds[c, n].append(_step(model, opt, rows[n], batch[c][n]))
                speeds[c].append(tokens / sum(seconds[c, n][-1] for n in buckets))
        ratios = [f / s for f, s in zip(speeds["fastest"], speeds["largest"], strict=True)]
        peak = {c: max(b.peak_bytes for b in p.buckets if b.micro_batch) for c, p in plans.items()}
        fast = plans["fastest"].buckets
        print(f"\nbudget {gb:g} GB; step time: {_source(fast)}")
        print("| choice | micro-batch per bucket | predicted peak MiB (largest bucket's plan) "
              "| tokens/s (median of rounds) | per round |")
        print("|---|---|---|---|---|")
        for c in ("largest", "fastest"):
            print(f"| {c} | {', '.join(f'{n}: {batch[c][n]}' for n in buckets)} | {peak[c] / 2**20:.1f} "
                  f"| {statistics.median(speeds[c]):,.0f} | {', '.join(f'{x:,.0f}' for x in speeds[c])} |")
        print(f"fastest / largest: {statistics.median(ratios):.3f}x (median of per-round ratios: "
              f"{', '.join(f'{x:.2f}' for x in ratios)}); predicted tokens/s of the fastest plan: "
              f"{', '.join(f'{b.bucket}: {b.tokens_per_s:,.0f}' for b in fast if b.tokens_per_s)}")
        _per_bucket(plans, buckets, base.batch_size, seconds)
        if batch["largest"] == batch["fastest"]:
            print("the two plans train the same micro-batches at this budget: their ratio measures the "
                  "machine's noise, not the choice")
        if args.curve:
            _curve(model, opt, rows, {b.bucket: b.largest_fitting or b.micro_batch for b in fast},
                   base.batch_size, args.rounds)


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
