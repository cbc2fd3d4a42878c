"""A peer on the same preference work: TRL's DPOTrainer with peft vs lora_gui, side by side.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.peers.trl_dpo [--steps 40] [--rounds 2] [--threads 1]

Bench only: TRL comes from bench/requirements.txt and is never a runtime dependency.

Same work for both: the built-in Llama (assets/base-model), saved again with a plain-text chat
template ("user: ...", "assistant: ..." and the end-of-sequence token; no added tokens: TRL's
fused log-prob head cannot run through peft's trainable-token wrapper of a tied output layer),
the bundled demo pairs (assets/pairs/demo.jsonl) split by lora_gui (seed 0, 5% held out; the
training pairs that fit --max-seq-len tokens), given to TRL as conversations (prompt, chosen,
rejected) that it renders with the same template; DPO sigmoid loss, beta 0.1, reference = the
model with the adapter off; LoRA r8, alpha 16, all-linear; 8 pairs per optimizer step; the same
steps and learning rate (schedules: each trainer's default); fp32 on the CPU, the same threads.

Measured the same way for both:
- peak: live tensor-storage bytes counted by ``lora_gui.memory.runtime.tracker`` (source
  ``tracker``). TRL: one StorageTracker around ``trainer.train()``, the model's weights and buffers
  counted first (with ``--untracked-trl``, only in the first round: later TRL runs go without the
  tracker, as TRL's users run it, and give the speeds). lora_gui: its engine's own per-step
  tracker peak (run.json; every lora_gui CPU run pays for its tracker);
- pairs/s: pairs trained divided by the wall time of the training loop (TRL: on_train_begin ->
  on_train_end; lora_gui: the 'training' phase -> the 'saving' phase);
- held-out reward accuracy: lora_gui's own measure on the same held-out pairs for both adapters
  (:func:`lora_gui.engine.text.preference.held_out_logps`): the share of pairs where the adapter
  raised the chosen answer's log-probability over the base more than the rejected one's; and the
  likelihood accuracy (chosen more likely per token than rejected), with the base's beside it.
Runs alternate TRL / lora_gui inside each round (the order flips each round); medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import pin_threads, write_results
from bench.peers.trl_sft import TARGET_PEAK, LoopClock, json_lines, pair_order, speed_rounds, tracked_train
from lora_gui.config import BUILTIN_MODEL_DIR, RunConfig, apply_overrides
from lora_gui.data.pairs import load_pairs, read_pairs
from lora_gui.data.text import split_documents
from lora_gui.engine.text.preference import accuracies, held_out_logps
from lora_gui.engine.text.train import TrainControl, train_text
from lora_gui.memory.runtime.tracker import MEMORY_SOURCE
from lora_gui.models.text import load_tokenizer
from lora_gui.presets import load_config

MiB = 2**20
TARGET_SPEED = 1.2  # lora_gui at least 1.2x TRL's pairs/s
PLAIN_TEMPLATE = (  # answers inside {% generation %}: the loss on them and their end of sequence
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ 'assistant: ' }}{% generation %}"
    "{{ m['content'] + eos_token }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
TRL_CONFIGS = {  # TRL's defaults but fp32 on the CPU; its gradient checkpointing on (default) / off
    "trl-dpo": {"gradient_checkpointing": True, "peer": "lora-gc"},
    "trl-dpo-no-gc": {"gradient_checkpointing": False, "peer": "lora"},
}
LORA_CONFIGS = {"lora": {"gradient_checkpointing": False}, "lora-gc": {"gradient_checkpointing": True}}


def bench_model(folder: Path) -> Path:
    """The built-in model saved with the plain-text chat template (no tokens added)."""
    import shutil

    out = folder / "base-model"
    shutil.copytree(BUILTIN_MODEL_DIR, out, dirs_exist_ok=True)
    tokenizer = load_tokenizer(str(out))
    tokenizer.chat_template = PLAIN_TEMPLATE
    tokenizer.save_pretrained(out)
    return out


def bench_pairs(cfg: RunConfig) -> tuple[list[dict[str, Any]], list, Any]:
    """(TRL's training conversations, lora_gui's held-out PairSamples, the tokenizer): the
    training pairs lora_gui keeps (within max_seq_len), the same for both trainers."""
    tokenizer = load_tokenizer(cfg.model)
    loaded = load_pairs(cfg.data_path(), tokenizer, max_seq_len=cfg.max_seq_len,
                        eval_fraction=cfg.eval_fraction, seed=cfg.seed)
    kept = {p.where for p in loaded.train}
    train, _ = split_documents(read_pairs(cfg.data_path()), cfg.eval_fraction, cfg.seed)
    rows = [{"prompt": p.prompt, "chosen": [{"role": "assistant", "content": p.chosen}],
             "rejected": [{"role": "assistant", "content": p.rejected}]} for p in train if p.where in kept]
    return rows, loaded.held_out, tokenizer


def _accuracy(model, held_out, pad_id: int) -> dict[str, float]:
    device = torch.device("cpu")
    tuned = held_out_logps(model, held_out, pad_id, device)
    base = held_out_logps(model, held_out, pad_id, device, adapter=False)
    return accuracies("dpo", tuned, base)


def run_trl(name: str, rows: list[dict[str, Any]], held_out, cfg: RunConfig, folder: Path,
            tracked: bool = True) -> dict[str, Any]:
    """TRL DPOTrainer for cfg.max_steps steps; peak by the tracker around trainer.train() (none
    when ``tracked`` is False: the speed TRL's users get, who run no tracker)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    torch.manual_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.model)
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules="all-linear",
                      task_type="CAUSAL_LM")
    spec = TRL_CONFIGS[name]
    args = DPOConfig(output_dir=str(folder / name), use_cpu=True, max_steps=cfg.max_steps,
                     per_device_train_batch_size=cfg.batch_size, max_length=cfg.max_seq_len,
                     learning_rate=cfg.lr, beta=cfg.beta, loss_type=["sigmoid"], report_to=[],
                     save_strategy="no", seed=cfg.seed, disable_tqdm=True, bf16=False,
                     gradient_checkpointing=spec["gradient_checkpointing"], logging_steps=1)
    clock = LoopClock()
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer, peft_config=lora, callbacks=[clock.callback])
    _, peak, _source = tracked_train(trainer, tracked)
    seconds = clock.end - clock.start
    pairs = trainer.state.global_step * cfg.batch_size
    return {"run": name, "trainer": "trl", "steps": trainer.state.global_step, "tracked": tracked,
            "peak_bytes": peak, "pairs": pairs, "seconds": seconds,
            "pairs_per_s": pairs / seconds, "memory_source": MEMORY_SOURCE,
            **_accuracy(trainer.model, held_out, tokenizer.pad_token_id)}


def run_lora(name: str, cfg: RunConfig, folder: Path) -> dict[str, Any]:
    """lora_gui's engine for the same steps; its own tracker peak and held-out accuracy."""
    phases: dict[str, float] = {}

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "phase":
            phases.setdefault(event["phase"], time.perf_counter())

    s = train_text(apply_overrides(cfg, LORA_CONFIGS[name]), folder / name, overwrite=True,
                   progress=False, control=TrainControl(on_event=on_event))
    seconds = phases["saving"] - phases["training"]
    pairs = sum(r["batch_size"] for r in json_lines(folder / name / "metrics.jsonl"))
    return {"run": name, "trainer": "lora_gui", "steps": s["steps"], "peak_bytes": s["peak_bytes"],
            "pairs": pairs, "seconds": seconds, "pairs_per_s": pairs / seconds,
            "memory_source": s["memory_source"], "predicted_vs_measured":
            s["memory_report"]["predicted_vs_measured"],
            **{k: s[k] for k in ("eval_reward_accuracy", "base_eval_reward_accuracy",
                                 "eval_likelihood_accuracy", "base_eval_likelihood_accuracy")}}


def _medians(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    counted = speed_rounds(rows)
    by_run: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_run.setdefault(r["run"], []).append(r)
    out = {}
    for name, runs in by_run.items():
        timed = [r for r in runs if r["round"] in counted]
        out[name] = {**runs[0], "rounds": len(runs),
                     "peak_bytes": statistics.median(r["peak_bytes"] for r in runs if r["peak_bytes"]),
                     "pairs_per_s": statistics.median(r["pairs_per_s"] for r in timed),
                     **{k: statistics.median(r[k] for r in runs) for k in
                        ("eval_reward_accuracy", "eval_likelihood_accuracy")},
                     "speeds": [round(r["pairs_per_s"], 2) for r in timed],
                     "by_round": {r["round"]: r["pairs_per_s"] for r in timed}}
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    """Each TRL configuration beside lora_gui with the same switches (medians over rounds)."""
    med = _medians(rows)
    print("\n| TRL configuration | steps | peak MiB (tracker) | pairs/s | held-out reward acc. "
          "| lora_gui, same switches | peak MiB (tracker) | pairs/s | held-out reward acc. "
          "| peak ratio (<= 0.7) | speed ratio (>= 1.2) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, spec in TRL_CONFIGS.items():
        if name not in med or spec["peer"] not in med:
            continue
        t, g = med[name], med[spec["peer"]]
        peak, speed = g["peak_bytes"] / t["peak_bytes"], g["pairs_per_s"] / t["pairs_per_s"]
        print(f"| {name} | {t['steps']} | {t['peak_bytes'] / MiB:.0f} | {t['pairs_per_s']:.2f} | "
              f"{t['eval_reward_accuracy']:.2f} | {spec['peer']} | {g['peak_bytes'] / MiB:.0f} | "
              f"{g['pairs_per_s']:.2f} | {g['eval_reward_accuracy']:.2f} | "
              f"{peak:.2f}x {'met' if peak <= TARGET_PEAK else 'MISSED'} | "
              f"{speed:.2f}x {'met' if speed >= TARGET_SPEED else 'MISSED'} |")
    print("\npairs/s per timed round: " + "; ".join(f"{k} {v['speeds']}" for k, v in med.items()))
    for name, spec in TRL_CONFIGS.items():
        if name in med and spec["peer"] in med:
            t, g = med[name]["by_round"], med[spec["peer"]]["by_round"]
            ratios = [f"{g[r] / t[r]:.2f}x" for r in sorted(t) if r in g]
            print(f"speed ratio per round, {spec['peer']} / {name}: {', '.join(ratios)}")
    print("held-out likelihood accuracy (median; base "
          f"{rows[0]['base_eval_likelihood_accuracy']:.2f}): "
          + "; ".join(f"{k} {v['eval_likelihood_accuracy']:.2f}" for k, v in med.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps of 8 pairs")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; medians over them")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both trainers")
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--trl", default=",".join(TRL_CONFIGS), help="TRL configurations to run")
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write every row here")
    parser.add_argument("--untracked-trl", action="store_true",
                        help="TRL runs without the tracker after the first round (its peak comes "
                             "from the first round); speeds and ratios from those rounds only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    pin_threads(args.threads)
    folder = args.out or Path(tempfile.mkdtemp(prefix="peer-trl-dpo-"))
    folder.mkdir(parents=True, exist_ok=True)
    cfg = load_config("preference-demo", {"objective": "dpo", "max_steps": args.steps,
                                          "max_seq_len": args.max_seq_len,
                                          "monitor_hz": 0.0, "checkpoint_every": 1_000_000,
                                          "model": str(bench_model(folder))})
    rows, held_out, tokenizer = bench_pairs(cfg)
    print(f"{len(rows)} training pairs, {len(held_out)} held out, {args.steps} steps of "
          f"{cfg.batch_size} pairs, {args.threads} thread(s), {platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__}", flush=True)
    trl_names = [n for n in args.trl.split(",") if n]
    out: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        tracked = not (args.untracked_trl and round_index > 0)
        for name, trl_first in pair_order(round_index, trl_names):
            pair = [lambda n=name, t=tracked: run_trl(n, rows, held_out, cfg, folder, t),
                    lambda n=name: run_lora(TRL_CONFIGS[n]["peer"], cfg, folder)]
            for run in pair if trl_first else pair[::-1]:
                out.append({**run(), "round": round_index})
                print(json.dumps(out[-1]), flush=True)
    print_table(out)
    if args.json:
        write_results(args.json, {"rows": out})


if __name__ == "__main__":
    main()
