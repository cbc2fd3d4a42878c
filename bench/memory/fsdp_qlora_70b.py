"""70B over 2 GPUs with FSDP and a 4-bit base: the plan beside what PEFT and Answer.AI published.

    python -m bench.memory.fsdp_qlora_70b            # writes bench/results/fsdp_qlora_70b.json (~4 min)
    python -m bench.memory.fsdp_qlora_70b --tables   # the docs tables from that file (no planning)

Runs ``python -m lora_gui plan --json`` (the CLI users run, source: predicted) for PEFT's
documented setting: 2 GPUs, FSDP, nf4 base with bf16 compute, sequence 2,048, micro-batch 2 per
GPU (gradient accumulation 2 changes no peak: here ``batch_size=4`` with fixed batching gives
each GPU 2 rows of 2,048 tokens), LoRA r 8 on every Linear, gradient checkpointing, with and
without parameter offload, for Llama-2-70B and Llama-3.1-70B. The model shapes are
``presets/models/llama-2-70b.json`` and ``llama-3.1-70b.json``: the public config.json values of
meta-llama/Llama-2-70b-hf and meta-llama/Llama-3.1-70B (hidden 8,192, 80 layers, 64 heads, 8
key-value heads, intermediate 28,672; vocabulary 32,000 and 128,256).

The published figures (GB as their pages write them; none says GB or GiB, nor which counter):
PEFT's "Use PEFT QLoRA and FSDP for finetuning large models on multiple GPUs" (Llama-2-70B,
2 x 24 GB): 19.6 GB per GPU and about 107 GB of CPU memory with offload, 35.6 GB per GPU
without; Answer.AI's FSDP + QLoRA announcement: 70B at 2,048 tokens, batch 2, with offload,
about 55 GB of CPU memory. The results file is stamped with the commit and planner fingerprint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.docs.meta import with_stamp
from bench.memory.fsdp_qlora_save import save_table
from bench.memory.fsdp_qlora_terms import table as terms_table

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "fsdp_qlora_70b.json"
TABLE = ROOT / "bench" / "results" / "tables" / "fsdp_qlora_70b.json"  # for the docs page
TERMS = ROOT / "bench" / "results" / "tables" / "fsdp_qlora_70b_terms.json"  # PEFT's figures, term by term
SAVE = ROOT / "bench" / "results" / "tables" / "fsdp_qlora_70b_save.json"  # ... as their checkpoint's peak
SETTINGS = {"quantization": "nf4", "precision": "bf16", "max_seq_len": 2048, "batch_size": 4,
            "batching": "fixed", "lora_rank": 8, "gradient_checkpointing": "true"}
PUBLISHED = {
    "llama-2-70b": {
        "offload": {"gpu_gb": 19.6, "host_gb": 107, "source": "PEFT docs, QLoRA + FSDP (2 x 24 GB)"},
        "no_offload": {"gpu_gb": 35.6, "host_gb": None, "source": "PEFT docs, QLoRA + FSDP (2 x 24 GB)"},
    },
    "answer.ai-70b": {
        "offload": {"gpu_gb": None, "host_gb": 55,
                    "source": "Answer.AI fsdp_qlora announcement (70B, 2,048, batch 2)"},
    },
}


PEFT_STEP = {"loss_chunk": 0, "lean_backward": "off"}  # the stock step: full float32 logits, stock backward
# their script's LoRA as well (run_peft_qlora_fsdp.sh: --lora_alpha 16 --lora_dropout 0.1): dropout
# keeps each LoRA layer's dropped-out input for the backward, in the recomputed layer
PEFT_SETUP = {**PEFT_STEP, "lora_dropout": 0.1, "lora_alpha": 16}


def plan_command(model: str, offload: bool, extra: dict | None = None) -> list[str]:
    args = [sys.executable, "-m", "lora_gui", "plan", "--world-size", "2", "--fsdp", "--device", "cuda",
            "--json", "--host-gb", "4096", "--set", f"model={model}"]  # host: planned, not checked here
    for key, value in {**SETTINGS, **(extra or {})}.items():
        args += ["--set", f"{key}={value}"]
    return args + (["--offload"] if offload else [])


def row(model: str, offload: bool, extra: dict | None = None) -> dict:
    args = plan_command(model, offload, extra)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=True)
    plan = json.loads(done.stdout)
    return {"model": model, "offload": offload, "source": "predicted",
            "step": "PEFT's LoRA" if "lora_dropout" in (extra or {}) else "stock" if extra else "lora_gui",
            "command": " ".join(["python", "-m", "lora_gui", *args[3:]]),
            "gpu_bytes": plan["nvidia_smi_bytes"], "allocated_bytes": plan["allocated_bytes"],
            "reserved_bytes": plan["reserved_bytes"],
            "host_bytes_per_machine": plan.get("host_bytes", 0),
            "breakdown": plan["breakdown"], "cuda_overheads": plan["cuda_overheads"]}


def write_table(results: dict) -> None:
    """The docs table (bench.docs renders it): each planned row beside the published figure."""
    def gb(n: float | None) -> str:  # bytes -> decimal GB, blank for none
        return f"{n / 1e9:,.1f}" if n else ""

    rows = []
    for r in results["rows"]:
        kind = "offload" if r["offload"] else "no_offload"
        published = results["published"].get(r["model"], {}).get(kind, {})
        rows.append([r["model"], r["step"], "yes" if r["offload"] else "no",
                     gb(r["gpu_bytes"]), gb(r["allocated_bytes"]), gb((published.get("gpu_gb") or 0) * 1e9),
                     gb(r["host_bytes_per_machine"]), gb((published.get("host_gb") or 0) * 1e9)])
    answer = results["published"]["answer.ai-70b"]["offload"]
    rows.append(["70B (Answer.AI)", "", "yes", "", "", "", "", gb(answer["host_gb"] * 1e9)])
    meta = {**results["meta"],
            "made_by": "bench/memory/fsdp_qlora_70b.py from bench/results/fsdp_qlora_70b.json",
            "command": "OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m bench.memory.fsdp_qlora_70b"}
    TABLE.write_text(json.dumps({
        "meta": meta, "title": "70B on 2 GPUs with FSDP and an nf4 base: planned per GPU beside PEFT's and "
                               "Answer.AI's published figures",
        "columns": ["model", "step", "offload", "planned GB per GPU (nvidia-smi)", "planned GB allocated",
                    "PEFT GB per GPU", "planned host GB per machine (shards)", "published host GB"],
        "rows": rows}, indent=1) + "\n")
    TERMS.write_text(json.dumps(terms_table(results), indent=1) + "\n")
    SAVE.write_text(json.dumps(save_table(results), indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    if "--tables" in (sys.argv[1:] if argv is None else argv):  # from the saved plans: no planning
        write_table(json.loads(OUT.read_text()))
        print(f"wrote {TABLE.relative_to(ROOT)}, {TERMS.relative_to(ROOT)} and {SAVE.relative_to(ROOT)}")
        return
    plan_all()


def plan_all() -> None:
    rows = [row(model, offload) for model in ("llama-2-70b", "llama-3.1-70b") for offload in (True, False)]
    rows += [row("llama-2-70b", offload, PEFT_STEP) for offload in (True, False)]  # as PEFT's script steps
    rows += [row("llama-2-70b", offload, PEFT_SETUP) for offload in (True, False)]  # and its LoRA dropout
    results = {**with_stamp(rows), "published": PUBLISHED}
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    write_table(results)
    for r in rows:
        print(f"{r['model']:14} {r['step']:8} offload={r['offload']!s:5}  "
              f"per GPU {r['gpu_bytes'] / 1e9:6.2f} GB "
              f"(allocated {r['allocated_bytes'] / 1e9:.2f} GB)  "
              f"host {r['host_bytes_per_machine'] / 1e9:6.2f} GB")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
