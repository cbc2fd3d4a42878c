"""The longest trainable sequence per card: Llama-3.1-8B, nf4, LoRA r32 on all linear layers, batch 1.

For the cards of :mod:`lora_gui.cards` sold as 8 / 12 / 16 / 24 / 40 / 48 / 80 GB, ``plan --card
NAME --longest`` (the planner's :func:`lora_gui.memory.predict.longest_text.longest_text`) planned for CUDA
with each card's whole memory as torch reports it, the CUDA context counted (``--no-cuda-context``
leaves it out, as the table's title then says), the attention kernels' workspaces and the caching
allocator's reserved memory counted (what nvidia-smi shows), full attention, searched past the
model's 131,072-token context (``--beyond-context``, as the published figures are), each answer
confirmed by the fake-tensor trace (source: predicted). Next to it, Unsloth's published figures
for the same setting (Unsloth blog "Llama 3.3 + ultra long context", Dec 2024, and the table of
their README / docs). Nothing here is measured on a GPU.

Run: ``PYTHONPATH=. .venv/bin/python -m bench.longest_table [--estimate-only] [--cards 8gb,h100-80gb]``
(writes ``bench/results/longest_table.md``; each card takes one to a few traces of the 8B step).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from lora_gui.cards import card_by_name
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.memory.predict.longest_text import longest_text

RESULTS = Path(__file__).parent / "results" / "longest_table.md"
SETTINGS = {"model": "llama-3.1-8b", "quantization": "nf4", "lora_rank": 32, "lora_targets": "all-linear",
            "batch_size": 1, "attention": "full"}
# Unsloth's published max context, Llama-3.1-8B QLoRA (4-bit, all linear layers, r32, batch 1):
# (Unsloth, Hugging Face + FA2); None: out of memory. Source: unsloth.ai/blog/llama3-3 (text:
# "2,900 ... 8GB", "342,000", HF+FA2 "28,000 on a 80GB GPU", "out of memory for 8GB GPUs") and
# the table in Unsloth's README / docs with the exact figures below.
UNSLOTH = {8: (2972, None), 12: (21848, 932), 16: (40724, 2551), 24: (78475, 5789),
           40: (153977, 12264), 48: (191728, 15502), 80: (342733, 28454)}
CONTEXT = 131_072  # Llama-3.1-8B's max_position_embeddings
TARGETS = {8: 5800, 80: 342000}  # tokens: at least this many


CARDS = {"8gb": 8, "12gb": 12, "16gb": 16, "24gb": 24, "a100-40gb": 40, "l40s": 48, "h100-80gb": 80}


def row(card: str, confirm: bool, context: bool) -> dict:
    cfg = apply_overrides(RunConfig(), SETTINGS)
    start = time.perf_counter()
    result = longest_text(cfg, card_by_name(card).total_bytes, "cuda", count_cuda_context=context,
                          beyond_context=True, confirm=confirm)
    return {"card": card, "card_gb": CARDS[card], "seconds": time.perf_counter() - start, **result.to_json()}


def fmt(row_: dict) -> str:
    n = row_["longest_seq_len"]
    unsloth, hf = UNSLOTH[row_["card_gb"]]
    switches = ", ".join(f"{k}={v}" for k, v in row_["switches"].items()) or "-"
    target = TARGETS.get(row_["card_gb"])
    verdict = "" if target is None else ("; target met" if n >= target else f"; target {target:,} MISSED")
    peak_gib, host_gb = row_["counted_peak_bytes"] / 2**30, row_["host_bytes"] / 1e9
    how = "trace" if row_["confirmed_by_trace"] else "estimate"
    card = f"{row_['card']} ({row_['budget_bytes'] / 2**30:.2f} GiB)"
    return (f"| {card} | {n:,} ({how}{verdict}) | {min(n, CONTEXT):,} | {peak_gib:.2f} | "
            f"{host_gb:.1f} | {switches} | {unsloth:,} | {'OOM' if hf is None else f'{hf:,}'} | "
            f"{n / unsloth:.2f}x | {row_['traces']} / {row_['seconds']:.0f} s |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", default=",".join(CARDS), help="card names (lora_gui.cards)")
    parser.add_argument("--no-cuda-context", action="store_true",
                        help="leave the CUDA context out of each card's memory (the title says so)")
    parser.add_argument("--estimate-only", action="store_true", help="closed form only (instant)")
    parser.add_argument("--confirm-cards", default="8gb",
                        help="cards whose answer the trace confirms (the others: estimate; a trace of "
                             "the 8B with tiled MLP at 300k+ tokens runs for hours on a CPU); "
                             "'all': every card")
    args = parser.parse_args(argv)
    rows = []
    confirm = set(args.cards.split(",") if args.confirm_cards == "all" else args.confirm_cards.split(","))
    context = not args.no_cuda_context
    for card in args.cards.split(","):
        rows.append(row(card, not args.estimate_only and card in confirm, context))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    source = "rows with traces > 0 confirmed by the fake-tensor trace, the others closed-form estimate"
    counted = ("the CUDA context counted, kernel workspaces and the allocator's reserved memory counted "
               "(peak = what nvidia-smi shows)" if context else
               "the CUDA context (920 MiB) NOT counted (--no-cuda-context); kernel workspaces and the "
               "allocator's reserved memory counted (peak = max_memory_reserved)")
    lines = [f"Llama-3.1-8B, nf4, LoRA r32 all-linear, batch 1, full attention, planned for CUDA on each "
             f"card's whole memory as torch reports it, {counted}; source: predicted ({source}); "
             f"{platform.machine()}, {platform.python_version()}.", "",
             "| card (memory) | longest (memory) | usable (capped at context) | peak GiB | host GB | "
             "switches | Unsloth | HF + FA2 | vs Unsloth | traces / time |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [fmt(r) for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.cards == parser.get_default("cards") and context:
        RESULTS.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
