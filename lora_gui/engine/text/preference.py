"""A preference run's step (DPO, ORPO, SimPO on pairs), its reference log-probabilities and its
held-out reward accuracy. The text run (:mod:`lora_gui.engine.text.train`) does everything else
as for next-token runs: data split, dynamic batching under the token budget (a pair is two rows,
so a micro-batch of ``n`` pairs holds ``2n`` padded rows), checkpoints, quantization, the
long-context switches, the out-of-memory split and the memory plan (whose trace runs
:func:`lora_gui.models.preference_loss.pair_losses`, the function this step runs).

Reference log-probabilities (DPO): ``on_the_fly`` runs the model with its adapter switched off
under ``no_grad`` inside each micro-batch; ``precomputed`` runs that pass over every training pair
once before the first step and stores it in the run folder (``reference_logps.pt``, written
atomically), where a resumed run reads it back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import ConfigError
from lora_gui.data.batching import MicroBatch, Step, collate, plan_epoch
from lora_gui.data.model_inputs import attention_implementation, drop_redundant_padding_mask
from lora_gui.data.pairs import PairSample
from lora_gui.memory.runtime.guard import MicroBatchOutOfMemory
from lora_gui.models.preference_loss import (
    REF_KEY,
    PreferenceLoss,
    adapter_off,
    pair_losses,
    reference_logps,
    row_logps,
)

log = logging.getLogger(__name__)
REFERENCE_FILE = "reference_logps.pt"
EVAL_PAIRS = 8  # held-out pairs per no-grad forward


def pair_batch(model, pairs: Sequence[PairSample], mb: MicroBatch, pad_id: int, device: torch.device,
               reference: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One micro-batch of pairs as ``2n`` rows (chosen rows, then rejected rows) on ``device``;
    with ``reference`` (pairs x 2), the precomputed reference log-probabilities in row order."""
    rows = [pairs[i].chosen for i in mb.indices] + [pairs[i].rejected for i in mb.indices]
    batch = collate(rows, MicroBatch(tuple(range(len(rows))), mb.seq_len), pad_id)
    batch = {k: v.to(device) for k, v in
             drop_redundant_padding_mask(batch, attention_implementation(model)).items()}
    if reference is not None:
        idx = torch.tensor(mb.indices)
        batch[REF_KEY] = torch.cat([reference[idx, 0], reference[idx, 1]]).to(device)
    return batch


def run_pair_step(model, accelerator, data, step: Step, n_targets: int | None = None) -> dict[str, Any]:
    """Forward and backward of every micro-batch of one step of pairs (no optimizer update).

    ``n_targets``: the pairs of the whole (global) step; each pair's loss is divided by it, so
    the step's gradient is the mean over its pairs however it is cut into micro-batches.
    """
    spec: PreferenceLoss = data.preference
    n_pairs = n_targets or len(step.indices)
    sums = {"loss": 0.0, "rewards_chosen": 0.0, "rewards_rejected": 0.0, "reward_accuracy": 0.0}
    for mb in step.micro_batches:
        try:
            batch = pair_batch(model, data.train, mb, data.pad_id, accelerator.device, data.reference)
            losses, chosen, rejected = pair_losses(model, batch, spec)
            weight = 0.0 if mb.filler else 1.0  # a rank's stand-in adds nothing
            loss = losses.sum() * (weight / n_pairs)
            accelerator.backward(loss)
        except torch.OutOfMemoryError as err:
            raise MicroBatchOutOfMemory(mb, err) from None
        if not mb.filler:
            sums["loss"] += loss.item()
            sums["rewards_chosen"] += chosen.sum().item()
            sums["rewards_rejected"] += rejected.sum().item()
            sums["reward_accuracy"] += (chosen > rejected).sum().item()
        del loss, losses, chosen, rejected, batch  # none of them outlives its micro-batch
    pairs = max(1, len(step.indices))
    real = sum(len(data.train[i].chosen) + len(data.train[i].rejected) for i in step.indices)
    padded = sum(2 * len(mb.indices) * mb.seq_len for mb in step.micro_batches)
    metrics = {k: sums[k] / pairs for k in ("rewards_chosen", "rewards_rejected", "reward_accuracy")}
    metrics["reward_margin"] = metrics["rewards_chosen"] - metrics["rewards_rejected"]
    return {"loss": sums["loss"], "real_tokens": real, "padded_tokens": padded,
            "target_tokens": n_pairs, "preference": metrics}


def _eval_plan(pairs: Sequence[PairSample], per_batch: int = EVAL_PAIRS) -> list[MicroBatch]:
    plan = plan_epoch([len(p) for p in pairs], "bucketed", batch_size=len(pairs),
                      max_seq_len=max(len(p) for p in pairs), seed=0, epoch=0,
                      token_budget=per_batch * max(len(p) for p in pairs))
    return [mb for step in plan for mb in step.micro_batches]


@torch.no_grad()
def all_reference_logps(model, pairs: Sequence[PairSample], pad_id: int, device: torch.device,
                        chunk: int = 0, adapter_on: bool = False) -> torch.Tensor:
    """Reference log-probabilities of every pair: (pairs, 2) float32, CPU. The reference is the
    base (adapter off), or with ``adapter_on`` the model as it starts (a run started from an
    earlier run's adapter, before its first step)."""
    out = torch.zeros(len(pairs), 2)
    was_training = model.training
    model.eval()
    for mb in _eval_plan(pairs):
        batch = pair_batch(model, pairs, mb, pad_id, device)
        logps = (row_logps(model, batch, chunk)[0] if adapter_on else
                 reference_logps(model, batch, chunk)).float().cpu()
        n = len(mb.indices)
        out[list(mb.indices), 0], out[list(mb.indices), 1] = logps[:n], logps[n:]
    model.train(was_training)
    return out


def load_or_compute_reference(run) -> torch.Tensor:
    """The run's precomputed reference (read back on resume, else computed and stored)."""
    path = Path(run.out) / REFERENCE_FILE
    n = len(run.data.train)
    if path.is_file():
        table = torch.load(path, weights_only=True)
        if tuple(table.shape) == (n, 2):
            log.info("reference log-probabilities read from %s", path)
            return table
        log.warning("%s holds %s, not (%d, 2): computed again", path, tuple(table.shape), n)
    run.control.phase("reference")
    if run.state.step:  # a resumed run's model is no longer the starting one
        raise ConfigError(f"{path} is missing: the reference of a resumed run cannot be computed "
                          "again from a trained adapter; start the run again")
    table = all_reference_logps(run.model, run.data.train, run.data.pad_id, run.accelerator.device,
                                run.data.preference.chunk, adapter_on=bool(run.cfg.init_adapter))
    if run.dist.is_main:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.close(fd)
        torch.save(table, tmp)
        os.replace(tmp, path)
    return table


def start_adapter_dir(path: str) -> Path:
    """The adapter folder of ``init_adapter``: a run folder's adapter/ or the folder itself."""
    folder = Path(path)
    for candidate in (folder / "adapter", folder):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise ConfigError(f"init_adapter: {path} holds no adapter (no adapter_config.json in it or in "
                      "its adapter/ folder); give a finished run's folder or its adapter folder")


def check_start_adapter(cfg) -> Path:
    """The adapter folder of ``init_adapter``, refused when its rank differs from the run's."""
    import json

    folder = start_adapter_dir(cfg.init_adapter)
    try:
        saved = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(f"init_adapter: {folder / 'adapter_config.json'} is not valid JSON "
                          f"({err})") from None
    rank = saved.get("r")
    if rank is not None and rank != cfg.lora_rank:
        raise ConfigError(f"init_adapter: {folder} has rank {rank}; set lora_rank: {rank} to start from it")
    return folder


def load_start_adapter(model, cfg) -> None:
    """Loads an earlier run's adapter weights into the fresh adapter (same kind, rank, targets)."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    folder = check_start_adapter(cfg)
    result = set_peft_model_state_dict(model, load_peft_weights(str(folder), device="cpu"))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ConfigError(f"init_adapter: {folder} does not fit this run's adapter (e.g. "
                          f"{unexpected[0]}); use the same adapter, lora_targets and chat template")
    log.info("adapter started from %s", folder)


def prepare_preference(run) -> None:
    """Before the first step: the precomputed reference, when the run asks for it."""
    spec: PreferenceLoss = run.data.preference
    if spec.needs_reference and spec.ref_logps == "precomputed":
        run.data.reference = load_or_compute_reference(run)


@torch.no_grad()
def held_out_logps(model, pairs: Sequence[PairSample], pad_id: int, device: torch.device,
                   adapter: bool = True, chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed answer log-probabilities, answer tokens) of every pair, (pairs, 2) each (chosen,
    rejected), with the adapter on, or off (the base model)."""
    logps, counts = torch.zeros(len(pairs), 2), torch.zeros(len(pairs), 2)
    was_training = model.training
    model.eval()
    for mb in _eval_plan(pairs):
        batch = pair_batch(model, pairs, mb, pad_id, device)
        with adapter_off(model) if not adapter else contextlib.nullcontext():
            sums, tokens = row_logps(model, batch, chunk)
        n, idx = len(mb.indices), list(mb.indices)
        logps[idx, 0], logps[idx, 1] = sums[:n].float().cpu(), sums[n:].float().cpu()
        counts[idx, 0], counts[idx, 1] = tokens[:n].float().cpu(), tokens[n:].float().cpu()
    model.train(was_training)
    return logps, counts


def accuracies(objective: str, tuned: tuple[torch.Tensor, torch.Tensor],
               base: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """Held-out accuracies from the pairs' log-probabilities (:func:`held_out_logps`).

    reward accuracy: the objective's implicit reward is higher for the chosen answer (DPO: the
    adapter raised the chosen answer's log-probability over the base more than the rejected's,
    so the base scores 0 by definition; ORPO / SimPO: the average log-probability per answer
    token is higher). likelihood accuracy: the chosen answer has the higher average
    log-probability per token (reference-free: the base and any trainer's adapter alike).
    """
    def likelihood(logps: torch.Tensor, counts: torch.Tensor) -> float:
        avg = logps / counts.clamp(min=1)
        return float((avg[:, 0] > avg[:, 1]).float().mean())

    out = {"eval_likelihood_accuracy": likelihood(*tuned),
           "base_eval_likelihood_accuracy": likelihood(*base)}
    if objective == "dpo":
        ratio = tuned[0] - base[0]
        out["eval_reward_accuracy"] = float((ratio[:, 0] > ratio[:, 1]).float().mean())
        out["base_eval_reward_accuracy"] = 0.0
    else:
        out["eval_reward_accuracy"] = out["eval_likelihood_accuracy"]
        out["base_eval_reward_accuracy"] = out["base_eval_likelihood_accuracy"]
    return out


def preference_summary(run) -> dict[str, Any]:
    """Held-out reward accuracy of the base model and of the trained adapter (run.json)."""
    spec: PreferenceLoss = run.data.preference
    pairs = run.data.held_out_pairs
    out: dict[str, Any] = {"objective": spec.objective, "eval_pairs": len(pairs)}
    if not pairs:
        return out
    args = (run.model, pairs, run.data.pad_id, run.accelerator.device)
    try:
        base = held_out_logps(*args, adapter=False, chunk=spec.chunk)
        tuned = held_out_logps(*args, chunk=spec.chunk)
    except torch.OutOfMemoryError as err:
        log.warning("held-out reward accuracy ran out of memory: %s", err)
        return out
    return out | accuracies(spec.objective, tuned, base)
