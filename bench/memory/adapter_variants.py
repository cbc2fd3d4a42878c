"""Predicted vs measured peak of each adapter variant on a tiny Qwen2 model (CPU, tracker).

Trains 2 steps of each variant on the bundled fine-tune corpus with the bundled tokenizer and
prints the run's own run.json figures: measured peak (source: tracker), predicted peak (source:
predicted, fake-tensor trace of the variant's peft layers) and predicted / measured - 1.

    .venv/bin/python bench/memory/adapter_variants.py        # about 3 minutes on 2 cores
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from lora_gui.config import BUILTIN_MODEL_DIR, RunConfig, apply_overrides
from lora_gui.engine.text.train import train_text

TINY = dict(max_steps=2, batch_size=4, max_seq_len=64, monitor_hz=0.0, eval_fraction=0.05,
            checkpoint_every=1000, precision="fp32", warmup_steps=0, lr=1e-2, lora_rank=4)
VARIANTS = {"lora": {}, "dora": {"adapter": "dora"}, "loha": {"adapter": "loha"},
            "lokr": {"adapter": "lokr"}, "oft": {"adapter": "oft"},
            "rslora+pissa": {"rslora": True, "lora_init": "pissa"}, "lora-fa": {"lora_fa": True},
            "dora nf4": {"adapter": "dora", "quantization": "nf4"}}


def tiny_qwen2(path: Path, intermediate_size: int = 160) -> Path:
    from transformers import AutoModelForCausalLM, Qwen2Config

    vocab = json.loads((BUILTIN_MODEL_DIR / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=intermediate_size,
                         num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(BUILTIN_MODEL_DIR / name, path / name)
    return path


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="adapter-variants-"))
    model = tiny_qwen2(root / "qwen2")
    print(f"{'variant':<14}{'measured (tracker)':>20}{'predicted':>12}{'error':>9}")
    for name, overrides in VARIANTS.items():
        cfg = apply_overrides(RunConfig(), {**TINY, "model": str(model), **overrides})
        report = train_text(cfg, root / name.replace(" ", "-"), progress=False)["memory_report"]
        print(f"{name:<14}{report['peak_bytes']:>20,}{report['predicted_peak_bytes']:>12,}"
              f"{report['predicted_vs_measured']:>+9.2%}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
