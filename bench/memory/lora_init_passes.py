"""lora_init eva / corda / loftq on a tiny Qwen2-family model: each run's measured pass
(init_peak_bytes, tracker), its prediction, the run's peak and the plan's error; then CorDA's
pass where it is the run's peak (64 x 1024 MLP weights, batch 1 of 16 tokens, checkpointing),
LoftQ's (64 x 4096), EVA on the 64 x 4096 model (batch 1 of 16 tokens: below the steps), and
EVA's pass where it is the run's peak (64 x 4096, batches of 4 x 64 tokens read by the pass,
micro-batches of one 64-token row trained: a 64-token budget). Last, what EVA's prediction costs
the plan of the bundled base model on its corpus (CPU time: reading the pass's batches, tracing it).

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/memory/lora_init_passes.py``
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.memory.adapter_variants import tiny_qwen2
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.text.train import train_text

TINY = dict(max_steps=2, batch_size=4, max_seq_len=64, monitor_hz=0.0, eval_fraction=0.05,
            checkpoint_every=1000, precision="fp32", warmup_steps=0, lr=1e-2, lora_rank=4)
RUNS = {"eva": {"lora_init": "eva"}, "corda": {"lora_init": "corda"},
        "loftq (nf4)": {"lora_init": "loftq", "quantization": "nf4"}}
PEAK = {"batch_size": 1, "max_seq_len": 16, "gradient_checkpointing": True}  # the pass outgrows a step
EVA_PEAK = {"token_budget": 64, "gradient_checkpointing": True}  # the pass reads 4 x 64, steps train 1 x 64


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
        ("eva, 64x4096 MLP", wider, {**PEAK, **RUNS["eva"]}),
        ("eva, pass is the peak", wider, {**EVA_PEAK, **RUNS["eva"]})]
    for name, path, over in rows:
        cfg = apply_overrides(RunConfig(), {**TINY, "model": str(path), **over})
        s = train_text(cfg, root / name.replace(" ", "_"), progress=False)
        print(f"{name:<25}{s['init_peak_bytes']:>17,}{s['prediction'].get('init_peak_bytes', 0):>18,}"
              f"{s['peak_bytes']:>12,}"
              f"{s['prediction']['peak_bytes']:>12,}{s['memory_report']['predicted_vs_measured']:>+9.2%}")


def eva_plan_cost() -> None:
    """CPU seconds of EVA's part of the plan on the bundled base model and corpus (defaults)."""
    import time

    from lora_gui.memory.predict.eva_trace import eva_peak_bytes, plan_batches
    from lora_gui.memory.predict.run_plan import step_kwargs
    from lora_gui.memory.predict.trace_build import as_dtype
    from lora_gui.models.text import resolve_model_source

    cfg = apply_overrides(RunConfig(), {"lora_init": "eva"})
    source, kw = resolve_model_source(cfg.model), step_kwargs(cfg, "cpu")
    start = time.process_time()
    batches, _ = plan_batches(cfg, source)
    read = time.process_time()
    peak = eva_peak_bytes(source, dtype=as_dtype(kw["dtype"]), target_modules=kw["target_modules"],
                          spec=kw["adapter"], batches=batches, attn_implementation=kw["attn_implementation"],
                          loss_chunk=kw["loss_chunk"])
    print(f"bundled base model, batch {cfg.batch_size} x {cfg.max_seq_len}: EVA pass {peak:,} bytes; "
          f"CPU {read - start:.2f} s reading its batches (the plan reads the data once), "
          f"{time.process_time() - read:.2f} s tracing")


if __name__ == "__main__":
    main()
    eva_plan_cost()
