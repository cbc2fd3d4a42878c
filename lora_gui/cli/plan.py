"""``lora-gui plan``: the run's own plan, resolved by the one budget rule every entry point uses
(:func:`lora_gui.memory.predict.report.resolve_question`), and its longest-length answers."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lora_gui.cli.settings import set_help
from lora_gui.config import ConfigError, parse_set_args
from lora_gui.presets import load_config
from lora_gui.units import gb


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``plan`` subcommand on ``sub`` (the CLI's subparsers)."""
    from lora_gui.cards import card_names

    plan = sub.add_parser("plan", help="predict peak memory and batch sizes before a run (CPU only)")
    plan.add_argument("--preset", help="presets/NAME.yaml or a path")
    plan.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help())
    plan.add_argument("--budget-gb", type=float,
                      help="VRAM budget in decimal GB (1 GB = 1e9 bytes; default: the budget_gb setting, "
                           "else no budget, as train plans)")
    plan.add_argument("--budget-gib", type=float,
                      help="VRAM budget in GiB (1 GiB = 2**30 bytes), instead of --budget-gb; figures are "
                           "printed in GB")
    plan.add_argument("--card", metavar="NAME",
                      help="plan for this card: its whole memory as torch reports it is the budget, the "
                           f"CUDA context counted (names: {', '.join(card_names())})")
    plan.add_argument("--device", choices=("cuda", "cpu"),
                      help="plan for a CUDA GPU (adds its overheads) or for this CPU (default: a GPU for "
                           "--card, else where a run started here trains)")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument("--world-size", type=int, default=1, metavar="N",
                      help="processes (GPUs) of a data-parallel run: the figures are per GPU")
    plan.add_argument("--fsdp", action="store_true",
                      help="with --world-size: FSDP shards the frozen weights over the GPUs")
    plan.add_argument("--offload", action="store_true",
                      help="with --fsdp: FSDP keeps the shards in host memory (accelerate's "
                           "fsdp_offload_params); the plan adds the host memory per machine")
    plan.add_argument("--longest", action="store_true",
                      help="the longest max_seq_len that fits the budget and the switches it needs "
                           "(image runs: the largest resolution and batch)")
    plan.add_argument("--host-gb", type=float,
                      help="host memory offloaded tensors may use "
                           "(default: what is available here)")
    plan.add_argument("--no-cuda-context", action="store_true",
                      help="--longest on cuda: leave the CUDA context (0.965 GB) out of the budget, "
                           "as published figures do")
    plan.add_argument("--estimate-only", action="store_true",
                      help="--longest: the closed-form estimate only (instant; not confirmed by the trace)")
    plan.add_argument("--count-unconfirmed", action="store_true",
                      help="--longest: count memory savings no card has confirmed yet instead of keeping "
                           "them as a margin (see the answer's note)")
    plan.add_argument("--beyond-context", action="store_true",
                      help="--longest: search past the model's context (only for runs that extend it)")
    plan.set_defaults(func=cmd_plan)
    return plan


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
        return _plan_image_shapes(cfg, budget, args)
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
        from lora_gui.memory.predict.video_report import video_plan_lines

        print("\n".join([*video_plan_lines(cfg, pred, budget), question.rule]), flush=True)
        if budget is not None and args.world_size == 1 and pred.peak_bytes <= budget.bytes:
            print("\n".join(report.checkpoint_layers_lines(cfg, budget, device)))
        return 0
    print("\n".join([*report.text_plan_lines(cfg, pred, budget, parallel.label(), kernels, short),
                     question.rule]), flush=True)  # on screen while the search below makes its plans
    if parallel.offload:
        host = pred.step.info.get("fsdp_offload_host_bytes", 0)
        print(f"  host memory for the offloaded shards: {gb(host)} per machine, all "
              f"{args.world_size} processes on one (source: predicted; not counted: loading, each "
              "process's own memory)")
    if budget is not None and args.world_size == 1 and pred.peak_bytes <= budget.bytes:
        print("\n".join(report.checkpoint_layers_lines(cfg, budget, device, now=pred)))
    _print_fits(cfg, device)
    return 0


def _check_host(step, args: argparse.Namespace) -> None:
    """Refuses a plan whose offloaded tensors need more host memory than there is (both figures)."""
    from lora_gui.memory.runtime.host import check_host_memory, host_available_bytes

    host = args.host_gb * 1e9 if args.host_gb is not None else host_available_bytes()
    check_host_memory(int(step.info.get("host_bytes", 0) or 0), host,
                      "the host-side tensors of this run (offloaded checkpoints, host-side embeddings, "
                     "swapped video blocks)")


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
                      f"({gb(result['peak_bytes_at_largest'])}, {result['source']})")
                print(f"  largest batch at {result['resolution']} px: {result['batch_at_resolution']}")
            return 0
        if cfg.task == "video":  # the longest clip at the run's size, the largest size at its frames
            result = longest(cfg, budget, args.device)
            size = result["largest_size_at_frames"]
            print(json.dumps(result, indent=1) if args.json else
                  f"Video run, budget {plan_budget.label()}, {args.device}: {result['note']} "
                  f"({gb(result['peak_bytes_at_longest'])}, {result['source']})\n"
                  f"  {size['note']} ({gb(size['peak_bytes_at_largest'])}, {size['source']})")
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
    over the resolution's aspect buckets and the trace of the largest (source: predicted).
    Without a budget every bucket trains at ``batch_size``, as a run without one does."""
    from lora_gui.memory.predict import planner
    from lora_gui.memory.predict.image_run_plan import plan_image_run

    try:
        limit = budget.bytes if budget is not None else planner.MAX_BUDGET_BYTES  # no budget: batch_size
        plan, step, _ = plan_image_run(cfg, planner.check_budget(limit), args.device)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if args.json:
        from lora_gui.memory.predict.run_plan import plan_to_json

        print(json.dumps(plan_to_json(plan, step), indent=1, default=str))
        return 0
    print(f"Predicted peak of the largest UNet / DiT micro-batch on {args.device} (source: predicted, "
          f"fake-tensor trace of {cfg.model} at {cfg.resolution} px; shapes only, no pipeline or data "
          f"read): {gb(step.peak_bytes)}")
    if step.info.get("encoding_pass_bytes"):
        print("  (the larger of the training step and the caching pass, which holds the VAE and text "
              "encoders on the device, and the transformer too unless latents are cached: "
              f"{gb(step.info['encoding_pass_bytes'])})")
    print(f"\nBudget {budget.label()}: {plan.message}" if budget is not None else
          f"\nNo budget to judge against: every bucket at batch_size {cfg.batch_size}, as a run without one")
    print("  bucket (h, w)  micro-batch  grad-accum  predicted peak GB")
    for b in plan.buckets:
        print(f"  {b.bucket!s:>13}  {b.micro_batch:>11}  {b.grad_accum:>10}  "
              f"{gb(b.peak_bytes, unit=False):>17}")
    for sug in plan.suggestions:
        print(f"  try {sug.switch}: {gb(sug.peak_bytes)}{' -> fits' if sug.fits else ''}")
    return 0
