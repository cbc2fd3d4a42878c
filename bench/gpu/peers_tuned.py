"""The tuned peers on a lent GPU: Unsloth (``FastLanguageModel``, the same LoRA) and TRL's
SFTTrainer tuned (padding-free batches, Liger-Kernel, packing) against lora_gui, at the shapes of
the speed issue: a Llama-3.1-8B-shaped model in nf4 and 1B / 3B-shaped ones in bf16 (random
weights built from the config and saved to a temporary folder: nothing is downloaded), documents
of 2,048 and 8,192 tokens and a mixed-length set where packing matters. Part of
``python -m bench.gpu.check --sections peers`` (:mod:`bench.gpu.peers`).

Every row names its trainer, model, lengths, tokens/s (non-pad tokens over the training loop's
wall time), peak allocated and reserved (``torch.cuda.max_memory_*``, source cuda_allocator) and
its losses. A peer that cannot run here (no CUDA device for Unsloth or Liger; a package missing)
gives a row with ``skipped`` and the reason instead of numbers. Smoke mode (a CPU, tiny model):
TRL tuned without Liger, whose kernels need CUDA, and Unsloth's skipped row.

The device has no network: bench/gpu/device_kit.sh packs the wheels (TRL, Unsloth, unsloth_zoo,
Liger-Kernel at bench/requirements.txt's versions) into .devsite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.gpu.peers import model_folder

LLAMA_3B = {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
            "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 8192, "rope_theta": 500000.0}
LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "max_position_embeddings": 8192, "rope_theta": 500000.0}
LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 8192, "rope_theta": 500000.0}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}
# (name, shape, base weights 4-bit): the models
MODELS = (("llama-3.1-8b-nf4", LLAMA_8B, True), ("llama-1b", LLAMA_1B, False),
          ("llama-3b", LLAMA_3B, False))
LENGTHS = (2048, 8192, "mixed")  # tokens per document; mixed: 64 to 2,048, log-uniform
DOCS_TOKENS = 65_536  # tokens of documents per run (an 8,192-token run trains 8 of them)
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
# TRL's SFTTrainer tuned: padding-free batches (no pad token computed), documents packed into
# rows (bfd: best-fit decreasing, as TRL's default packing strategy), Liger-Kernel on CUDA
TRL_TUNED = {"padding_free": True, "packing": True, "per_device_train_batch_size": 1,
             "gradient_accumulation_steps": 1, "gradient_checkpointing": True}


def missing(package: str) -> str | None:
    """Why ``package`` cannot run here, or None."""
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed (bench/gpu/device_kit.sh packs it)"
    return None


def documents(length: int | str, vocab: int, seed: int = 0, total: int = DOCS_TOKENS) -> list[list[int]]:
    """Token ids of random documents: all of ``length`` tokens, or for 'mixed' lengths from 64 to
    2,048, log-uniform (most short, a few long: where padding costs most and packing helps)."""
    rng = random.Random(seed)
    docs, count = [], 0
    while count < total:
        n = length if isinstance(length, int) else int(round(64 * 32 ** rng.random()))
        docs.append([rng.randrange(3, vocab) for _ in range(n)])
        count += n
    return docs


def _trainer_row(trainer: Any, clock: Any, name: str) -> dict[str, Any]:
    """Train and measure: tokens/s over the loop, the allocator's peaks, the loss curve."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    result = trainer.train()
    seconds = clock.end - clock.start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"trainer": name, "steps": trainer.state.global_step, "seconds": seconds,
            "real_tokens": clock.tokens, "real_tokens_per_s": clock.tokens / seconds if seconds else None,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
            "memory_source": "cuda_allocator" if cuda else None,
            "train_loss": result.training_loss, "losses": losses}


def _sft_args(folder: Path, max_length: int, cuda: bool, **extra: Any) -> Any:
    from trl import SFTConfig

    return SFTConfig(output_dir=str(folder), use_cpu=not cuda, num_train_epochs=1, max_length=max_length,
                     learning_rate=1e-4, report_to=[], save_strategy="no", seed=0, disable_tqdm=True,
                     bf16=cuda, logging_steps=1, **extra)


def run_trl_tuned(model_dir: Path, docs: list[list[int]], max_length: int, folder: Path,
                  four_bit: bool) -> dict[str, Any]:
    """TRL's SFTTrainer with :data:`TRL_TUNED` (Liger-Kernel where it can run) and :data:`LORA`."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    from bench.peers.trl_sft import LoopClock

    cuda = torch.cuda.is_available()
    liger = cuda and missing("liger_kernel") is None
    load: dict[str, Any] = {"dtype": torch.bfloat16 if cuda else torch.float32}
    if four_bit:
        from transformers import BitsAndBytesConfig

        load["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                         bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(model_dir, **load)
    clock = LoopClock()
    trainer = SFTTrainer(model=model, args=_sft_args(folder / "trl-tuned", max_length, cuda,
                                                     use_liger_kernel=liger, **TRL_TUNED),
                         train_dataset=Dataset.from_dict({"input_ids": docs}),
                         processing_class=AutoTokenizer.from_pretrained(model_dir),
                         peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA), callbacks=[clock.callback])
    return {**_trainer_row(trainer, clock, "trl-tuned"), "liger": liger}


def run_unsloth(model_dir: Path, docs: list[list[int]], max_length: int, folder: Path,
                four_bit: bool) -> dict[str, Any]:
    """Unsloth's ``FastLanguageModel`` with :data:`LORA` and its own gradient checkpointing,
    trained by TRL's SFTTrainer with packing (as Unsloth's notebooks do)."""
    import unsloth  # noqa: F401  (first: it patches transformers and TRL when imported)
    from datasets import Dataset
    from trl import SFTTrainer
    from unsloth import FastLanguageModel

    from bench.peers.trl_sft import LoopClock

    model, tokenizer = FastLanguageModel.from_pretrained(str(model_dir), max_seq_length=max_length,
                                                         dtype=torch.bfloat16, load_in_4bit=four_bit)
    model = FastLanguageModel.get_peft_model(model, use_gradient_checkpointing="unsloth", random_state=0,
                                             **LORA)
    clock = LoopClock()
    trainer = SFTTrainer(model=model, args=_sft_args(folder / "unsloth", max_length, True, packing=True,
                                                     per_device_train_batch_size=1),
                         train_dataset=Dataset.from_dict({"input_ids": docs}), processing_class=tokenizer,
                         callbacks=[clock.callback])
    return _trainer_row(trainer, clock, "unsloth")


def run_lora_gui(model_dir: Path, docs: list[list[int]], max_length: int, folder: Path,
                 four_bit: bool) -> dict[str, Any]:
    """lora_gui's engine on the same documents, decoded to a .txt corpus by the model's tokenizer
    (lora_gui reads text and tokenizes it again, so its token counts differ a little from the
    peers': compare tokens/s, not token counts), with the same LoRA, packed rows of
    ``max_length`` tokens, gradient checkpointing and its plan's defaults."""
    from transformers import AutoTokenizer

    from lora_gui.config import apply_overrides
    from lora_gui.engine import train
    from lora_gui.presets import load_config

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    corpus = folder / "lora-gui-docs.txt"
    corpus.write_text("\n\n".join(tokenizer.decode(d).replace("\n\n", "\n") for d in docs) + "\n")
    cfg = apply_overrides(load_config("text-demo"), {
        "model": str(model_dir), "data": str(corpus), "max_seq_len": max_length, "epochs": 1,
        "max_steps": 0, "lora_rank": LORA["r"], "lora_alpha": float(LORA["lora_alpha"]),
        "lora_targets": ",".join(LORA["target_modules"]), "batching": "packed", "token_budget": max_length,
        "gradient_checkpointing": True, "quantization": "nf4" if four_bit else "none",
        "precision": "auto", "monitor_hz": 0.0, "eval_fraction": 0.01, "checkpoint_every": 1_000_000})
    start = time.perf_counter()
    summary = train(cfg, folder / "lora-gui", progress=False, overwrite=True)
    return {"trainer": "lora_gui", "seconds": summary.get("train_seconds"),
            "wall_seconds": time.perf_counter() - start, "real_tokens": summary.get("real_tokens"),
            "real_tokens_per_s": summary.get("real_tokens_per_s"),
            "peak_allocated_bytes": summary.get("peak_bytes"),
            "memory_source": summary.get("memory_source"), "mfu": summary.get("mfu"),
            "train_loss": summary.get("final_loss"), "speed_report": summary.get("speed_report")}


UNSLOTH_SITE_ENV = "UNSLOTH_SITE"  # the folder bench/gpu/device_kit.sh's Unsloth wheels go into
UNSLOTH_TIMEOUT_S = 1800  # one Unsloth run of DOCS_TOKENS tokens; the process is killed after it


def run_unsloth_process(model_dir: Path, docs: list[list[int]], max_length: int, folder: Path,
                        four_bit: bool) -> dict[str, Any]:
    """:func:`run_unsloth` in a process of its own with ``$UNSLOTH_SITE`` first on PYTHONPATH
    (Unsloth's pinned transformers / trl / datasets; bench/requirements-unsloth.txt)."""
    folder.mkdir(parents=True, exist_ok=True)
    docs_file = folder / "unsloth-docs.json"
    docs_file.write_text(json.dumps(docs))
    path = os.pathsep.join(p for p in (os.environ.get(UNSLOTH_SITE_ENV), os.environ.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-m", "bench.gpu.peers_tuned", str(model_dir), str(docs_file),
                          str(max_length), str(folder), str(int(four_bit))],
                         env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
                         timeout=UNSLOTH_TIMEOUT_S)  # subprocess.run kills it when the time is up
    if res.returncode != 0:
        return {"error": res.stderr[-2000:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


RUNNERS = {"lora_gui": run_lora_gui, "trl-tuned": run_trl_tuned, "unsloth": run_unsloth_process}


def why_not(trainer: str, cuda: bool) -> str | None:
    """Why ``trainer`` cannot run on this machine, or None."""
    if trainer == "unsloth":
        if not cuda:
            return "Unsloth needs a CUDA GPU"
        site = os.environ.get(UNSLOTH_SITE_ENV)
        if not site or not (Path(site) / "unsloth").is_dir():
            return (f"no Unsloth site: set {UNSLOTH_SITE_ENV} to the folder bench/gpu/device_kit.sh's "
                    "wheels go into")
        return None
    if trainer == "trl-tuned":
        return missing("trl")
    return None


def tuned_rows(folder: Path, smoke: bool = False) -> list[dict[str, Any]]:
    """Every (model, length, trainer) row; the trainers' order flips from one shape to the next."""
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    models = (("tiny", TINY, False),) if smoke else MODELS
    lengths = (128, "mixed") if smoke else LENGTHS
    rows: list[dict[str, Any]] = []
    for k, (name, shape, four_bit) in enumerate(models):
        model_dir = model_folder(shape, folder / name, device)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        for j, length in enumerate(lengths):
            max_length = length if isinstance(length, int) else 2048
            docs = documents(length, vocab, total=2048 if smoke else DOCS_TOKENS)
            order = list(RUNNERS) if (k + j) % 2 == 0 else list(RUNNERS)[::-1]
            for trainer in order:
                row = {"model": name, "length": length, "four_bit": four_bit, "trainer": trainer}
                reason = why_not(trainer, cuda)
                if reason:
                    row["skipped"] = reason
                else:
                    run = RUNNERS[trainer]
                    row |= run(model_dir, docs, max_length, folder / f"{name}-{length}", four_bit)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if cuda:
                    torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The tuned peers' table for gpu_check.md: one line per (model, length, trainer)."""
    if not rows:
        return []
    out = ["## Unsloth and TRL tuned vs lora_gui (peaks: cuda_allocator)", "",
           "| model | length | trainer | tokens/s | peak allocated MiB | peak reserved MiB | final loss "
           "| note |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def mib(key: str, r: dict = r) -> str:
            return f"{r[key] / 2**20:,.0f}" if r.get(key) else "-"

        speed = f"{r['real_tokens_per_s']:,.0f}" if r.get("real_tokens_per_s") else "-"
        loss = f"{r['train_loss']:.3f}" if isinstance(r.get("train_loss"), float) else "-"
        failed = r.get("error", "").strip().splitlines()
        note = r.get("skipped") or (f"failed: {failed[-1]}" if failed else "")
        out.append(f"| {r['model']} | {r['length']} | {r['trainer']} | {speed} "
                   f"| {mib('peak_allocated_bytes')} | {mib('peak_reserved_bytes')} | {loss} | {note} |")
    return out + [""]


if __name__ == "__main__":  # one Unsloth run (run_unsloth_process): its row as the last line
    model_dir, docs_file, max_length, folder, four_bit = sys.argv[1:6]
    row = run_unsloth(Path(model_dir), json.loads(Path(docs_file).read_text()), int(max_length), Path(folder),
                      four_bit == "1")
    print(json.dumps(row), flush=True)
