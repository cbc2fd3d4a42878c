"""The text training loop: LoRA on a causal LM with accelerate, token-weighted gradient
accumulation over variable micro-batches, per-step peak memory, atomic checkpoints, resume.
The run's data, epoch plans and a step's forward and backward are in
:mod:`lora_gui.engine.text.steps`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from peft import set_peft_model_state_dict

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.data.batching import MicroBatch, Step, collate, round_up
from lora_gui.data.pairs import PairSample
from lora_gui.data.shard import split_step, step_targets
from lora_gui.engine.core import fsdp, fsdp_loading
from lora_gui.engine.core.checkpoint import write_atomic
from lora_gui.engine.core.control import TrainControl
from lora_gui.engine.core.distributed import (
    DEBUG_SAMPLES_ENV,
    INJECT_OOM_ENV,
    STOP_FILE,
    Dist,
    check_world_size,
    combine_step_stats,
    enable_autocast,
    injected_oom,
    local_tensors,
    rank_peaks,
)
from lora_gui.engine.core.fsdp import FsdpOutOfMemoryError
from lora_gui.engine.core.loop import optimizer_step, run_loop, step_shape
from lora_gui.engine.core.optim import make_optimizer
from lora_gui.engine.core.preflight import writes_run_folder
from lora_gui.engine.core.resume import read_resume_checkpoint, sampler_state
from lora_gui.engine.core.rundir import prepare_run_dir, save_run_config
from lora_gui.engine.core.session import RunSession
from lora_gui.engine.core.setup import (
    attach_trackers,
    cosine_scheduler,
    new_accelerator,
    open_logs,
    run_device,
    start_state,
)
from lora_gui.engine.core.speed import headroom, run_peak, run_speed, step_speed
from lora_gui.engine.core.state import TrainState
from lora_gui.engine.core.summary import memory_report, run_summary
from lora_gui.engine.core.trackers import check_trackers, closing_values
from lora_gui.engine.text.inputs import check_text_inputs
from lora_gui.engine.text.preference import (
    load_start_adapter,
    preference_summary,
    prepare_preference,
    run_pair_step,
)
from lora_gui.engine.text.steps import (
    TextData,
    epoch_plan,
    evaluate,
    load_text_data,
    probe_step,
    run_step,
    steps_per_epoch,
)
from lora_gui.memory.predict.checkpoint_choice import choose_checkpoint_layers
from lora_gui.memory.predict.parallel import Parallel
from lora_gui.memory.predict.run_plan import time_before_loading
from lora_gui.memory.predict.run_predict import padding_mask_kept
from lora_gui.memory.predict.run_speed import speed_report
from lora_gui.memory.predict.trace_result import CUDA_CONTEXT_BYTES
from lora_gui.memory.runtime.cuda_context import budget_for_plan
from lora_gui.memory.runtime.guard import BatchCaps, MicroBatchOutOfMemory
from lora_gui.memory.runtime.meter import GB, PeakMeter, StepShape
from lora_gui.models import adapters
from lora_gui.models import text as text_models
from lora_gui.models.checkpointing import enable_checkpointing
from lora_gui.models.fast_kernels import apply_liger, compile_blocks
from lora_gui.models.flops import text_flops
from lora_gui.models.long_context import apply_long_context
from lora_gui.models.precision import cast_frozen, choose_precision, weights_dtype
from lora_gui.models.quant import check_resume, quant_state_tensors

__all__ = ["TextData", "TextSession", "TrainControl", "evaluate", "load_text_data", "run_step", "train_text"]

log = logging.getLogger(__name__)


def _memory_plan(cfg: RunConfig, source: str, budget: int | None, device: torch.device,
                 parallel: Parallel | None = None, lengths: list[int] | None = None,
                 added_tokens: int = 0, samples: Sequence[Any] | None = None,
                 ) -> tuple[BatchCaps, int | None, dict[str, Any] | None]:
    """Micro-batch caps per length bucket under the budget (adaptive batch, optimized modes) and
    the predicted peak of the run's largest micro-batch (source: predicted), per GPU."""
    from lora_gui.memory.predict.run import text_memory_plan  # the form calls it too

    caps = BatchCaps()
    try:
        caps.caps, _, _, prediction = text_memory_plan(cfg, source, budget, device.type, parallel, lengths,
                                                       added_tokens, samples)
        return caps, prediction["peak_bytes"], prediction
    except (ValueError, NotImplementedError, RuntimeError) as err:  # prediction is advisory
        log.warning("no memory prediction for %s: %s", cfg.model, err)
    return caps, None, None


def _save_adapter(model, out: Path) -> Path:
    """Saves the peft adapter into out/adapter atomically (temp folder, then rename)."""
    final = out / "adapter"
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".adapter-"))
    # peft names them; a frozen lora_A (LoRA-FA) is part of the adapter too
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad or ".lora_A." in n}
    model.save_pretrained(tmp, state_dict=trainable, save_embedding_layers=False)  # chat tokens: rows only
    adapters.save_as_plain_lora(model, tmp, out / adapters.INIT_FILE)  # CorDA: loads on the original base
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


@dataclass(kw_only=True)
class TextSession(RunSession):
    """A text run: the shared session plus the tokenized data and the rank layout.

    Attributes:
        fsdp: frozen weights sharded over the ranks (FSDP).
        token_budget: padded tokens per micro-batch of each rank's share (as the epoch plan's).
        frozen_bytes_by_rank: frozen weight bytes each rank holds.
        loaded_bytes_by_rank: weight bytes each rank held when loading ended, before sharding
            (under FSDP only the main process holds the base; the others a weightless skeleton).
    """

    data: TextData
    fsdp: bool = False
    token_budget: int = 2048
    frozen_bytes_by_rank: list[int] = field(default_factory=list)
    loaded_bytes_by_rank: list[int] = field(default_factory=list)
    flop_costs: Any = None  # lora_gui.models.flops.TextFlops of the model as attached
    init_peak_bytes: int | None = None  # measured peak of a lora_init pass before step 1
    fast_kernels: list[dict[str, Any]] = field(default_factory=list)  # models.fast_kernels choices


def _attach(cfg: RunConfig, base, data: TextData, out: Path, resume: bool, device: torch.device,
            dist: Dist, source: str, receives: bool = False) -> tuple[Any, int | None]:
    """The run's adapter on ``base``. A ``lora_init`` that runs a pass (PiSSA's SVD, OLoRA's QR,
    LoftQ's fit to the 4-bit error, EVA's and CorDA's read of the training data) runs here, before
    the first step, measured (its peak counts when above the steps'), and its result is saved in
    the run folder so that a resume loads it instead of running it again. ``receives``: a process
    of an FSDP run that holds no weights (only the main process loaded the base): the adapter is
    attached with peft's default init on the skeleton, and the main process's initialised adapter
    and base (a residual for PiSSA, OLoRA, CorDA) reach it by broadcast after sharding."""
    from lora_gui.memory.predict.init_trace import INIT_PASSES, measured_init
    from lora_gui.models.init_passes import BASE_CHANGING, INIT_BATCHES, init_batches, init_rows

    tokenizer = data.tokenizer if data.is_chat else None
    saved = out / adapters.INIT_FILE
    if cfg.lora_init not in INIT_PASSES:
        return text_models.attach_lora(base, cfg, tokenizer), None
    loads_saved = resume and saved.is_file()  # the same run folder on every process
    if receives:  # the same modules and shapes (checked by fill_from_main); values from the main
        model = text_models.attach_lora(base, replace(cfg, lora_init="default"), tokenizer)
        if not loads_saved:  # the main process saves what its pass made (below): every rank takes part
            dist.on_main(lambda: None)
        return model, None
    if loads_saved:
        return text_models.attach_lora(base, cfg, tokenizer, saved_init=saved), None
    init_data: dict[str, Any] = {"model_path": source}
    if cfg.lora_init == "eva":
        init_data["batches"] = init_batches(data.train, cfg.batch_size, cfg.max_seq_len, data.pad_id, device,
                                            collate, lambda idx, width: MicroBatch(idx, width))
    elif cfg.lora_init == "corda":
        init_data["rows"] = init_rows(data.train, cfg.batch_size * INIT_BATCHES, cfg.max_seq_len, device)
    model, peak, _source = measured_init(
        base, lambda: text_models.attach_lora(base, cfg, tokenizer, init_data=init_data), device,
        inputs=[t for batch in init_data.get("batches", []) for t in batch.values()])
    dist.on_main(lambda: adapters.save_init(model, saved, with_base=cfg.lora_init in BASE_CHANGING))
    return model, peak


def _prepare(accelerator: Accelerator, dist: Dist, model, optimizer, scheduler,
             from_main: bool = False) -> tuple[Any, Any, Any, bool]:
    """One process: accelerate as before. Several: LoRA weights replicated (broadcast from the
    main process), frozen weights replicated or sharded by FSDP; the scheduler stays unprepared
    (accelerate would step it once per process: the global batch is one step). ``from_main``:
    only the main process loaded the base; the others get their shards after sharding."""
    full = fsdp_loading.full_frozen(model, dist) if from_main else None
    if accelerator.distributed_type == DistributedType.FSDP:  # GPUs: accelerate's plugin, LoRA ignored
        model, optimizer = fsdp.prepare_with_accelerate(accelerator, model, optimizer)
        if from_main:
            fsdp_loading.fill_from_main(accelerator.unwrap_model(model), full, dist, accelerator.device,
                                        offload=fsdp_loading.offload_requested())
        enable_autocast(model, accelerator)
        return model, optimizer, scheduler, True
    if not dist.active:
        return (*accelerator.prepare(model, optimizer, scheduler), False)
    use_fsdp = fsdp.fsdp_requested()  # on CPU accelerate keeps MULTI_CPU: shard with fully_shard
    if not from_main:
        dist.broadcast_params(p for p in model.parameters() if p.requires_grad)
        model.to(accelerator.device)
    if use_fsdp:
        fsdp.shard_frozen(model)
    if from_main:  # LoRA weights and buffers broadcast there too
        fsdp_loading.fill_from_main(model, full, dist, accelerator.device)
    del full
    optimizer = accelerator.prepare(optimizer)
    enable_autocast(model, accelerator)
    return model, optimizer, scheduler, use_fsdp


def _setup(cfg: RunConfig, out: Path, resume: bool, overwrite: bool,
           control: TrainControl) -> TextSession:
    """Validates against the model, loads data and model, restores a checkpoint, plans memory.
    Folder decisions are the main process's, broadcast with any error to every rank."""
    check_trackers(cfg)  # a missing tracker package or login: refused before any work
    dist = Dist.from_env()
    control.phase("loading")
    source = text_models.resolve_model_source(cfg.model)
    limit = text_models.max_positions(source)
    if limit is not None and cfg.max_seq_len > limit:
        raise ConfigError(f"max_seq_len: {cfg.max_seq_len} is above the model's limit of {limit}")
    data = load_text_data(cfg, text_models.load_tokenizer(source))  # bad data: nothing written yet
    dist.on_main(lambda: prepare_run_dir(out, resume=resume, overwrite=overwrite))
    if not resume:
        dist.on_main(lambda: save_run_config(out, cfg))
    if dist.active:
        check_world_size(dist.world_size, len(data.train), cfg.batch_size)
    sampler = sampler_state(cfg, [len(s) for s in data.train])

    torch.manual_seed(cfg.seed)  # LoRA init (the same on every rank; broadcast from main anyway)
    device = run_device(dist)
    mixed = choose_precision(cfg.precision, device)  # on CPU: measured on the model below
    dtype = weights_dtype(mixed, device.type, text=True)
    time_before_loading(cfg, source, device.type)  # the plan's step timing, before the weights
    # FSDP: a lora_init that reads the weights runs on the main process, which alone loads them
    from_main = fsdp_loading.main_loads_only(dist)
    if from_main:  # FSDP: the main process loads, the others build on meta and receive shards
        base = fsdp_loading.load_on_main(
            dist, lambda layout: text_models.load_model_for(cfg, source, dtype, device, layout), device)
    else:
        base = text_models.load_model_for(cfg, source, dtype, device)
    loaded_bytes = fsdp_loading.held_bytes(base)
    kernels = [apply_liger(base, cfg.liger_kernels, device.type, bool(cfg.resolved_loss_chunk()))]
    rows = base.get_input_embeddings().weight.shape[0]  # chat-template tokens grow it (fit_embeddings)
    added_rows = max(0, len(data.tokenizer) - rows) if data.is_chat else 0
    model, init_peak = _attach(cfg, base, data, out, resume, device, dist, source,
                               receives=from_main and not dist.is_main)
    if from_main and not dist.is_main:  # LoRA weights allocated; their values come from main
        fsdp_loading.materialize_trainable(model, device)
    ckpt = dist.on_main(lambda: read_resume_checkpoint(out, sampler, model)) if resume else None
    if ckpt is not None:  # a quantized base or 8-bit optimizer state cannot change mid-run
        check_resume(ckpt["trainer"], cfg, cfg.resolved_optimizer(device.type), out)
    if ckpt is None and cfg.init_adapter:  # an earlier run's adapter (e.g. sft before dpo)
        load_start_adapter(model, cfg)
    if ckpt is not None:  # a resumed run keeps the precision it started with
        set_peft_model_state_dict(model, ckpt["adapter"])
        mixed = ckpt["trainer"]["precision"]
    elif device.type == "cpu" and cfg.precision == "auto":
        mixed = dist.on_main(lambda: choose_precision("auto", device, probe_step(model, data)))
    if device.type == "cpu":  # the frozen weights in the precision chosen after loading them
        cast_frozen(model, weights_dtype(mixed, device.type, text=True))
    if resume:
        dist.on_main(lambda: save_run_config(out, cfg))
    accelerator = new_accelerator(device, mixed)
    budget = int(cfg.budget_gb * GB) or None
    plan_budget, card_context = budget_for_plan(budget, accelerator.device, CUDA_CONTEXT_BYTES)
    # a CPU run plans the precision it chose ('auto' times the model first; GPUs: as configured)
    plan_cfg = cfg if accelerator.device.type != "cpu" else apply_overrides(
        cfg, {"precision": {"no": "fp32"}.get(accelerator.mixed_precision, accelerator.mixed_precision)})
    sharded = accelerator.distributed_type == DistributedType.FSDP or (dist.active and fsdp.fsdp_requested())
    parallel = Parallel(dist.world_size, sharded) if dist.active else None
    # checkpointing without a layer count: the plan's fastest depth (the same call as `plan`'s),
    # taken on the main process so that every rank checkpoints the same layers
    lengths = [len(s) for s in data.train]
    depth = dist.on_main(lambda: choose_checkpoint_layers(plan_cfg, source, plan_budget,
                                                          accelerator.device.type, parallel, lengths))
    if depth is not None:
        cfg, plan_cfg = depth.applied(cfg), depth.applied(plan_cfg)
        log.info("checkpointing the first %d of %d decoder layers%s: the fastest depth that fits the "
                 "budget (~%.0f tokens/s predicted)", depth.layers, depth.of_layers,
                 ", their inputs kept in host memory" if depth.offload else "", depth.tokens_per_s)
    if cfg.gradient_checkpointing:
        enable_checkpointing(model, cfg.checkpoint_layers)
    apply_long_context(model, offload_checkpoints=cfg.offload_checkpoints, mlp_chunk=cfg.mlp_chunk,
                       embeddings_on_host=cfg.embeddings_on_host,
                       attention_head_groups=cfg.attention_head_groups)  # after checkpointing, before .to()
    kernels.append(compile_blocks(model, cfg.compile_blocks, device.type))
    per_epoch = steps_per_epoch(cfg, len(data.train))
    total = cfg.max_steps or per_epoch * cfg.epochs
    optimizer, optimizer_name = make_optimizer(cfg, adapters.param_groups(model, cfg),
                                               device)
    scheduler = cosine_scheduler(cfg, optimizer, total)
    model, optimizer, scheduler, sharded = _prepare(accelerator, dist, model, optimizer, scheduler,
                                                    from_main)
    fsdp_loading.dump_weights(accelerator.unwrap_model(model), out, dist)  # a test hook; off by default
    fresh = TrainState(precision=mixed, quantization=cfg.quantization, optimizer=optimizer_name)
    state = start_state(cfg, out, ckpt, resume, optimizer, scheduler, fresh, sampler, dist)
    if state.base_eval_loss is None:
        state.base_eval_loss = evaluate(model, data.held_out, data.pad_id, accelerator.device,
                                        cfg.token_budget)
    # every module in training mode: transformers loads the base in eval mode, in which its layers
    # skip gradient checkpointing (more activation memory than planned) and dropout; a resumed run
    # does not pass through the first evaluation, which used to switch them on
    model.train()
    caps, predicted, prediction = _memory_plan(plan_cfg, source, plan_budget, accelerator.device,
                                               Parallel(dist.world_size, sharded) if dist.active else None,
                                               lengths, added_rows, data.train)
    if prediction is not None:
        prediction.update(card_context)
        if depth is not None:
            prediction["checkpointing"] = depth.to_json()
    # no lora_init pass on this process (a resume loaded its result, or FSDP ran it on the main
    # process alone): the steps' peak is this process's
    if init_peak is None and prediction and "step_peak_bytes" in prediction:
        predicted = prediction["peak_bytes"] = prediction.pop("step_peak_bytes")
    meter = PeakMeter(accelerator.device, budget, every_step=cfg.measure_every_step)
    unwrapped = accelerator.unwrap_model(model)
    meter.track(local_tensors(list(unwrapped.parameters()) + list(unwrapped.buffers())
                + [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
                + quant_state_tensors(unwrapped)))
    metrics, events = open_logs(out, state, resume, dist)
    session = TextSession(
        cfg=cfg, out=out, control=control, dist=dist, accelerator=accelerator, model=model,
        optimizer=optimizer, scheduler=scheduler, state=state, metrics=metrics, events=events,
        meter=meter, caps=caps, predicted=predicted, per_epoch=per_epoch, total=total, data=data,
        fsdp=sharded, token_budget=cfg.batch_size * cfg.max_seq_len if caps.caps
        else cfg.sample_token_budget(),
        frozen_bytes_by_rank=rank_peaks(held := dist.gather_floats([fsdp.frozen_local_bytes(unwrapped),
                                                                    loaded_bytes]), 0),
        loaded_bytes_by_rank=rank_peaks(held, 1),
        prediction=prediction, flop_costs=text_flops(unwrapped), init_peak_bytes=init_peak,
        fast_kernels=[k.to_json() for k in kernels],
        peak=run_peak(accelerator.device, accelerator.mixed_precision, unwrapped, headroom(predicted, meter)),
        trackers=attach_trackers(cfg, out, state, resume, dist, metrics, meter.source))
    if dist.is_main:
        (out / STOP_FILE).unlink(missing_ok=True)
    session.plan_event(budget, fsdp=sharded, frozen_bytes_by_rank=session.frozen_bytes_by_rank)
    return session


def _run_share(run: TextSession, step: Step) -> dict[str, Any]:
    """This rank's share of a global step (the guard's runner): forward and backward only."""
    shares = split_step(step, run.dist.world_size, [len(s) for s in run.data.train],
                        batching=run.cfg.resolved_batching(), max_seq_len=run.cfg.max_seq_len,
                        pad_multiple=run.cfg.pad_multiple, token_budget=run.token_budget,
                        cap_for_len=run.caps.cap if run.caps.caps else None,
                        packed_row=run.cfg.packed_row_tokens())
    mine = shares[run.dist.rank]
    try:
        if injected_oom(run.dist.rank, run.state.step + 1):
            big = max(mine.micro_batches, key=lambda mb: len(mb.indices))
            raise MicroBatchOutOfMemory(big, torch.OutOfMemoryError("injected by " + INJECT_OOM_ENV))
        stats = (run_pair_step if run.data.preference else run_step)(
            run.model, run.accelerator, run.data, mine, step_targets(run.data.train, step))
    except MicroBatchOutOfMemory as oom:
        if run.fsdp:  # no way to stop every rank at the same point inside FSDP's all-gathers
            raise FsdpOutOfMemoryError(fsdp.fsdp_oom_message(oom)) from None
        raise
    return {**stats, "indices": mine.indices, "micro_batches": len(mine.micro_batches)}


def _row_lengths(samples: Sequence[Any], indices: Sequence[int]) -> list[int]:
    """Real tokens of each row a step trains: a preference pair is two rows (chosen, rejected);
    the reference pass under no_grad is not counted as useful work."""
    rows: list[int] = []
    for i in indices:
        sample = samples[i]
        pair = isinstance(sample, PairSample)
        rows.extend([len(sample.chosen), len(sample.rejected)] if pair else [len(sample)])
    return rows


def _text_shape(run: TextSession, step: Step) -> StepShape:
    """The step's shape for the memory meter: its micro-batches and whether each builds a mask
    (a packed row of several segments; padded rows where the padding mask is kept, which with
    sdpa it is not: there a padded batch runs the same code as a full one; a preference pair
    counts both its rows)."""
    keeps_mask = run.data.preference is not None or padding_mask_kept(run.cfg)
    kinds = []
    for mb in step.micro_batches:
        rows = _row_lengths(run.data.train, mb.indices)
        if mb.packed:  # several segments (documents, or one and its padding): a mask
            kinds.append(len(rows) > 1 or sum(rows) < mb.seq_len)
        else:
            kinds.append(keeps_mask and any(n < mb.seq_len for n in rows))
    return step_shape(step, kinds)


def _one_step(run: TextSession, step: Step, epoch: int) -> dict[str, Any]:
    """One optimizer step; returns its metric record (every rank's figures combined)."""
    stats, seconds = optimizer_step(run, step, lambda st: _run_share(run, st),
                                    agree_across_ranks=not run.fsdp, shape=_text_shape(run, step))
    total = combine_step_stats(run.dist, run.meter.step_peak(), stats["loss"], stats["real_tokens"],
                               stats["padded_tokens"])
    record = {"step": run.state.step, "total_steps": run.total, "epoch": epoch, "loss": total["loss"],
              "lr": run.scheduler.get_last_lr()[0], "real_tokens": total["real_tokens"],
              "padded_tokens": total["padded_tokens"], "batch_size": len(step.indices),
              "micro_batches": stats["micro_batches"],
              "seq_len": max(mb.seq_len for mb in step.micro_batches), "seconds": seconds,
              "tokens_per_s": total["real_tokens"] / seconds, "peak_bytes": total["peak_bytes"],
              "peak_bytes_by_rank": total["peak_bytes_by_rank"],
              "memory_source": run.meter.source, "time": time.time(), **stats.get("preference", {})}
    win = run.cfg.attention == "windowed"  # each query sees its window and the global tokens only
    flops = run.flop_costs.step(_row_lengths(run.data.train, step.indices),
                                run.cfg.window if win else None, run.cfg.global_tokens if win else 0)
    record.update(step_speed(flops, seconds, run.peak, run.dist.world_size))
    if os.environ.get(DEBUG_SAMPLES_ENV) == "1":
        record["samples_by_rank"] = run.dist.gather_to_main(stats["indices"])
    return record


def _final_eval(run: TextSession) -> tuple[float | None, float | None]:
    """Held-out loss with the run's attention and, for windowed runs, with full attention too."""
    args = (run.data.held_out, run.data.pad_id, run.accelerator.device, run.cfg.token_budget)
    try:
        loss = evaluate(run.model, *args)
        full = None
        if run.cfg.attention == "windowed":  # the adapter is used with full attention at inference
            with text_models.attention_backend(run.model, run.cfg.resolved_attn_backend()):
                full = evaluate(run.model, *args)
    except torch.OutOfMemoryError as err:
        log.warning("evaluation ran out of memory: %s", err)
        return None, None
    return loss, full


@writes_run_folder(check_text_inputs)  # inputs checked before a run is replaced; lock released
def train_text(cfg: RunConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False,
               control: TrainControl | None = None, progress: bool = True) -> dict[str, Any]:
    """Trains a text LoRA and writes the run folder; returns the run.json summary.

    Args:
        cfg: validated settings (for a resume, the run's saved config).
        out: run folder (adapter/, metrics.jsonl, events.jsonl, run.json, checkpoints/).
        resume: continue from the newest checkpoint in ``out``.
        overwrite: replace a run that ``out`` already holds.
        control: stop request and record listener (the UI's job uses it).
    """
    out = Path(out)
    control = control or TrainControl()
    run = _setup(cfg, out, resume, overwrite, control)
    if run.data.preference:
        prepare_preference(run)
    status, message = run_loop(run, lambda epoch: epoch_plan(cfg, run.data, epoch, bool(run.caps.caps)),
                               lambda step, epoch: _one_step(run, step, epoch), progress)
    control.phase("saving")
    run.checkpoint(status)
    control.phase("evaluating")
    eval_loss, eval_full = _final_eval(run)
    control.phase("saving")
    adapter = out / "adapter"
    if run.dist.is_main:
        _save_adapter(run.accelerator.unwrap_model(run.model), out)
        if run.data.is_chat:  # the chat template (and its added tokens) go with the adapter
            run.data.tokenizer.save_pretrained(adapter)
    summary = run_summary(cfg, run.metrics.snapshot(), {
        "status": status, "message": message, "eval_loss": eval_loss,
        "eval_loss_full_attention": eval_full, "base_eval_loss": run.state.base_eval_loss,
        "memory_source": run.meter.source, **run.meter.coverage(), "budget_bytes": run.meter.budget_bytes,
        "predicted_peak_bytes": run.predicted, "prediction": run.prediction,
        "oom_events": [e for e in run.events.snapshot() if e.get("event") == "oom"],
        "adapter": str(adapter), "device": str(run.accelerator.device),
        "precision": run.accelerator.mixed_precision, "train_samples": len(run.data.train),
        "eval_samples": len(run.data.held_out),
        "max_padded_len": round_up(max(len(s) for s in run.data.train), cfg.pad_multiple),
        "world_size": run.dist.world_size, "fsdp": run.fsdp,
        "frozen_bytes_by_rank": run.frozen_bytes_by_rank,
        "loaded_bytes_by_rank": run.loaded_bytes_by_rank, "fast_kernels": run.fast_kernels,
        **(speed := run_speed(run.metrics.snapshot(), run.peak, run.dist.world_size)),
        **speed_report(run.prediction, run.metrics.snapshot(), speed.get("mfu"))})
    if run.data.preference:
        summary.update(preference_summary(run))
    if run.init_peak_bytes is not None:  # the decomposing lora_init, measured before step 1
        summary["init_peak_bytes"] = run.init_peak_bytes
        if summary["peak_bytes"] is not None and run.init_peak_bytes > summary["peak_bytes"]:
            summary["step_peak_bytes"], summary["peak_bytes"] = summary["peak_bytes"], run.init_peak_bytes
    summary["memory_report"] = memory_report(summary)
    if run.dist.is_main:
        write_atomic(out / "run.json", json.dumps(summary, indent=1))
    if run.trackers is not None:
        run.trackers.finish(closing_values(summary), run.state.step)
    return summary
