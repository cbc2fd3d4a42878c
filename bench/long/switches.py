"""Speed cost of each long-context memory switch, side by side in one process (CPU).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.long.switches [--rounds 15] [--seq 1024]

One tiny Llama-style model built in code (untied embeddings, random weights), LoRA r16 on all
linear layers, one sequence of ``--seq`` tokens, a full training step (forward, loss, backward,
AdamW step). Each round times one step of every arm in turn, so machine drift falls on all
arms alike (the order rotates each round); the figure is the median over rounds of the ratio
of the two arms' step times in that round. Arms and their baselines:

- ``gradient_checkpointing``: checkpointing on / off.
- ``offload_checkpoints``, ``mlp_chunk``, ``embeddings_on_host``, ``loss_chunk``,
  ``attention_head_groups``: the switch on / off, both with checkpointing (the setting long
  sequences run with). The model has grouped-query attention (8 query heads, 2 key/value heads),
  so attention in 2 head groups runs one key/value head a call, as the 8B's 8 groups do. On a
  CPU that is only its cost in kernel calls and the joined gradients; on CUDA it is unmeasured.

Writes ``bench/results/long_switches.json`` ({switch: {"slowdown": ratio, "command": ...}}),
which ``plan --longest`` reads to say what each switch it picks costs. On a CPU the host copies
are memory copies in the same RAM: the offload cost measured here is a lower bound of a GPU's
(PCIe) and says nothing of the side-stream overlap.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig

from bench.common import write_results
from lora_gui.models.checkpointing import enable_checkpointing
from lora_gui.models.chunked_loss import enable_chunked_loss
from lora_gui.models.long_context import apply_long_context

RESULTS = Path(__file__).resolve().parents[1] / "results" / "long_switches.json"
COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.long.switches"
ARMS = {  # arm -> (gradient checkpointing, loss_chunk, long-context switches)
    "plain": (False, 0, {}),
    "checkpointed": (True, 0, {}),
    "offload_checkpoints": (True, 0, {"offload_checkpoints": True}),
    "mlp_chunk": (True, 0, {"mlp_chunk": 256}),
    "embeddings_on_host": (True, 0, {"embeddings_on_host": True}),
    "loss_chunk": (True, 256, {}),
    "attention_head_groups": (True, 0, {"attention_head_groups": 2}),  # one key/value head a call
}
BASELINE = {"gradient_checkpointing": ("checkpointed", "plain"),
            **{k: (k, "checkpointed") for k in ("offload_checkpoints", "mlp_chunk",
                                                "embeddings_on_host", "loss_chunk",
                                                "attention_head_groups")}}


def build(base: torch.nn.Module, checkpointing: bool, loss_chunk: int, switches: dict) -> tuple:
    model = copy.deepcopy(base)
    if loss_chunk:
        enable_chunked_loss(model, loss_chunk)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules="all-linear"))
    model.train()
    if checkpointing:
        enable_checkpointing(model)
    apply_long_context(model, **switches)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt


def step_seconds(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> float:
    start = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=False)
    base = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    arms = {name: build(base, *spec) for name, spec in ARMS.items()}
    ids = torch.randint(0, config.vocab_size, (1, args.seq))
    for model, opt in arms.values():  # warm-up: allocator, kernels, AdamW state
        step_seconds(model, opt, ids)
    times: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(args.rounds):  # each round starts at another arm: no arm always follows another
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(step_seconds(*arms[name], ids))
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"threads {torch.get_num_threads()}, seq {args.seq}, rounds {args.rounds} "
          "(shared machine: compare ratios, not seconds)")
    for name, m in medians.items():
        print(f"  {name:22s} median step {m * 1000:8.1f} ms")
    results = {}
    for switch, (arm, base_arm) in BASELINE.items():  # median of the rounds' paired ratios
        ratio = statistics.median(a / b for a, b in zip(times[arm], times[base_arm]))
        results[switch] = {"slowdown": round(ratio, 3), "baseline": base_arm, "command": COMMAND,
                           "seq_len": args.seq, "rounds": args.rounds, "device": "cpu"}
        print(f"  {switch:22s} x{ratio:.3f} vs {base_arm}")
    if not args.no_write:
        write_results(RESULTS, results, indent=2)
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
