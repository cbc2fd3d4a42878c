"""Packed rows: transformers' block mask against one causal SDPA call per document, side by side.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.packed_attention [--rounds 5]

The built-in Llama with LoRA r8 on every linear layer, fp32 on the CPU, one packed row of S tokens
holding documents of the given lengths (position ids restart at each one), loss on every token.
Per row: the forward + backward's median wall time over alternating rounds (mask first, then
by-document, the order flipped every round) and the peak of live tensor bytes during it (source
``tracker``). Both give the same loss and gradients (tests/attention/test_documents.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lora_gui.attention.documents import DOCUMENTS_ATTR
from lora_gui.config import BUILTIN_MODEL_DIR
from lora_gui.memory.runtime.tracker import MEMORY_SOURCE, StorageTracker

MiB = 2**20
ROWS = [  # the document lengths packed into each row (322: the bench corpus's mean document)
    [322] * 3 + [58],
    [322] * 6 + [116],
    [322] * 12 + [232],
    [1024] * 4,
]


def _model():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from lora_gui.attention.documents import enable_document_attention

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(BUILTIN_MODEL_DIR, attn_implementation="sdpa")
    model.config.use_cache = False
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    enable_document_attention(model)
    return model


def _set_by_document(model, on: bool) -> None:
    for module in model.modules():
        if hasattr(module, DOCUMENTS_ATTR):
            setattr(module, DOCUMENTS_ATTR, on)


def _step(model, ids: torch.Tensor, positions: torch.Tensor,
          tracked: bool) -> tuple[float, int | None, float]:
    tracker = StorageTracker()
    tracker.track(list(model.parameters()) + list(model.buffers()))
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    if tracked:
        with tracker:
            loss = model(input_ids=ids, position_ids=positions, labels=ids).loss
            loss.backward()
    else:
        loss = model(input_ids=ids, position_ids=positions, labels=ids).loss
        loss.backward()
    return time.perf_counter() - start, tracker.peak_bytes if tracked else None, float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = _model()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); peaks: source {MEMORY_SOURCE}")
    print("| row tokens | documents | block mask: s (median) | by document: s (median) | speed-up | "
          "block mask: peak MiB | by document: peak MiB | loss (mask / by document) |")
    print("|---|---|---|---|---|---|---|---|")
    for lengths in ROWS:
        ids = torch.randint(3, 4000, (1, sum(lengths)), generator=torch.Generator().manual_seed(0))
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        times: dict[bool, list[float]] = {False: [], True: []}
        peaks, losses = {}, {}
        for on in (False, True):  # warm-up and the tracked peak
            _set_by_document(model, on)
            _step(model, ids, positions, False)
            _, peaks[on], losses[on] = _step(model, ids, positions, True)
        for r in range(args.rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                _set_by_document(model, on)
                times[on].append(_step(model, ids, positions, False)[0])
        mask_s, doc_s = statistics.median(times[False]), statistics.median(times[True])
        docs = "/".join(str(n) for n in sorted(set(lengths), reverse=True))
        print(f"| {sum(lengths)} | {len(lengths)} x {docs} | "
              f"{mask_s:.3f} | {doc_s:.3f} | {mask_s / doc_s:.2f}x | {peaks[False] / MiB:.1f} | "
              f"{peaks[True] / MiB:.1f} | {losses[False]:.5f} / {losses[True]:.5f} |", flush=True)


if __name__ == "__main__":
    main()
