"""A peer on the same work: TRL's SFTTrainer vs lora_gui, side by side in one run.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.peers.trl_sft [--docs 192] [--rounds 2] [--threads 1]

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
  counted first (with ``--untracked-trl``, only in the first round: later TRL runs go without the
  tracker, as TRL's users run it, and give the speeds). lora_gui: its engine's own per-step tracker
  peak (weights, buffers and optimizer state counted first), the figure its run.json reports
  (every lora_gui CPU run pays for its tracker);
- real tokens/s: non-pad tokens trained (TRL: its own ``num_tokens`` count, the attention mask's
  sum or the padding-free row length; lora_gui: the sample lengths of every step) divided by the
  wall time of the training loop (TRL: on_train_begin -> on_train_end; lora_gui: the 'training'
  phase -> the 'saving' phase).
Each TRL configuration runs beside its lora_gui peer, the pair's order flipping every round (and
the configurations' order reversed), to cancel machine noise; the ratio of each round is the
pair's own; medians over rounds.
"""

from __future__ import annotations

import argparse
import contextlib
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

from bench.common import pin_threads, round_order, write_results
from bench.peers.tracker_cost import without_cpu_tracker
from lora_gui.config import BUILTIN_MODEL_DIR, RunConfig, apply_overrides
from lora_gui.data.text import load_documents, split_documents, tokenize_documents
from lora_gui.engine.text.train import TrainControl, train_text
from lora_gui.memory.runtime.tracker import MEMORY_SOURCE, StorageTracker
from lora_gui.presets import load_config

MiB = 2**20
# TRL configurations: its defaults (SFTConfig: 8 samples per device, gradient checkpointing on,
# max_length 1024, its fused chunked LM-head loss) and its memory switches; bf16 autocast, also a TRL
# default, is off unless --trl-bf16 (both trainers then in bf16). ``peer``: the lora_gui run with
# the same switches.
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
    # the peers with TRL's own micro-batch (one row of at most max_length = 1,024 tokens) as their
    # token budget instead of lora_gui's default (2,048): --peer trl-mb1x8-gc-packed=lora-gc-packed-1024
    "lora-1024": {"gradient_checkpointing": False, "token_budget": 1024},
    "lora-gc-1024": {"gradient_checkpointing": True, "token_budget": 1024},
    "lora-gc-packed-1024": {"gradient_checkpointing": True, "batching": "packed", "token_budget": 1024},
    # packed rows without checkpointing: TRL's micro-batch 1 x 8 trains one document a row; lora_gui
    # packs documents into rows of its token budget, each document attending to itself only
    "lora-packed": {"gradient_checkpointing": False, "batching": "packed"},
    # checkpointing only the first 2 (3 packed) of the model's 4 layers (checkpoint_layers): the
    # others keep their activations, for speed, within the memory of the day (76.6 MiB)
    "lora-gc2-1024": {"gradient_checkpointing": True, "checkpoint_layers": 2, "token_budget": 1024},
    "lora-gc3-packed-1024": {"gradient_checkpointing": True, "checkpoint_layers": 3, "batching": "packed",
                             "token_budget": 1024},
    # packed at TRL's micro-batch, checkpointing the first 2 layers (70.7 MiB, under the 76.6 above)
    "lora-gc2-packed-1024": {"gradient_checkpointing": True, "checkpoint_layers": 2, "batching": "packed",
                             "token_budget": 1024},
    # the speed switches off, to measure each on / off (not paired with a TRL configuration)
    "lora-unfused": {"gradient_checkpointing": False, "lora_fused": False},
    "lora-gc-unfused": {"gradient_checkpointing": True, "lora_fused": False},
}
BENCH_EVAL_FRACTION = 0.0  # lora_gui still holds out one document (its eval loss); TRL skips it too
BARE_SUFFIX = "-no-cpu-tracker"  # --diagnose: the lora_gui peer without its CPU tracker
TARGET_PEAK, TARGET_SPEED = 0.7, 1.5  # lora_gui at most 0.7x TRL's peak, at least 1.5x its tokens/s


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


def bench_run_config(docs: int, precision: str, folder: Path, max_seq_len: int = 1024) -> RunConfig:
    """lora_gui's run on the bench's work: the text demo's settings, one epoch of ``docs``
    documents written to ``folder``, no monitor, no checkpoint on the way (for the benches that
    time lora_gui's engine alone against itself)."""
    base = load_config("text-demo", {"max_steps": 0, "epochs": 1, "max_seq_len": max_seq_len})
    corpus, _ = bench_documents(base, docs, folder)
    return apply_overrides(base, {"data": str(corpus), "eval_fraction": BENCH_EVAL_FRACTION,
                                  "precision": precision, "monitor_hz": 0.0,
                                  "checkpoint_every": 1_000_000})


def json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


class LoopClock:
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


def tracked_train(trainer: Any, tracked: bool) -> tuple[Any, int | None, str]:
    """``trainer.train()`` and its peak bytes with their source. On a CPU: under one StorageTracker
    (the model's weights and buffers counted first), or untracked, as TRL's users run it (peak
    None). On a GPU: the allocator's peak (it costs nothing, so every run has one)."""
    device = next(trainer.model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = trainer.train()
        return result, torch.cuda.max_memory_allocated(device), "cuda_allocator"
    tracker = StorageTracker()
    tracker.track(list(trainer.model.parameters()) + list(trainer.model.buffers()))
    with tracker if tracked else contextlib.nullcontext():
        result = trainer.train()
    return result, tracker.peak_bytes if tracked else None, MEMORY_SOURCE


def speed_rounds(rows: list[dict[str, Any]]) -> set[int]:
    """Rounds whose speeds count: all, or with untracked TRL runs only the rounds that have them
    (the first round's tracked TRL run gives the peak)."""
    untracked = {r["round"] for r in rows if r.get("tracked") is False}
    return untracked or {r["round"] for r in rows}


def pair_order(round_index: int, names: list[str]) -> list[tuple[str, bool]]:
    """(TRL configuration, TRL first?) for one round: the configurations' order reversed and each
    pair's order flipped every other round."""
    first = round_index % 2 == 0
    return [(n, first) for n in round_order(names, round_index)]


def run_trl(name: str, ids: list[list[int]], cfg: RunConfig, folder: Path,
            bf16: bool = False, tracked: bool = True,
            model_dir: str | Path = BUILTIN_MODEL_DIR) -> dict[str, Any]:
    """One TRL SFTTrainer epoch; peak by the tracker around trainer.train() (none when
    ``tracked`` is False: the speed TRL's users get, who run no tracker). On a GPU (when one is
    present, as lora_gui picks it) TRL trains there; with ``bf16`` its model is loaded in bf16 as
    well as autocast, as lora_gui's bf16 runs hold their frozen weights."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    torch.manual_seed(cfg.seed)
    cuda = torch.cuda.is_available()
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16 if bf16 and cuda else torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    args = SFTConfig(output_dir=str(folder / name), use_cpu=not cuda, num_train_epochs=1,
                     max_length=cfg.max_seq_len, learning_rate=cfg.lr, report_to=[],
                     save_strategy="no", seed=cfg.seed, disable_tqdm=True, bf16=bf16,
                     **TRL_CONFIGS[name]["overrides"])
    clock = LoopClock()
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": ids}),
                         processing_class=tokenizer, peft_config=lora, callbacks=[clock.callback])
    result, peak, source = tracked_train(trainer, tracked)
    seconds = clock.end - clock.start
    real = clock.tokens
    return {"run": name, "trainer": "trl", "steps": trainer.state.global_step, "tracked": tracked,
            "precision": "bf16" if args.bf16 else "fp32", "peak_bytes": peak,
            "real_tokens": real, "seconds": seconds, "real_tokens_per_s": real / seconds,
            "train_loss": result.training_loss, "memory_source": source}


def run_lora(name: str, cfg: RunConfig, folder: Path, profile: Any = None,
             bare: bool = False) -> dict[str, Any]:
    """One lora_gui epoch through its real engine; its own tracker peak. ``profile``: a
    :class:`bench.peers.step_profile.StepProfile` started and stopped with the training loop.
    ``bare``: without the CPU tracker (:func:`without_cpu_tracker`; no peak)."""
    if bare:
        with without_cpu_tracker():
            row = run_lora(name, cfg, folder, profile)
        return {**row, "run": f"{name}{BARE_SUFFIX}", "trainer": "lora_gui-bare", "peak_bytes": None}
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
            "memory_source": s["memory_source"],
            # the run's own plan against its peak (on a GPU: the engine under autocast)
            "predicted_vs_measured": s.get("memory_report", {}).get("predicted_vs_measured")}


def _medians(rows: list[dict[str, Any]], trl_name: str,
             trainer: str = "lora_gui") -> tuple[dict, dict, list[float]] | None:
    """(TRL median row, its lora_gui peer's median row, the pair's speed ratio per timed round);
    ``trainer`` 'lora_gui-bare': the peer run without its CPU tracker (--diagnose)."""
    counted = speed_rounds(rows)
    pair = [r for r in rows if r["pair"] == trl_name]
    t_rows = [r for r in pair if r["trainer"] == "trl"]
    g_rows = [r for r in pair if r["trainer"] == trainer]
    if not t_rows or not g_rows:
        return None
    speed = {(r["trainer"], r["round"]): r["real_tokens_per_s"] for r in pair if r["round"] in counted}
    ratios = [speed[trainer, k] / speed["trl", k] for k in sorted(counted)
              if (trainer, k) in speed and ("trl", k) in speed]

    def med(runs: list[dict[str, Any]]) -> dict[str, Any]:
        timed = [r for r in runs if r["round"] in counted]
        return {**runs[0], "rounds": len(timed),
                "peak_bytes": statistics.median([r["peak_bytes"] for r in runs if r["peak_bytes"]] or [0]),
                "real_tokens_per_s": statistics.median(r["real_tokens_per_s"] for r in timed),
                "speeds": [round(r["real_tokens_per_s"]) for r in timed]}
    return med(t_rows), med(g_rows), ratios


def print_table(rows: list[dict[str, Any]]) -> None:
    """The side-by-side table: each TRL configuration next to lora_gui with the same switches,
    every timed round's ratio (that round's pair) and their median."""
    untracked = any(r.get("tracked") is False for r in rows)
    source = rows[0]["memory_source"] if rows else MEMORY_SOURCE
    print(f"\nTRL speeds: {'untracked (rounds 2+; peak from round 1)' if untracked else 'under the tracker'}"
          f"\n| TRL configuration | steps | real tokens | peak MiB ({source}) | real tok/s per round "
          f"| lora_gui, same switches | steps | peak MiB ({source}) | real tok/s per round "
          f"| peak ratio (<= {TARGET_PEAK}) | speed ratio per round | speed ratio, median "
          f"| >= {TARGET_SPEED}x every round? |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in TRL_CONFIGS:
        got = _medians(rows, name)
        if got is None:
            continue
        t, g, ratios = got
        peak = g["peak_bytes"] / t["peak_bytes"]
        every = bool(ratios) and min(ratios) >= TARGET_SPEED
        print(f"| {name} | {t['steps']} | {t['real_tokens']} | {t['peak_bytes'] / MiB:.1f} | "
              f"{', '.join(map(str, t['speeds']))} | {g['run']} | {g['steps']} | "
              f"{g['peak_bytes'] / MiB:.1f} | {', '.join(map(str, g['speeds']))} | "
              f"{peak:.2f}x {'met' if peak <= TARGET_PEAK else 'MISSED'} | "
              f"{', '.join(f'{x:.2f}x' for x in ratios)} | {statistics.median(ratios):.2f}x | "
              f"{'met' if every else 'MISSED'} |")
    bare = [(name, got) for name in TRL_CONFIGS if (got := _medians(rows, name, "lora_gui-bare"))]
    if bare:
        print("\nDiagnosis: the lora_gui peer without its CPU tracker (its step peaks not measured; "
              "not how users run it)\n| TRL configuration | lora_gui run | real tok/s per round "
              "| speed ratio per round | speed ratio, median |\n|---|---|---|---|---|")
        for name, (_, g, ratios) in bare:
            print(f"| {name} | {g['run']} | {', '.join(map(str, g['speeds']))} | "
                  f"{', '.join(f'{x:.2f}x' for x in ratios)} | {statistics.median(ratios):.2f}x |")


def profile_lora(names: list[str], cfg: RunConfig, folder: Path) -> None:
    """Prints the time split of one profiled lora_gui epoch per configuration (profiler overhead
    included: the fractions, not the seconds, are the figure)."""
    from bench.peers.step_profile import StepProfile, format_split, header, top_ops

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
                        help="both trainers in bf16: TRL with its default bf16 autocast, lora_gui "
                             "with precision bf16 (about 6x slower than fp32 on CPUs without "
                             "native bf16, faster on CPUs with bf16 matrix units (AMX); without "
                             "it both run fp32)")
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write every row here")
    parser.add_argument("--profile", action="store_true",
                        help="only profile one lora_gui epoch per configuration and print where "
                             "its time goes (attention, matmuls, LoRA, loss, optimizer, python)")
    parser.add_argument("--lora", default=None, help="lora_gui configurations to profile "
                        "(default: the TRL ones' peers)")
    parser.add_argument("--peer", default=None, help="trl-name=lora-name,...: another lora_gui "
                        "configuration beside a TRL one (a speed switch's on / off)")
    parser.add_argument("--diagnose", action="store_true",
                        help="with --untracked-trl: the timed rounds also run each lora_gui peer without "
                             "its CPU tracker (what the tracker costs; not how users run it)")
    parser.add_argument("--untracked-trl", action="store_true",
                        help="TRL runs without the tracker after the first round (its peak comes "
                             "from the first round); speeds and ratios from those rounds only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    pin_threads(args.threads)
    folder = args.out or Path(tempfile.mkdtemp(prefix="peer-trl-"))
    folder.mkdir(parents=True, exist_ok=True)
    base = load_config("text-demo", {"max_steps": 0, "epochs": 1, "max_seq_len": args.max_seq_len})
    corpus, ids = bench_documents(base, args.docs, folder)
    cfg = apply_overrides(base, {"data": str(corpus), "eval_fraction": BENCH_EVAL_FRACTION,
                                 # the same precision as TRL (on a GPU 'auto' is bf16, as TRL's default)
                                 "precision": "bf16" if args.trl_bf16 else "auto",
                                 "monitor_hz": 0.0, "checkpoint_every": 1_000_000})
    trl_names = [n for n in args.trl.split(",") if n]
    lora_names = list(dict.fromkeys(TRL_CONFIGS[n]["peer"] for n in trl_names))
    lora_peers: dict[str, str] = {}  # --peer trl-name=lora-name: another lora_gui run beside it
    for item in filter(None, (args.peer or "").split(",")):
        trl_name, _, lora_name = item.partition("=")
        lora_peers[trl_name] = lora_name
    if args.lora:
        lora_names = [n for n in args.lora.split(",") if n]
    if args.profile:
        return profile_lora(lora_names, cfg, folder)
    print(f"{len(ids)} documents, {sum(len(i) for i in ids)} tokens, {args.threads} thread(s), "
          f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}", flush=True)
    rows: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        tracked = not (args.untracked_trl and round_index > 0)
        for name, trl_first in pair_order(round_index, trl_names):
            peer = lora_peers.get(name, TRL_CONFIGS[name]["peer"])
            pair = [lambda n=name, t=tracked: run_trl(n, ids, cfg, folder, args.trl_bf16, t),
                    lambda p=peer: run_lora(p, cfg, folder)]
            if args.diagnose and not tracked:
                pair.append(lambda p=peer: run_lora(p, cfg, folder, bare=True))
            for run in pair if trl_first else pair[::-1]:
                rows.append({**run(), "round": round_index, "pair": name})
                print(json.dumps(rows[-1]), flush=True)
    print_table(rows)
    if args.json:
        write_results(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
