"""The planner applied to one run: which buckets, which model shapes, what the trace predicts.

Glue between a :class:`RunConfig` and :mod:`planner` / :mod:`trace`, shared by the CLI ``plan``
command, the training engine (batch caps per bucket under a budget) and the UI.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.data.batching import round_up
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.model_configs import bundled_models, load_model_config
from lora_gui.memory.predict.parallel import Parallel, per_gpu
from lora_gui.memory.predict.trace import TraceResult, trace_text_step
from lora_gui.models.adapters import adapter_spec
from lora_gui.models.precision import planned_weights_dtype
from lora_gui.models.preference_loss import preference_loss_of


def model_config_for(cfg: RunConfig, source: str | None = None) -> Any:
    """Model shapes for planning: a bundled architecture name, the built-in model or a local dir."""
    if cfg.model in bundled_models():
        config = load_model_config(cfg.model)
    else:
        if source is None:
            from lora_gui.models.text import resolve_model_source

            source = resolve_model_source(cfg.model)
        config = load_model_config(source)
    if cfg.attention == "windowed" and not isinstance(config, dict):
        from lora_gui.attention import configure_windowed

        configure_windowed(config, cfg.window, cfg.global_tokens, max_seq_len=cfg.max_seq_len)
    return config


def text_buckets(cfg: RunConfig) -> list[int]:
    """Padded lengths the bucketed builder can produce, coarsened to powers of two (fewer traces)."""
    buckets, n = [], round_up(64, cfg.pad_multiple)
    while n < cfg.max_seq_len:
        buckets.append(n)
        n *= 2
    return buckets + [cfg.max_seq_len]


def step_kwargs(cfg: RunConfig, device: str) -> dict[str, Any]:
    """Trace/estimate arguments that describe this run's step on ``device`` ('cuda' or 'cpu')."""
    attn = "windowed" if cfg.attention == "windowed" else cfg.resolved_attn_backend()
    dtype = planned_weights_dtype(cfg.precision, device, text=True)  # as the engine loads them
    return {"lora_rank": cfg.lora_rank, "attn_implementation": attn,
            "quantization": cfg.quantization, "double_quant": cfg.double_quant,
            "optimizer": cfg.resolved_optimizer(device),
            "gradient_checkpointing": cfg.gradient_checkpointing, "loss_chunk": cfg.resolved_loss_chunk(),
            "checkpoint_layers": cfg.checkpoint_layers if cfg.gradient_checkpointing else 0,
            "offload_checkpoints": cfg.offload_checkpoints, "mlp_chunk": cfg.mlp_chunk,
            "embeddings_on_host": cfg.embeddings_on_host, "adapter": adapter_spec(cfg),
            "preference": preference_loss_of(cfg),
            "attention_head_groups": cfg.attention_head_groups,
            "lean_backward": cfg.resolved_lean_backward(),
            "dtype": dtype, "device": device,
            "target_modules": cfg.lora_targets if cfg.lora_targets == "all-linear"
            else [t.strip() for t in cfg.lora_targets.split(",")],
            **cpu_mixed_precision(cfg, device)}


def cpu_mixed_precision(cfg: RunConfig, device: str) -> dict[str, str]:
    """A CPU run's bf16 / fp16 autocast for the trace (under fp16 its weights stay float32, so
    ``dtype`` cannot say it); empty on GPUs and for float32. 'auto' on a CPU is planned as float32: the
    run decides by timing its own model and plans again with what it chose."""
    if device == "cpu" and cfg.precision in ("bf16", "fp16"):
        return {"cpu_autocast": cfg.precision}
    return {}


def time_before_loading(cfg: RunConfig, source: str | None, device: str) -> None:
    """Times the run's step (or finds it cached) before the run loads its weights, so that the
    plan the run makes after loading reads the stored calibration: on a GPU the calibration builds
    a second model of the run's architecture, which beside the loaded one could pass the budget.
    Only where the plan will ask for it (a budget, a choice by speed) and where the step's settings
    are known before loading (a GPU, or a precision other than 'auto', which a CPU run decides by
    timing its loaded model)."""
    from lora_gui.memory.predict.run_speed import step_time_model

    if cfg.task != "text" or not cfg.budget_gb or cfg.batch_choice == "largest":
        return
    if device != "cuda" and cfg.precision == "auto":
        return
    step_time_model(cfg, model_config_for(cfg, source), device, step_kwargs(cfg, device))


def plan_run(cfg: RunConfig, budget_bytes: int, device: str = "cuda", source: str | None = None,
             confirm: bool = True, parallel: Parallel | None = None) -> planner.Plan:
    """Micro-batch per length bucket for this run under the budget (source: predicted): the one
    ``cfg.batch_choice`` picks with the device's step-time model (the largest that fits without
    one); with ``parallel``, per GPU (each of N processes takes batch_size / N samples a step)."""
    from lora_gui.memory.predict.run_speed import step_time_model

    n = parallel.world_size if parallel else 1
    per_rank = max(1, -(-cfg.batch_size // n))
    config, step = model_config_for(cfg, source), step_kwargs(cfg, device)
    timing = step_time_model(cfg, config, device, step) if cfg.task == "text" else None
    return planner.plan_text(config, budget_bytes, text_buckets(cfg),
                             effective_batch=per_rank, max_batch=per_rank, confirm=confirm,
                             parallel=parallel, step_time=timing, batch_choice=cfg.batch_choice,
                             **step)


def predicted_step(cfg: RunConfig, device: str = "cuda", source: str | None = None,
                   batch_size: int | None = None, seq_len: int | None = None,
                   parallel: Parallel | None = None) -> TraceResult:
    """Trace of this run's largest micro-batch shape (traditional: batch x max_seq_len;
    optimized: as many max-length rows as fit the token budget; packed: one full row of several
    documents), per GPU with ``parallel``."""
    mask = {}
    if cfg.resolved_batching() == "packed" and batch_size is None:
        seq_len = cfg.packed_row_tokens() if seq_len is None else min(seq_len, cfg.token_budget)
        batch_size, mask = 1, {"mask": "packed"}
    if seq_len is None:
        seq_len = cfg.max_seq_len
    if batch_size is None:
        per_rank = max(1, -(-cfg.batch_size // (parallel.world_size if parallel else 1)))
        if cfg.resolved_batching() == "fixed":
            batch_size = per_rank
        else:
            batch_size = max(1, min(per_rank, cfg.token_budget // seq_len))
    config = model_config_for(cfg, source)
    step = trace_text_step(config, batch_size=batch_size, seq_len=seq_len, **step_kwargs(cfg, device),
                           **mask)
    return per_gpu(step, config, parallel)


def estimated_step(cfg: RunConfig, device: str = "cuda", source: str | None = None) -> TraceResult:
    """Closed-form estimate of the same shape as :func:`predicted_step`: instant, for the UI."""
    from lora_gui.memory.predict.estimate import estimate_text_step

    config = model_config_for(cfg, source)
    kwargs = step_kwargs(cfg, device)
    choice = None
    if cfg.resolved_batching() == "fixed":
        batch = cfg.batch_size
    elif cfg.budget_gb and cfg.resolved_batching() == "bucketed":  # adaptive: what the planner gives
        batch, choice = _estimated_choice(cfg, config, device, kwargs)
    else:
        batch = max(1, min(cfg.batch_size, cfg.token_budget // cfg.max_seq_len))
    step = estimate_text_step(config, batch_size=batch, seq_len=cfg.max_seq_len, **kwargs)
    if choice:
        step.info["batch_choice"] = choice
    return step


def _estimated_choice(cfg: RunConfig, config: Any, device: str, kwargs: dict[str, Any]) -> tuple[int, str]:
    """The longest bucket's micro-batch as the run's plan chooses it (``batch_choice`` with this
    machine's stored step-time calibration; nothing is timed here, the estimate is instant), and
    in words which choice that is: the largest that fits when no calibration is stored yet."""
    from lora_gui.memory.predict.run_speed import step_time_model

    timing = None
    if cfg.task == "text" and cfg.batch_choice != "largest":
        timing = step_time_model(cfg, config, device, kwargs, calibrate=False)
    plan = planner.plan_text(config, int(cfg.budget_gb * 1e9), [cfg.max_seq_len],
                             effective_batch=cfg.batch_size, max_batch=cfg.batch_size,
                             confirm=False, step_time=timing, batch_choice=cfg.batch_choice, **kwargs)
    row = plan.buckets[0]
    if cfg.batch_choice == "largest":
        how = "the largest micro-batch that fits, as the run's plan (batch_choice largest)"
    elif timing is None:
        how = (f"the largest micro-batch that fits: the run's plan picks the {cfg.batch_choice} one once "
               "this machine's step time is measured (the plan below says which)")
    else:
        how = (f"the {cfg.batch_choice} micro-batch by this machine's measured step time, as the run's plan "
               f"(~{row.tokens_per_s:,.0f} tokens/s predicted)")
    return max(1, row.micro_batch), how


def plan_to_json(plan: planner.Plan | None, step: TraceResult, kernels: list | None = None) -> dict[str, Any]:
    """The `plan --json` object: peak, breakdown, overheads (per GPU) and, with a plan, fits and
    the batch per bucket; on CUDA also what the card shows (allocated, reserved, nvidia-smi) and
    ``kernels``, the rows of CUDA-only memory (:mod:`lora_gui.memory.predict.cuda_kernels`)."""
    out: dict[str, Any] = {}
    if step.device == "cuda":
        from lora_gui.memory.predict.cuda_kernels import card_figures

        out = {**card_figures(step), "cuda_kernels": [r.to_json() for r in kernels or []],
               "attention_workspace_bytes": step.info.get("attention_workspace_bytes", 0)}
    out |= {"world_size": step.info.get("world_size", 1), "fsdp": step.info.get("fsdp", False),
            "allreduce_bucket_bytes": step.info.get("allreduce_bucket_bytes", 0),
            "peak_bytes": step.peak_bytes, "traced_peak_bytes": step.traced_peak_bytes,
            "breakdown": step.breakdown, "cuda_overheads": step.cuda_overheads,
            "host_bytes": step.info.get("host_bytes", 0),  # long-context switches: host memory
            "device": step.device, "source": "predicted",
            "kernel": step.info.get("kernel"), "prediction": step.info.get("prediction")}
    if plan is not None:
        out |= {"fits": plan.fits, "budget_bytes": plan.budget_bytes, "message": plan.message,
                "batch_by_bucket": {str(k): v for k, v in plan.batch_by_bucket.items()},
                "buckets": [asdict(b) for b in plan.buckets],
                "suggestions": [asdict(s) for s in plan.suggestions]}
    return out
