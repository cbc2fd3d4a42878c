"""A peer on the same work: TRL's SFTTrainer vs lora_gui, side by side in one run.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.peer_trl [--docs 192] [--rounds 2] [--threads 1]

Bench only: TRL comes from bench/requirements.txt and is never a runtime dependency.

Same work for both: the built-in Llama (assets/base-model), the same training documents of the
bundled fine-tune corpus (a deterministic subset of lora_gui's own train split, every k-th
document, so that one epoch fits a shared 2-core machine), tokenized once by lora_gui (BOS + text
+ EOS, at most --max-seq-len tokens) and handed to both as the same token ids; LoRA r8, alpha 16,
all-linear; 8 samples per optimizer step; one epoch; the same learning rate; CPU, the same
number of torch threads.

Measured the same way for both:
- peak: live tensor-storage bytes counted by ``lora_gui.memory.runtime.tracker`` (source ``tracker``).
  TRL: one StorageTracker around ``trainer.train()``, with the model's weights and buffers
  counted first. lora_gui: its engine's own per-step tracker peak (weights, buffers and optimizer
  state counted first), the figure its run.json reports;
- real tokens/s: non-pad tokens trained (TRL: its own ``num_tokens`` count, the attention mask's
  sum or the padding-free row length; lora_gui: the sample lengths of every step) divided by the
  wall time of the training loop (TRL: on_train_begin -> on_train_end; lora_gui: the 'training'
  phase -> the 'saving' phase).
Runs alternate TRL / lora_gui inside each round to cancel machine noise; medians over rounds.
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

from lora_gui.config import BUILTIN_MODEL_DIR, RunConfig, apply_overrides
from lora_gui.data.text import load_documents, split_documents, tokenize_documents
from lora_gui.engine.text.train import TrainControl, train_text
from lora_gui.memory.runtime.tracker import MEMORY_SOURCE, StorageTracker
from lora_gui.presets import load_config

MiB = 2**20
# TRL configurations: its defaults (SFTConfig: 8 samples per device, gradient checkpointing on,
# max_length 1024, its fused chunked LM-head loss) and its memory switches; bf16 autocast, also a TRL
# default, is off unless --trl-bf16 (see main). ``peer``: the lora_gui run with the same switches.
TRL_CONFIGS: dict[str, dict[str, Any]] = {
    "trl-default": {"overrides": {}, "peer": "lora-gc"},
    "trl-default-no-gc": {"overrides": {"gradient_checkpointing": False}, "peer": "lora"},
    "trl-mb1x8": {"overrides": {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8,
                                "gradient_checkpointing": False}, "peer": "lora"},
    "trl-mb1x8-gc": {"overrides": {"per_device_train_batch_size": 1,
                                   "gradient_accumulation_steps": 8}, "peer": "lora-gc"},
    "trl-mb1x8-gc-packed": {"overrides": {"per_device_train_batch_size": 1,
                                          "gradient_accumulation_steps": 8, "packing": True},
                            "peer": "lora-gc-packed"},
}
LORA_CONFIGS: dict[str, dict[str, Any]] = {
    "lora": {"gradient_checkpointing": False},
    "lora-gc": {"gradient_checkpointing": True},
    "lora-gc-packed": {"gradient_checkpointing": True, "batching": "packed"},
    # the speed switches off, to measure each on / off (not paired with a TRL configuration)
    "lora-unfused": {"gradient_checkpointing": False, "lora_fused": False},
    "lora-gc-unfused": {"gradient_checkpointing": True, "lora_fused": False},
}
BENCH_EVAL_FRACTION = 0.0  # lora_gui still holds out one document (its eval loss); TRL skips it too
TARGET_PEAK, TARGET_SPEED = 0.7, 1.2  # lora_gui at most 0.7x TRL's peak, at least 1.2x its tokens/s


def bench_documents(cfg: RunConfig, n_docs: int, folder: Path) -> tuple[Path, list[list[int]]]:
    """Writes every k-th document of lora_gui's train split to a .txt corpus and returns it with
    the token ids of the n_docs documents lora_gui trains from it (it holds one out for its eval
    loss, which TRL does not get either), tokenized by lora_gui for both trainers."""
    from transformers import AutoTokenizer

    train_docs, _ = split_documents(load_documents(cfg.data_path()), cfg.eval_fraction, cfg.seed)
    stride = max(1, len(train_docs) // (n_docs + 1))
    subset = train_docs[::stride][:n_docs + 1]
    path = folder / "bench-corpus.txt"
    path.write_text("\n\n".join(d.text for d in subset) + "\n", encoding="utf-8")
    trained, _ = split_documents(load_documents(path), BENCH_EVAL_FRACTION, cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    return path, [s.input_ids for s in tokenize_documents(trained, tokenizer, cfg.max_seq_len)]


def json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


class _LoopClock:
    """TRL callback: wall time of the training loop and TRL's own count of tokens trained."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        clock = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                clock.start = time.perf_counter()

            def on_train_end(self, args, state, control, **kwargs):
                clock.end = time.perf_counter()

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "num_tokens" in logs:  # TRL's running count of non-pad tokens trained
                    clock.tokens = max(clock.tokens, int(float(logs["num_tokens"])))

        self.callback = Callback()
        self.start = self.end = 0.0
        self.tokens = 0


def run_trl(name: str, ids: list[list[int]], cfg: RunConfig, folder: Path,
            bf16: bool = False) -> dict[str, Any]:
    """One TRL SFTTrainer epoch; peak by the tracker around trainer.train()."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(BUILTIN_MODEL_DIR, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    args = SFTConfig(output_dir=str(folder / name), use_cpu=True, num_train_epochs=1,
                     max_length=cfg.max_seq_len, learning_rate=cfg.lr, report_to=[],
                     save_strategy="no", seed=cfg.seed, disable_tqdm=True, bf16=bf16,
                     **TRL_CONFIGS[name]["overrides"])
    clock = _LoopClock()
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": ids}),
                         processing_class=tokenizer, peft_config=lora, callbacks=[clock.callback])
    tracker = StorageTracker()
    tracker.track(list(trainer.model.parameters()) + list(trainer.model.buffers()))
    with tracker:
        result = trainer.train()
    seconds = clock.end - clock.start
    real = clock.tokens
    return {"run": name, "trainer": "trl", "steps": trainer.state.global_step,
            "precision": "bf16" if args.bf16 else "fp32", "peak_bytes": tracker.peak_bytes,
            "real_tokens": real, "seconds": seconds, "real_tokens_per_s": real / seconds,
            "train_loss": result.training_loss, "memory_source": MEMORY_SOURCE}


def run_lora(name: str, cfg: RunConfig, folder: Path, profile: Any = None) -> dict[str, Any]:
    """One lora_gui epoch through its real engine; its own tracker peak. ``profile``: a
    :class:`bench.step_profile.StepProfile` started and stopped with the training loop."""
    phases: dict[str, float] = {}

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "phase":
            phases.setdefault(event["phase"], time.perf_counter())
            if profile is not None and event["phase"] == "training":
                profile.start()
            elif profile is not None and event["phase"] == "saving" and not profile.wall:
                profile.stop()

    run_cfg = apply_overrides(cfg, LORA_CONFIGS[name])
    s = train_text(run_cfg, folder / name, overwrite=True, progress=False,
                   control=TrainControl(on_event=on_event))
    seconds = phases["saving"] - phases["training"]
    precision = {"no": "fp32"}.get(s["precision"], s["precision"])  # accelerate's name for fp32
    losses = [r["loss"] for r in json_lines(folder / name / "metrics.jsonl")]
    return {"run": name, "trainer": "lora_gui", "steps": s["steps"], "precision": precision,
            "peak_bytes": s["peak_bytes"], "real_tokens": s["real_tokens"], "seconds": seconds,
            "real_tokens_per_s": s["real_tokens"] / seconds, "train_loss": sum(losses) / len(losses),
            "memory_source": s["memory_source"]}


def _median_rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_run: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_run.setdefault(r["run"], []).append(r)
    out = {}
    for name, runs in by_run.items():
        out[name] = {**runs[0], "rounds": len(runs),
                     "peak_bytes": statistics.median(r["peak_bytes"] for r in runs),
                     "real_tokens_per_s": statistics.median(r["real_tokens_per_s"] for r in runs),
                     "speeds": [round(r["real_tokens_per_s"]) for r in runs]}
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    """The side-by-side table: each TRL configuration next to lora_gui with the same switches."""
    med = _median_rows(rows)
    print("\n| TRL configuration | precision | steps | real tokens | peak MiB (tracker) | real tok/s "
          "| lora_gui, same switches | precision | steps | peak MiB (tracker) | real tok/s "
          "| peak ratio (<= 0.7) | speed ratio (>= 1.2) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, spec in TRL_CONFIGS.items():
        if name not in med or spec["peer"] not in med:
            continue
        t, g = med[name], med[spec["peer"]]
        peak, speed = g["peak_bytes"] / t["peak_bytes"], g["real_tokens_per_s"] / t["real_tokens_per_s"]
        print(f"| {name} | {t['precision']} | {t['steps']} | {t['real_tokens']} | "
              f"{t['peak_bytes'] / MiB:.0f} | {t['real_tokens_per_s']:.0f} | {spec['peer']} | "
              f"{g['precision']} | {g['steps']} | {g['peak_bytes'] / MiB:.0f} | "
              f"{g['real_tokens_per_s']:.0f} | {peak:.2f}x {'met' if peak <= TARGET_PEAK else 'MISSED'} | "
              f"{speed:.2f}x {'met' if speed >= TARGET_SPEED else 'MISSED'} |")
    print("\nreal tok/s per round: " + "; ".join(f"{k} {v['speeds']}" for k, v in med.items()))


def profile_lora(names: list[str], cfg: RunConfig, folder: Path) -> None:
    """Prints the time split of one profiled lora_gui epoch per configuration (profiler overhead
    included: the fractions, not the seconds, are the figure)."""
    from bench.step_profile import StepProfile, format_split, header, top_ops

    print(header())
    for name in names:
        prof = StepProfile(cfg.lora_rank)
        run_lora(name, cfg, folder, prof)
        print(format_split(name, prof.split()), flush=True)
        for group in ("other ops", "python / framework"):
            print(f"    {group}, top ops: " + ", ".join(f"{k} {v:.2f} s" for k, v in top_ops(prof, group, 8)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=192, help="training documents (one epoch)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; medians over them")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both trainers")
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--trl", default=",".join(TRL_CONFIGS), help="TRL configurations to run")
    parser.add_argument("--trl-bf16", action="store_true",
                        help="TRL with its default bf16 autocast (about 6x slower than fp32 on "
                             "CPUs without native bf16; lora_gui's precision=auto measures and "
                             "picks fp32 on such CPUs)")
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write every row here")
    parser.add_argument("--profile", action="store_true",
                        help="only profile one lora_gui epoch per configuration and print where "
                             "its time goes (attention, matmuls, LoRA, loss, optimizer, python)")
    parser.add_argument("--lora", default=None, help="lora_gui configurations (default: the TRL ones' peers)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    folder = args.out or Path(tempfile.mkdtemp(prefix="peer-trl-"))
    folder.mkdir(parents=True, exist_ok=True)
    base = load_config("text-demo", {"max_steps": 0, "epochs": 1, "max_seq_len": args.max_seq_len})
    corpus, ids = bench_documents(base, args.docs, folder)
    cfg = apply_overrides(base, {"data": str(corpus), "eval_fraction": BENCH_EVAL_FRACTION,
                                 "precision": "auto",
                                 "monitor_hz": 0.0, "checkpoint_every": 1_000_000})
    trl_names = [n for n in args.trl.split(",") if n]
    lora_names = list(dict.fromkeys(TRL_CONFIGS[n]["peer"] for n in trl_names))
    if args.lora:
        lora_names = [n for n in args.lora.split(",") if n]
    if args.profile:
        return profile_lora(lora_names, cfg, folder)
    print(f"{len(ids)} documents, {sum(len(i) for i in ids)} tokens, {args.threads} thread(s), "
          f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}", flush=True)
    rows: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        order = trl_names if round_index % 2 == 0 else trl_names[::-1]
        lora_cycle = lora_names if round_index % 2 == 0 else lora_names[::-1]
        for k, name in enumerate(order):  # TRL, lora_gui, TRL, lora_gui, ...
            rows.append({**run_trl(name, ids, cfg, folder, args.trl_bf16), "round": round_index})
            print(json.dumps(rows[-1]), flush=True)
            if k < len(lora_cycle):
                rows.append({**run_lora(lora_cycle[k], cfg, folder), "round": round_index})
                print(json.dumps(rows[-1]), flush=True)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
