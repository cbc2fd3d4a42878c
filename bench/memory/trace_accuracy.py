"""Trace accuracy: fake-tensor trace vs a real CPU run measured by the tracker, plus predictions.

Run: ``PYTHONPATH=. .venv/bin/python bench/memory/trace_accuracy.py`` (CPU only, about 5 minutes on 2 cores).
Prints a Markdown report and writes it to bench/results/trace_accuracy.md. "measured" figures
come from real CPU tensors counted by StorageTracker (source: tracker); "predicted" figures come
from the fake-tensor trace (+ CUDA overheads where stated) or the closed-form estimate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.trace import trace_text_step, trace_unet_step

COMMAND = "PYTHONPATH=. .venv/bin/python bench/memory/trace_accuracy.py"
MIB = 2**20
GIB = 2**30
TEXT = {
    "tiny Llama (4 layers, h=256, GQA)": LlamaConfig(
        vocab_size=4000, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096),
    "tiny Qwen2 (3 layers, h=256, tied)": Qwen2Config(
        vocab_size=3000, hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=2, tie_word_embeddings=True),
    "tiny GPT-2 (2 layers, h=256, dropout 0.1)": GPT2Config(
        vocab_size=2000, n_embd=256, n_layer=2, n_head=4, n_positions=2048, bos_token_id=0, eos_token_id=0),
}
UNET = {
    "_class_name": "UNet2DConditionModel", "block_out_channels": [32, 64], "layers_per_block": 1,
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
    "cross_attention_dim": 64, "attention_head_dim": 8, "norm_num_groups": 8,
}


def _row(name: str, shape: str, fake, real) -> str:
    err = fake.traced_peak_bytes / real.traced_peak_bytes - 1
    ok = "yes" if abs(err) <= 0.03 else "NO"
    return (f"| {name} | {shape} | {fake.traced_peak_bytes / MIB:.2f} | {real.traced_peak_bytes / MIB:.2f} "
            f"| {err:+.2%} | {ok} |")


def accuracy_table() -> list[str]:
    lines = ["## Trace (predicted) vs real CPU step (measured, source: tracker), float32, batch 2, LoRA r16",
             "", "| model | shape | trace MiB | real MiB | error | within 3% |", "|---|---|---|---|---|---|"]
    for name, cfg in TEXT.items():
        for seq in (128, 256, 512):
            for attn in ("sdpa", "eager"):
                kw = dict(batch_size=2, seq_len=seq, attn_implementation=attn, dtype="float32", device="cpu")
                fake = trace_text_step(cfg, **kw)
                real = trace_text_step(cfg, fake=False, warm_steps=1, **kw)
                lines.append(_row(name, f"seq {seq}, {attn}", fake, real))
    for res in (64, 128, 192):
        kw = dict(batch_size=2, resolution=res, dtype="float32", device="cpu", text_seq_len=16)
        fake, real = trace_unet_step(UNET, **kw), trace_unet_step(UNET, fake=False, warm_steps=1, **kw)
        lines.append(_row("tiny UNet2DConditionModel", f"{res} px", fake, real))
    return lines


def llama2_table() -> list[str]:
    lines = ["## Llama-2-7B, LoRA r16 (all linear), batch 1, fp16 weights: predicted peak (GiB, trace + CUDA "
             "overheads; closed-form estimate in brackets)", "",
             "| seq | eager | sdpa | eager + grad ckpt | sdpa + grad ckpt |", "|---|---|---|---|---|"]
    for seq in (512, 1024, 2048):
        cells = []
        for gc in (False, True):
            for attn in ("eager", "sdpa"):
                kw = dict(batch_size=1, seq_len=seq, attn_implementation=attn, gradient_checkpointing=gc,
                          dtype="float16")
                t, e = trace_text_step("llama-2-7b", **kw), estimate_text_step("llama-2-7b", **kw)
                cells.append(f"{t.peak_bytes / GIB:.2f} ({e.peak_bytes / GIB:.2f})")
        lines.append(f"| {seq} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    return lines


def timing() -> list[str]:
    t0 = time.perf_counter()
    res = trace_text_step("llama-3.1-8b", batch_size=1, seq_len=2048)
    wall = time.perf_counter() - t0
    return ["## Time to trace Llama-3.1-8B, LoRA r16 all-linear, seq 2048, batch 1, bf16, sdpa", "",
            f"- wall time: {wall:.1f} s (build on meta + LoRA + fake step; target < 60 s): "
            f"{'met' if wall < 60 else 'NOT met'}",
            f"- predicted peak: {res.peak_bytes / GIB:.2f} GiB "
            f"(trace alone {res.traced_peak_bytes / GIB:.2f} GiB; "
            f"overheads {', '.join(f'{k} {v / MIB:.1f} MiB' for k, v in res.cuda_overheads.items())})",
            "- breakdown (GiB): " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in res.breakdown.items())]


QUANT_MODELS = {
    "tiny Llama": TEXT["tiny Llama (4 layers, h=256, GQA)"],
    "tiny Qwen2": TEXT["tiny Qwen2 (3 layers, h=256, tied)"],
    "tiny Mistral (3 layers, h=256, GQA)": MistralConfig(
        vocab_size=3200, hidden_size=256, intermediate_size=640, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=4, sliding_window=None, max_position_embeddings=4096),
}
LLAMA_FACTORY_GB = {"none": 16, "int8": 10, "nf4": 6}  # published 7B rows: 16-bit LoRA, 8-bit, 4-bit


def quantized_accuracy_table() -> list[str]:
    """Fake trace vs the engine's own bitsandbytes model (transformers' BitsAndBytesConfig) on CPU."""
    from bench.memory.quant_measure import engine_step_peak

    lines = ["## Quantized base: trace (predicted) vs the engine's bitsandbytes model on CPU (measured, "
             "source: tracker), float32 compute, batch 2 x 256 tokens, LoRA r16 all-linear, AdamW", "",
             "| model | quantization | grad ckpt | trace MiB | real MiB | error | within 3% |",
             "|---|---|---|---|---|---|---|"]
    for name, cfg in QUANT_MODELS.items():
        for quantization in ("nf4", "int8"):
            for gc in (False, True):
                fake = trace_text_step(cfg, batch_size=2, seq_len=256, dtype="float32", device="cpu",
                                       quantization=quantization, gradient_checkpointing=gc)
                real = engine_step_peak(cfg, quantization=quantization, batch_size=2, seq_len=256,
                                        gradient_checkpointing=gc)
                err = fake.traced_peak_bytes / real - 1
                lines.append(f"| {name} | {quantization} | {'on' if gc else 'off'} | "
                             f"{fake.traced_peak_bytes / MIB:.2f} | {real / MIB:.2f} | {err:+.3%} | "
                             f"{'yes' if abs(err) <= 0.03 else 'NO'} |")
    return lines


def quantized_8b_target() -> list[str]:
    """Llama-3.1-8B nf4, 2,048 tokens, batch 1, checkpointing on, planned for CUDA (target 7 GiB)."""
    lines = ["## Llama-3.1-8B nf4 (double quant), 2,048 tokens, batch 1, gradient checkpointing, bf16 "
             "compute, sdpa, planned for CUDA (target: at most 7 GiB, source: predicted)", "",
             "| LoRA | loss | optimizer | predicted peak GiB | frozen GiB | temporaries GiB | target |",
             "|---|---|---|---|---|---|---|"]
    for rank, chunk, opt in ((8, 0, "adamw"), (16, 0, "adamw"), (8, 1024, "adamw"), (8, 512, "adamw8bit"),
                             (8, 256, "adamw8bit")):
        t = trace_text_step("llama-3.1-8b", batch_size=1, seq_len=2048, gradient_checkpointing=True,
                            quantization="nf4", lora_rank=rank, loss_chunk=chunk, optimizer=opt)
        gib = t.peak_bytes / GIB
        loss = f"loss_chunk={chunk}" if chunk else "full logits"
        lines.append(f"| r{rank} all-linear | {loss} | {opt} | {gib:.2f} | "
                     f"{t.breakdown['frozen_weights'] / GIB:.2f} | {t.breakdown['temporaries'] / GIB:.2f} | "
                     f"{'met' if gib <= 7 else 'NOT met'} |")
    return lines


def quantized_7b_8b_table() -> list[str]:
    """bf16 / int8 / nf4 for Llama-2-7B and Llama-3.1-8B at 512 / 1,024 / 2,048 tokens."""
    lines = ["## Predicted peak (GiB, trace + CUDA overheads), LoRA r8 all-linear, batch 1, gradient "
             "checkpointing, bf16 compute, sdpa, AdamW; LLaMA-Factory's published 7B figures alongside", "",
             "| model | tokens | bf16 (LoRA) | int8 | nf4 |", "|---|---|---|---|---|"]
    for model in ("llama-2-7b", "llama-3.1-8b"):
        for seq in (512, 1024, 2048):
            cells = []
            for quantization in ("none", "int8", "nf4"):
                t = trace_text_step(model, batch_size=1, seq_len=seq, gradient_checkpointing=True,
                                    lora_rank=8, quantization=quantization)
                cells.append(f"{t.peak_bytes / GIB:.2f}")
            lines.append(f"| {model} | {seq} | " + " | ".join(cells) + " |")
    lines.append(f"| LLaMA-Factory, 7B (published, GB) | - | {LLAMA_FACTORY_GB['none']} | "
                 f"{LLAMA_FACTORY_GB['int8']} | {LLAMA_FACTORY_GB['nf4']} |")
    return lines


def kbit_prepare_cost() -> list[str]:
    """peft's prepare_model_for_kbit_training (upcasts to fp32) vs the engine's preparation."""
    from bench.memory.quant_measure import engine_step_peak
    from lora_gui.memory.predict.model_configs import load_model_config

    cfg = QUANT_MODELS["tiny Llama"]
    kw = dict(quantization="nf4", batch_size=2, seq_len=256, gradient_checkpointing=True,
              dtype=torch.bfloat16)
    ours, peft = engine_step_peak(cfg, **kw), engine_step_peak(cfg, peft_prepare=True, **kw)
    big = load_model_config("llama-3.1-8b")
    upcast = 2 * (2 * big.vocab_size * big.hidden_size + (2 * big.num_hidden_layers + 1) * big.hidden_size)
    return ["## peft prepare_model_for_kbit_training vs lora_gui's preparation (nf4, bf16 compute)", "",
            f"- tiny Llama, CPU, batch 2 x 256, grad ckpt (measured, source: tracker): lora_gui "
            f"{ours / MIB:.2f} MiB, with peft's helper {peft / MIB:.2f} MiB ({peft / ours - 1:+.1%})",
            f"- Llama-3.1-8B (computed from its config): the helper's float32 upcast of embeddings, "
            f"output head and norms adds {upcast / GIB:.2f} GiB of frozen weights; lora_gui keeps them "
            "in bf16 and adds no input-grad hook (non-reentrant checkpointing needs none)"]


def main() -> int:
    quantized = "--quantized" in sys.argv  # only the quantization sections
    out = ["# Trace accuracy", "", f"Command: `{COMMAND}{' --quantized' if quantized else ''}`", ""]
    parts = [accuracy_table, llama2_table, timing, quantized_accuracy_table, quantized_8b_target,
             kbit_prepare_cost, quantized_7b_8b_table]
    if quantized:
        parts = parts[3:]
    print("\n".join(out), flush=True)
    for part in parts:
        lines = part() + [""]
        print("\n".join(lines), flush=True)  # each section as soon as it is measured
        out += lines
    name = "trace_accuracy_quantized.md" if quantized else "trace_accuracy.md"
    path = Path(__file__).resolve().parents[1] / "results" / name
    path.write_text("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
