"""The fake-tensor trace of a long-context table row at a length of your choosing (source: predicted).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m bench.longest_trace_at l40s 195072

Llama-3.1-8B nf4 r32 batch 1 (bench.longest_table's settings) with the switches ``plan --longest``
picked for the long rows (checkpointing, offloaded checkpoints, MLP tiles of 4,096, host embeddings,
8-bit AdamW, attention in 8 head groups), traced by the planner's own search at that length on
that card, the CUDA context counted. Prints one JSON line: the counted peak against the card.
"""

from __future__ import annotations

import json
import sys
import time

from bench.longest_table import SETTINGS
from lora_gui.cards import card_by_name
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.memory.predict import longest_text as lt

SWITCHES = {"gradient_checkpointing": True, "offload_checkpoints": True, "mlp_chunk": 4096,
            "embeddings_on_host": True, "optimizer": "adamw8bit", "attention_head_groups": 8}


def main(argv: list[str]) -> None:
    card, seq = argv[0], int(argv[1])
    budget = card_by_name(card).total_bytes
    search = lt._Search(apply_overrides(RunConfig(), SETTINGS), budget, "cuda", True)
    start = time.perf_counter()
    step = search.trace(SWITCHES, seq)
    peak = search.counted(step)
    print(json.dumps({"card": card, "seq_len": seq, "counted_peak_bytes": peak, "budget_bytes": budget,
                      "fits": peak <= budget, "peak_gib": peak / 2**30,
                      "allocated_bytes": step.allocator_peak_bytes,
                      "attention_workspace_bytes": step.info.get("attention_workspace_bytes"),
                      "seconds": time.perf_counter() - start}))


if __name__ == "__main__":
    main(sys.argv[1:])
