"""Reserved beyond allocated, replayed both ways: separate segments vs expandable segments.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m bench.memory.allocator_replay 2048:plain 4096:long

Each argument is ``tokens:plain`` (Llama-3.1-8B nf4 r32, gradient checkpointing) or ``tokens:long``
(also the long-context switches and attention in 8 head groups). One fake-tensor trace each; its
allocations are replayed through both allocator models of lora_gui.memory.predict.allocator.
Prints allocated, reserved (separate segments), reserved (expandable, uncapped) and the pages that
hold live blocks (expandable: what a capped run needs). Source: predicted.
"""

from __future__ import annotations

import sys

from lora_gui.memory.predict import allocator
from lora_gui.memory.predict.trace import trace_text_step

LONG = dict(offload_checkpoints=True, mlp_chunk=2048, embeddings_on_host=True, optimizer="adamw8bit",
            attention_head_groups=8)


def main(argv: list[str]) -> None:
    original = allocator.replay_records
    seen: list[tuple] = []

    def both(records, **kw):  # noqa: ANN001, ANN202
        records = list(records)
        default, expandable = original(records), original(records, expandable=True)
        seen.append((default, expandable))
        return expandable

    allocator.replay_records = both
    for arg in argv or ["2048:plain", "4096:long"]:
        seq, kind = arg.split(":")
        kw = dict(batch_size=1, seq_len=int(seq), lora_rank=32, quantization="nf4",
                  gradient_checkpointing=True)
        trace_text_step("llama-3.1-8b", **kw, **(LONG if kind == "long" else {}))
        a, b = seen[-1]
        mib = 2**20
        print(f"{seq} {kind}: allocated {a.peak_allocated / mib:,.0f} MiB; reserved, separate segments "
              f"{a.peak_reserved / mib:,.0f} ({a.peak_reserved / a.peak_allocated - 1:+.2%}); expandable "
              f"uncapped {b.peak_reserved / mib:,.0f} ({b.peak_reserved / b.peak_allocated - 1:+.2%}); "
              f"pages with live blocks {b.peak_pages / mib:,.0f} "
              f"({b.peak_pages / b.peak_allocated - 1:+.2%})",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
