"""The TRL peer bench on a lent GPU: lora_gui against TRL's SFTTrainer on the same card, model,
documents and adapter (``python -m bench.gpu.check --sections peers``; bench/peers/trl_sft.py is the
same bench on a CPU, and its functions run both sides here).

Two models: the bundled 4M-parameter demo Llama (a step there is mostly kernel launches and
Python, so it shows what fewer, larger micro-batches save) and a Llama-3.2-1B-shaped model with the
demo's 4,096-token vocabulary (random bf16 weights built from the config and saved to a
temporary folder: nothing is downloaded), where a step is mostly matmuls. Both trainers train in
bf16 on the card: TRL with its bf16 autocast and the model loaded in bf16 (as lora_gui holds its
frozen weights), lora_gui with ``precision=auto``. Peaks: ``torch.cuda.max_memory_allocated``
around each trainer's training call (lora_gui: its run's own figure, the same source). Round 0
warms the card (first kernels, cuBLAS handles) and gives the peaks; the later rounds give the
speeds, each pair's order flipped every round.

TRL must be importable (bench/requirements.txt; on a lent machine its wheel is in .devsite, see
bench/gpu/device_kit.sh).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import BUILTIN_MODEL_DIR, apply_overrides
from lora_gui.presets import load_config

LLAMA_1B_SMALL_VOCAB = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                        "max_position_embeddings": 4096, "rope_theta": 500000.0}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}
CONFIGS = ("trl-mb1x8", "trl-mb1x8-gc", "trl-mb1x8-gc-packed", "trl-default")


def model_folder(shape: dict[str, Any], folder: Path, device: str) -> Path:
    """The demo model's config with ``shape`` over it, random bf16 weights (fp32 on a CPU), and
    the demo's tokenizer, saved under ``folder``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(BUILTIN_MODEL_DIR)
    for key, value in shape.items():
        setattr(config, key, value)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(Path(BUILTIN_MODEL_DIR) / name, folder / name)
    del model
    return folder


def peer_rows(model: str, model_dir: Path, docs: int, rounds: int, configs: list[str],
              folder: Path) -> list[dict[str, Any]]:
    """Every run of the bench for one model: TRL and its lora_gui peer, rounds x configurations."""
    from bench.peers import trl_sft as pt

    cuda = torch.cuda.is_available()
    base = load_config("text-demo", {"max_steps": 0, "epochs": 1, "max_seq_len": 1024,
                                     "model": str(model_dir)})
    corpus, ids = pt.bench_documents(base, docs, folder)
    cfg = apply_overrides(base, {"data": str(corpus), "eval_fraction": pt.BENCH_EVAL_FRACTION,
                                 "precision": "auto", "monitor_hz": 0.0, "checkpoint_every": 1_000_000})
    rows: list[dict[str, Any]] = []
    for round_index in range(rounds):
        for name, trl_first in pt.pair_order(round_index, configs):
            pair = [lambda n=name, r=round_index: pt.run_trl(n, ids, cfg, folder, bf16=cuda,
                                                             tracked=r == 0, model_dir=model_dir),
                    lambda n=name: pt.run_lora(pt.TRL_CONFIGS[n]["peer"], cfg, folder)]
            for run in pair if trl_first else pair[::-1]:
                row = {**run(), "round": round_index, "pair": name, "model": model}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if cuda:
                    torch.cuda.empty_cache()
    return rows


def check_peers(smoke: bool = False, docs: int = 192, rounds: int = 3,
                configs: tuple[str, ...] = CONFIGS) -> list[dict[str, Any]]:
    """The gpu_check section: rows of both models (smoke: a tiny model, a few documents, on a CPU)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = Path(tempfile.mkdtemp(prefix="gpu-peers-"))
    try:
        from bench.gpu.peers_tuned import tuned_rows  # Unsloth and TRL tuned at the shapes

        if smoke:
            tiny = model_folder(TINY, folder / "tiny", device)
            return peer_rows("tiny", tiny, 8, 2, ["trl-mb1x8"], folder) + tuned_rows(folder, smoke=True)
        rows = peer_rows("demo-4m", Path(BUILTIN_MODEL_DIR), docs, rounds, list(configs), folder)
        big = model_folder(LLAMA_1B_SMALL_VOCAB, folder / "llama-1b", device)
        return (rows + peer_rows("llama-1b-shaped", big, docs, rounds, list(configs), folder)
                + tuned_rows(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The peers table per model (bench.peers.trl_sft's own table), for gpu_check.md."""
    import contextlib
    import io

    from bench.common import markdown_table
    from bench.gpu.peers_tuned import markdown as tuned_markdown
    from bench.peers import trl_sft as pt

    tuned = [r for r in rows if "length" in r]  # bench/gpu/peers_tuned.py's rows
    rows = [r for r in rows if "length" not in r]
    precisions = ", ".join(sorted({r["precision"] for r in rows}))
    out = [f"## TRL's SFTTrainer vs lora_gui on this device ({precisions}; peaks: "
           f"{rows[0]['memory_source']}; speeds from rounds 2+, round 1 warms up)", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            pt.print_table([r for r in rows if r["model"] == model])
        out += [f"### {model}", *text.getvalue().strip().splitlines(), ""]
    plans = [r for r in rows if r.get("trainer") == "lora_gui" and r.get("predicted_vs_measured") is not None]
    if plans:  # the engine's own run (autocast on a GPU) against the plan it made before it started
        table = markdown_table(["model", "run", "round", "peak MiB", "plan vs measured"],
                               [[r["model"], r["run"], r["round"], f"{r['peak_bytes'] / 2**20:,.1f}",
                                 f"{r['predicted_vs_measured']:+.2%}"] for r in plans if r.get("peak_bytes")])
        out += ["### lora_gui runs: plan against measured peak (never below 0)", "", *table.splitlines()]
        out.append("")
    return out + tuned_markdown(tuned)
