"""``lora-gui plan``: the run's own plan, resolved by the one budget rule every entry point uses
(:func:`lora_gui.memory.predict.report.resolve_question`), and its longest-length answers."""

from __future__ import annotations

import argparse
import json

from lora_gui.config import ConfigError, parse_set_args
from lora_gui.presets import load_config


def _plan_question(args: argparse.Namespace, cfg):
    """The plan's settings, device and budget, resolved as the run resolves them
    (see memory.predict.report.resolve_question)."""
    import torch

    from lora_gui.memory.predict.report import resolve_question

    gpu = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    return resolve_question(cfg, card=args.card, budget_gb=args.budget_gb, budget_gib=args.budget_gib,
                            device=args.device, gpu_total_bytes=gpu, budget_from="--budget-gb")


def cmd_plan(args: argparse.Namespace) -> int:
    from lora_gui.memory.predict import predict, report
    from lora_gui.memory.predict.parallel import Parallel

    question = _plan_question(args, load_config(args.preset, parse_set_args(args.set)))
    cfg, device, budget = question.cfg, question.device, question.judged_against
    args.device = device  # the helpers below read it
    if args.no_cuda_context and not args.longest:
        raise ConfigError("--no-cuda-context applies to --longest only: a plan counts the CUDA context")
    if args.longest:
        if budget is None:
            raise ConfigError("plan --longest: give the memory to fill: --card NAME, --budget-gb GB or "
                              "--set budget_gb=GB")
        return _plan_longest(cfg, budget, args)
    if cfg.task == "image" and _bundled_shapes_only(cfg):
        return _plan_image_shapes(cfg, budget or report.resolve_budget(cfg), args)
    try:
        parallel = Parallel(args.world_size, args.fsdp, args.offload)
        pred = predict(cfg, None, device, processes=args.world_size, fsdp=args.fsdp, offload=args.offload)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    _check_host(pred.step, args)
    kernels, short = report.cuda_rows(cfg, pred, budget)
    if args.json:
        out = report.plan_json(pred, kernels, short, budget)  # video: one plan, fits against the budget
        out.update(settings=question.settings(), budget_rule=question.rule)
        print(json.dumps(out, indent=1, default=str))
        return 0
    if cfg.task == "image":
        print("\n".join([*report.image_plan_lines(cfg, pred, budget), question.rule]))
        return 0
    if cfg.task == "video":
        from lora_gui.memory.predict.video_run import video_plan_lines

        print("\n".join([*video_plan_lines(cfg, pred, budget), question.rule]))
        return 0
    print("\n".join([*report.text_plan_lines(cfg, pred, budget, parallel.label(), kernels, short),
                     question.rule]), flush=True)  # on screen while the search below makes its plans
    if parallel.offload:
        host = pred.step.info.get("fsdp_offload_host_bytes", 0)
        print(f"  host memory for the offloaded shards: {host / 1e9:,.2f} GB per machine, all "
              f"{args.world_size} processes on one (source: predicted; not counted: loading, each "
              "process's own memory)")
    if budget is not None and args.world_size == 1 and pred.peak_bytes <= budget.bytes:
        print("\n".join(report.checkpoint_layers_lines(cfg, budget, device)))
    _print_fits(cfg, device)
    return 0


def _check_host(step, args: argparse.Namespace) -> None:
    """Refuses a plan whose offloaded tensors need more host memory than there is (both figures)."""
    from lora_gui.memory.runtime.host import check_host_memory, host_available_bytes

    host = args.host_gb * 1e9 if args.host_gb is not None else host_available_bytes()
    check_host_memory(int(step.info.get("host_bytes", 0) or 0), host,
                      "the offloaded checkpoints and host-side embeddings of this run")


def _plan_longest(cfg, plan_budget, args: argparse.Namespace) -> int:
    """`plan --longest`: the longest max_seq_len that fits (text) or the largest resolution and
    batch (image), with the switches it needs (source: predicted)."""
    from lora_gui.memory.predict import longest
    from lora_gui.memory.runtime.host import host_available_bytes

    budget, budget_from = plan_budget.bytes, plan_budget.source
    try:
        if cfg.task == "image":
            result = longest(cfg, budget, args.device)
            if args.json:
                print(json.dumps(result, indent=1))
            else:
                print(f"Image run, budget {plan_budget.label()}, {args.device}: "
                      f"{result['note']}")
                print(f"  largest resolution at batch 1: {result['largest_resolution']} px "
                      f"({result['peak_bytes_at_largest'] / 2**30:,.2f} GiB, {result['source']})")
                print(f"  largest batch at {result['resolution']} px: {result['batch_at_resolution']}")
            return 0
        if cfg.task == "video":
            result = longest(cfg, budget, args.device)
            print(json.dumps(result, indent=1) if args.json else
                  f"Video run, budget {plan_budget.label()}, {args.device}: {result['note']} "
                  f"({result['peak_bytes_at_longest'] / 2**30:,.2f} GiB, {result['source']})")
            return 0
        from lora_gui.memory.predict.longest_text import describe

        host = args.host_gb * 1e9 if args.host_gb is not None else host_available_bytes()
        result = longest(cfg, budget, args.device, count_cuda_context=not args.no_cuda_context,
                         host_limit_bytes=host, beyond_context=args.beyond_context,
                         confirm=not args.estimate_only, margin=not args.count_unconfirmed)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if args.json:
        shown = {**result.to_json(), "host_limit_bytes": host, "budget_from": budget_from}
        print(json.dumps(shown, indent=1))
    else:
        print("\n".join(describe(result)))
        print(f"  (budget from {budget_from})")
    return 0


def _print_fits(cfg, device: str) -> None:
    from lora_gui.memory.predict import planner, report, run_plan

    # cards are GPUs: the table is planned for CUDA whatever device the plan above is for
    budget = int(cfg.budget_gb * 1e9) or None
    rows = planner.what_fits_where(run_plan.model_config_for(cfg), chosen=cfg.max_seq_len,
                                   cards_gb=report.table_cards_gb(budget),
                                   **run_plan.step_kwargs(cfg, "cuda"))
    print("\n".join(report.fits_lines(rows, cfg.max_seq_len, budget and budget / 1e9)))


def _bundled_shapes_only(cfg) -> bool:
    """A bundled UNet / DiT config name: shapes without a pipeline or data to read."""
    from lora_gui.memory.predict.model_configs import bundled_models

    return cfg.model in bundled_models()


def _plan_image_shapes(cfg, budget, args: argparse.Namespace) -> int:
    """`plan` for a bundled UNet / DiT config (no pipeline, no data): per-bucket micro-batch
    over the resolution's aspect buckets and the trace of the largest (source: predicted)."""
    from lora_gui.memory.predict import planner
    from lora_gui.memory.predict.image_run_plan import plan_image_run

    try:
        plan, step, _ = plan_image_run(cfg, planner.check_budget(budget.bytes), args.device)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if args.json:
        from lora_gui.memory.predict.run_plan import plan_to_json

        print(json.dumps(plan_to_json(plan, step), indent=1, default=str))
        return 0
    mib = 2**20
    print(f"Predicted peak of the largest UNet / DiT micro-batch on {args.device} (source: predicted, "
          f"fake-tensor trace of {cfg.model} at {cfg.resolution} px; shapes only, no pipeline or data "
          f"read): {step.peak_bytes / mib:,.0f} MiB")
    if step.info.get("encoding_pass_bytes"):
        print("  (the larger of the training step and the caching pass, which holds the VAE and text "
              "encoders on the device, and the transformer too unless latents are cached: "
              f"{step.info['encoding_pass_bytes'] / mib:,.0f} MiB)")
    print(f"\nBudget {budget.label()}: {plan.message}")
    print("  bucket (h, w)  micro-batch  grad-accum  predicted peak MiB")
    for b in plan.buckets:
        print(f"  {b.bucket!s:>13}  {b.micro_batch:>11}  {b.grad_accum:>10}  {b.peak_bytes / mib:>18,.0f}")
    for sug in plan.suggestions:
        print(f"  try {sug.switch}: {sug.peak_bytes / mib:,.0f} MiB{' -> fits' if sug.fits else ''}")
    return 0
