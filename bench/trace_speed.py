"""The time of one fake-tensor trace of a long-context table row, and a digest of every figure it predicts.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m bench.trace_speed   # the 8gb row, 9,856 tokens

Run it in two checkouts, alternating the order each round on one core, to compare trace speed:
the digest (sha256 of the peak, breakdown, overheads and allocator replay) must be the same in
both, or the change moved a predicted byte. Prints one JSON line (source: predicted; times:
wall and CPU seconds of the trace alone, imports excluded).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

from bench.longest_table import SETTINGS
from bench.longest_trace_at import SWITCHES
from lora_gui.cards import card_by_name
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.memory.predict import longest_text as lt


def main(argv: list[str]) -> None:
    card = argv[0] if argv else "8gb"
    seq = int(argv[1]) if len(argv) > 1 else 9856
    switches = {**SWITCHES, "mlp_chunk": 2048 if card == "8gb" else 4096}  # the row's own tiles
    search = lt._Search(apply_overrides(RunConfig(), SETTINGS), card_by_name(card).total_bytes, "cuda", True)
    wall, cpu = time.perf_counter(), time.process_time()
    step = search.trace(switches, seq)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    figures = {"peak": step.peak_bytes, "breakdown": step.breakdown, "overheads": step.cuda_overheads,
               "replay": step.info.get("allocator_replay"), "host": step.info.get("host_bytes"),
               "allocations": step.info.get("allocations")}
    digest = hashlib.sha256(json.dumps(figures, sort_keys=True).encode()).hexdigest()[:16]
    print(json.dumps({"card": card, "seq_len": seq, "peak_bytes": step.peak_bytes, "digest": digest,
                      "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}))


if __name__ == "__main__":
    main(sys.argv[1:])
