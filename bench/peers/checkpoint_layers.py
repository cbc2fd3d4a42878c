"""``checkpoint_layers`` on the TRL bench's work: each value through lora_gui's real engine, side
by side in one process (CPU), with the run's own plan against its measured peak.

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python -m bench.peers.checkpoint_layers [--docs 192]
        [--rounds 2] [--token-budget 1024] [--layers 0,3,2,1] [--batching bucketed[,packed]] [--json FILE]

The built-in 4-layer Llama, one epoch of the TRL bench's documents (``bench.peers.trl_sft``), fp32,
bucketed batches, gradient checkpointing on, LoRA r8 on all linear layers. ``--layers``: the
values to compare (0: every layer, the default); ``--batching bucketed,packed`` runs every value
with each batching (packed: documents packed into rows of the token budget, each attending to
itself only). Each round runs every value, the order reversed
every round; real tokens/s over the training loop (the same clock as the TRL bench), its median
over rounds, and each value's per-round ratio to every layer checkpointed in the same round.
Peak: the run's own tracker (source ``tracker``); plan: the run's own prediction
(``predicted_vs_measured``). Without checkpointing as the last row, for the other end.

    .venv/bin/python -m bench.peers.checkpoint_layers --plans llama-3.1-8b --seq 2048 --layers 0,24,16,8

prints instead what a CUDA plan predicts for each value on a bundled model's shapes (the
fake-tensor trace with the card's overheads, and the closed-form estimate beside it), bf16,
batch 1, LoRA r16 on all linear layers, SDPA, the chunked loss: what each kept layer costs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.common import pin_threads, round_order, write_results
from bench.peers.trl_sft import LORA_CONFIGS, bench_run_config, run_lora
from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.trace import trace_text_step

MiB, GiB = 2**20, 2**30


def print_plans(model: str, seq: int, values: list[int]) -> None:
    """Predicted peaks (GiB, CUDA) per checkpoint_layers value: trace and closed form."""
    print(f"{model}, {seq} tokens, batch 1, bf16, LoRA r16 all-linear, sdpa, loss_chunk 1024, CUDA\n"
          "| checkpoint_layers | trace GiB | closed form GiB | trace - every layer, GiB |\n|---|---|---|---|")
    kw = dict(batch_size=1, seq_len=seq, dtype="bfloat16", device="cuda", loss_chunk=1024,
              gradient_checkpointing=True)
    first = None
    for v in values:
        traced = trace_text_step(model, checkpoint_layers=v, **kw).peak_bytes
        first = traced if first is None else first
        closed = estimate_text_step(model, checkpoint_layers=v, **kw).peak_bytes
        print(f"| {v or 'every layer'} | {traced / GiB:.2f} | {closed / GiB:.2f} | "
              f"{(traced - first) / GiB:+.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--token-budget", type=int, default=1024)
    parser.add_argument("--layers", default="0,3,2,1")
    parser.add_argument("--batching", default="bucketed", help="bucketed, packed or both (comma-separated)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plans", default=None, help="a bundled model: print its CUDA plans instead")
    parser.add_argument("--seq", type=int, default=2048, help="--plans: tokens of the micro-batch")
    args = parser.parse_args()
    pin_threads(1)
    values = [int(v) for v in args.layers.split(",")]
    if args.plans:
        print_plans(args.plans, args.seq, values)
        return 0
    arms: dict[str, dict] = {}
    for batching in args.batching.split(","):
        tag = "" if batching == "bucketed" else f", {batching}"
        common = {"token_budget": args.token_budget, "batching": batching}
        arms.update({f"checkpoint_layers={v}{tag}": {"gradient_checkpointing": True, "checkpoint_layers": v,
                                                     **common} for v in values})
        arms[f"no checkpointing{tag}"] = {"gradient_checkpointing": False, **common}
    folder = Path(tempfile.mkdtemp(prefix="checkpoint-layers-"))
    cfg = bench_run_config(args.docs, "fp32", folder)
    rows = []
    for r in range(args.rounds):
        for name in round_order(list(arms), r):
            LORA_CONFIGS[name] = arms[name]
            row = run_lora(name, cfg, folder)
            rows.append({**row, "round": r})
            print(f"round {r} {name}: {row['real_tokens_per_s']:.0f} tok/s, "
                  f"{row['peak_bytes'] / MiB:.1f} MiB", flush=True)
    speed = {(x["run"], x["round"]): x["real_tokens_per_s"] for x in rows}
    every = next(iter(arms))
    print(f"\n{args.docs} documents, token_budget {args.token_budget}, fp32, {args.rounds} rounds "
          f"({args.batching})\n"
          "| configuration | peak MiB (tracker) | plan vs peak | real tok/s per round | median "
          f"| / {every}, per round |\n|---|---|---|---|---|---|")
    for name in arms:
        mine = [x for x in rows if x["run"] == name]
        ratios = [speed[name, r] / speed[every, r] for r in range(args.rounds)]
        plan = mine[0]["predicted_vs_measured"]
        per_round = ", ".join(f"{x['real_tokens_per_s']:.0f}" for x in mine)
        print(f"| {name} | {mine[0]['peak_bytes'] / MiB:.1f} | "
              f"{'n/a' if plan is None else f'{plan:+.3%}'} | {per_round} | "
              f"{statistics.median(x['real_tokens_per_s'] for x in mine):.0f} | "
              f"{', '.join(f'{q:.2f}x' for q in ratios)} |")
    if args.json:
        write_results(args.json, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
