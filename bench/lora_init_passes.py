"""lora_init eva / corda / loftq on a tiny Qwen2-family model: each run's measured pass
(init_peak_bytes, tracker), its peak and the plan's error; then CorDA's pass where it is the
run's peak (64 x 1024 MLP weights, batch 1 of 16 tokens, checkpointing), LoftQ's (64 x 4096),
and EVA on the 64 x 4096 model (EVA's pass is not predicted: 0 in the predicted column); each
pass's prediction beside its measure.

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/lora_init_passes.py``
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.adapter_variants import tiny_qwen2
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.text.train import train_text

TINY = dict(max_steps=2, batch_size=4, max_seq_len=64, monitor_hz=0.0, eval_fraction=0.05,
            checkpoint_every=1000, precision="fp32", warmup_steps=0, lr=1e-2, lora_rank=4)
RUNS = {"eva": {"lora_init": "eva"}, "corda": {"lora_init": "corda"},
        "loftq (nf4)": {"lora_init": "loftq", "quantization": "nf4"}}
PEAK = {"batch_size": 1, "max_seq_len": 16, "gradient_checkpointing": True}  # the pass outgrows a step


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="lora-init-"))
    model = tiny_qwen2(root / "qwen2")
    wide = tiny_qwen2(root / "wide", intermediate_size=1024)
    wider = tiny_qwen2(root / "wider", intermediate_size=4096)
    print(f"{'run':<25}{'pass (measured)':>17}{'pass (predicted)':>18}{'run peak':>12}{'predicted':>12}"
          f"{'error':>9}")
    rows = [(name, model, over) for name, over in RUNS.items()] + [
        ("corda, pass is the peak", wide, {**PEAK, **RUNS["corda"]}),
        ("loftq, pass is the peak", wider, {**PEAK, **RUNS["loftq (nf4)"]}),
        ("eva, 64x4096 MLP", wider, {**PEAK, **RUNS["eva"]})]
    for name, path, over in rows:
        cfg = apply_overrides(RunConfig(), {**TINY, "model": str(path), **over})
        s = train_text(cfg, root / name.replace(" ", "_"), progress=False)
        print(f"{name:<25}{s['init_peak_bytes']:>17,}{s['prediction'].get('init_peak_bytes', 0):>18,}"
              f"{s['peak_bytes']:>12,}"
              f"{s['prediction']['peak_bytes']:>12,}{s['memory_report']['predicted_vs_measured']:>+9.2%}")


if __name__ == "__main__":
    main()
