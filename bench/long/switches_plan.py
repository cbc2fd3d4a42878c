"""Closed-form estimate vs fake-tensor trace with each long-context switch, Llama-3.1-8B.

    .venv/bin/python -m bench.long.switches_plan [--seq 4096 16384] [--mlp-chunk 1024]
    .venv/bin/python -m bench.long.switches_plan --cpu-check

``--cpu-check``: the same switches on this CPU for a small Llama (3 layers, hidden 128, untied
embeddings, fp32, 512 tokens, gradient checkpointing, chunked loss over 128): the real step
(random weights) measured by the tracker against the fake-tensor trace and the closed form.

Bundled llama-3.1-8b config, nf4 base (double quant), LoRA r32 on all linear layers, batch 1,
gradient checkpointing, chunked loss over 1,024 positions, planned for CUDA. For each switch set
prints the trace's device peak (tensor storages, CUDA context and cuBLAS workspace excluded),
the estimate's, their ratio, and the host bytes both report. Each trace takes about a minute.
"""

from __future__ import annotations

import argparse
import time
import warnings

from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.trace import trace_text_step

GB = 1e9


def cpu_check() -> None:
    """Measured (tracker, real tensors) vs predicted device peak and host bytes per switch."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=2000, hidden_size=128, intermediate_size=344, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    step = dict(batch_size=1, seq_len=512, gradient_checkpointing=True, device="cpu", dtype="float32",
                loss_chunk=128, lora_rank=8)
    sets = {"plain": {}, "offload": {"offload_checkpoints": True}, "mlp_chunk": {"mlp_chunk": 128},
            "host embeddings": {"embeddings_on_host": True}}
    print("| switches | measured MB (tracker) | trace MB (predicted) | trace / measured - 1 "
          "| estimate MB | host MB measured / predicted |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, switches in sets.items():
        real = trace_text_step(cfg, fake=False, **step, **switches)
        fake = trace_text_step(cfg, **step, **switches)
        est = estimate_text_step(cfg, **step, **switches)
        print(f"| {name} | {real.traced_peak_bytes / 1e6:.3f} | {fake.traced_peak_bytes / 1e6:.3f} "
              f"| {fake.traced_peak_bytes / real.traced_peak_bytes - 1:+.2%} "
              f"| {est.traced_peak_bytes / 1e6:.3f} "
              f"| {real.info['host_bytes'] / 1e6:.3f} / {fake.info['host_bytes'] / 1e6:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--mlp-chunk", type=int, default=1024)
    parser.add_argument("--cpu-check", action="store_true", help="measured on this CPU (small model)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", FutureWarning)
    if args.cpu_check:
        cpu_check()
        return
    chunk = args.mlp_chunk
    sets = {"plain": {}, "offload": {"offload_checkpoints": True}, "mlp_chunk": {"mlp_chunk": chunk},
            "host embeddings": {"embeddings_on_host": True},
            "all three": {"offload_checkpoints": True, "mlp_chunk": chunk, "embeddings_on_host": True}}
    print("| tokens | switches | trace GB | estimate GB | estimate / trace - 1 | host GB | trace s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for seq in args.seq:
        step = dict(batch_size=1, seq_len=seq, lora_rank=32, gradient_checkpointing=True,
                    dtype="bfloat16", device="cuda", loss_chunk=1024, quantization="nf4")
        for name, switches in sets.items():
            start = time.perf_counter()
            trace = trace_text_step("llama-3.1-8b", **step, **switches)
            seconds = time.perf_counter() - start
            est = estimate_text_step("llama-3.1-8b", **step, **switches)
            assert est.info["host_bytes"] == trace.info["host_bytes"], (name, seq)
            ratio = est.traced_peak_bytes / trace.traced_peak_bytes - 1
            print(f"| {seq:,} | {name} | {trace.traced_peak_bytes / GB:.3f} "
                  f"| {est.traced_peak_bytes / GB:.3f} | {ratio:+.2%} "
                  f"| {trace.info['host_bytes'] / GB:.3f} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
