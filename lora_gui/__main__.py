"""Command line: ``python -m lora_gui train | ui`` (plan and compare join with their issues).

The CLI and the UI call the same engine functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from lora_gui.config import ConfigError, parse_set_args
from lora_gui.data.images import ImageDataError
from lora_gui.data.text import DataError
from lora_gui.engine.rundir import RunDirError, load_run_config
from lora_gui.models.text import ModelError
from lora_gui.presets import load_config

USER_ERRORS = (ConfigError, DataError, ImageDataError, ModelError, RunDirError)


def _stop_on_signals(stop) -> None:
    """First Ctrl-C / SIGTERM asks the loop to checkpoint and stop; a second one kills."""

    def handler(signum, _frame):
        logging.getLogger("lora_gui").warning("signal %d: saving a checkpoint and stopping "
                                              "(press Ctrl-C again to abort at once)", signum)
        stop.set()
        signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def train_for(cfg):
    """The engine entry point of the run's task: train_text or train_image (same signature)."""
    if cfg.task == "image":
        from lora_gui.engine.diffusion import train_image

        return train_image
    from lora_gui.engine.text import train_text

    return train_text


def cmd_train(args: argparse.Namespace) -> int:
    from lora_gui.engine.text import TrainControl

    overrides = parse_set_args(args.set)
    if args.resume:
        out = Path(args.resume)
        cfg = load_run_config(out, overrides) if (out / "config.json").is_file() else None
        if cfg is None:
            raise RunDirError(f"{out}: nothing to resume (no config.json from an earlier run)")
    else:
        if not args.out:
            raise ConfigError("train: --out DIR is required (or --resume DIR)")
        out = Path(args.out)
        cfg = load_config(args.preset, overrides)
    control = TrainControl()
    _stop_on_signals(control.stop)
    summary = train_for(cfg)(cfg, out, resume=bool(args.resume), overwrite=args.overwrite,
                             control=control, progress=not args.quiet)
    shown = {k: v for k, v in summary.items() if k != "config"}
    print(json.dumps(shown, indent=1))
    return 0 if summary["status"] == "completed" else 130


DEFAULT_PLAN_BUDGET_GB = 24.0  # without --budget-gb, a budget_gb setting or a GPU: a common card


def _plan_budget_gb(args: argparse.Namespace, cfg) -> tuple[float, str]:
    import torch

    if args.budget_gb is not None:
        return args.budget_gb, "--budget-gb"
    if cfg.budget_gb:
        return cfg.budget_gb, "budget_gb setting"
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 1e9, "this GPU"
    return DEFAULT_PLAN_BUDGET_GB, "default (no GPU here)"


def cmd_plan(args: argparse.Namespace) -> int:
    from lora_gui.memory import planner, run_plan

    cfg = load_config(args.preset, parse_set_args(args.set))
    budget_gb, budget_from = _plan_budget_gb(args, cfg)
    if cfg.task == "image":
        return _plan_image(cfg, budget_gb, budget_from, args)
    try:
        budget = planner.check_budget(budget_gb * 1e9)
        plan, step = run_plan.plan_and_predict(cfg, budget, args.device)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    result = run_plan.plan_to_json(plan, step)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    mib = 2**20
    print(f"Predicted peak of one training step on {args.device} (source: predicted, fake-tensor "
          f"trace of {cfg.model}): {step.peak_bytes / mib:,.0f} MiB")
    for name, nbytes in step.breakdown.items():
        print(f"  {name:<18} {nbytes / mib:>10,.1f} MiB")
    for name, nbytes in step.cuda_overheads.items():
        if not nbytes:  # planning for a CPU: no CUDA context, workspace or rounding
            continue
        print(f"  + {name:<16} {nbytes / mib:>10,.1f} MiB  (CUDA-only overhead, not in the trace)")
    print(f"\nBudget {budget_gb:g} GB ({budget_from}): {plan.message}")
    print("  bucket (tokens)  micro-batch  grad-accum  predicted peak MiB")
    for b in plan.buckets:
        print(f"  {b.bucket!s:>15}  {b.micro_batch:>11}  {b.grad_accum:>10}  {b.peak_bytes / mib:>18,.0f}")
    for sug in plan.suggestions:
        print(f"  try {sug.switch}: {sug.peak_bytes / mib:,.0f} MiB (saves {sug.saving_bytes / mib:,.0f} "
              f"MiB){' -> fits' if sug.fits else ''}")
    print("\nWhat fits where (batch 1 longest sequence; largest batch at max_seq_len):")
    rows = planner.what_fits_where(run_plan.model_config_for(cfg), chosen=cfg.max_seq_len,
                                   **run_plan.step_kwargs(cfg, args.device))
    for row in rows:
        print(f"  {row.card_gb:>3} GB: longest {row.longest or 'nothing fits'}, "
              f"batch {row.batch_at_chosen} at {cfg.max_seq_len}")
    return 0


def _plan_image(cfg, budget_gb: float, budget_from: str, args: argparse.Namespace) -> int:
    """`plan` for an image run: per-bucket micro-batch and the trace of the largest (predicted)."""
    from lora_gui.memory import planner
    from lora_gui.memory.image_run_plan import plan_image_run

    try:
        plan, step, _ = plan_image_run(cfg, planner.check_budget(budget_gb * 1e9), args.device)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if args.json:
        from lora_gui.memory.run_plan import plan_to_json

        print(json.dumps(plan_to_json(plan, step), indent=1, default=str))
        return 0
    mib = 2**20
    print(f"Predicted peak of the largest UNet micro-batch on {args.device} (source: predicted, "
          f"fake-tensor trace of {cfg.model} at {cfg.resolution} px): {step.peak_bytes / mib:,.0f} MiB")
    print(f"\nBudget {budget_gb:g} GB ({budget_from}): {plan.message}")
    print("  bucket (h, w)  micro-batch  grad-accum  predicted peak MiB")
    for b in plan.buckets:
        print(f"  {b.bucket!s:>13}  {b.micro_batch:>11}  {b.grad_accum:>10}  {b.peak_bytes / mib:>18,.0f}")
    for sug in plan.suggestions:
        print(f"  try {sug.switch}: {sug.peak_bytes / mib:,.0f} MiB{' -> fits' if sug.fits else ''}")
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from app import main as app_main

    return app_main(args.ui_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lora_gui", description="LoRA training that fits.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a LoRA adapter")
    train.add_argument("--preset", help="presets/NAME.yaml or a path")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one setting (repeatable)")
    train.add_argument("--out", help="run folder")
    train.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its checkpoint")
    train.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_train)
    plan = sub.add_parser("plan", help="predict peak memory and batch sizes before a run (CPU only)")
    plan.add_argument("--preset", help="presets/NAME.yaml or a path")
    plan.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    plan.add_argument("--budget-gb", type=float, help="VRAM budget in GB (default: budget_gb, the GPU, 24)")
    plan.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                      help="plan for a CUDA GPU (adds its overheads) or for this CPU")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(func=cmd_plan)
    ui = sub.add_parser("ui", help="open the web dashboard (same as python app.py)")
    ui.add_argument("ui_args", nargs=argparse.REMAINDER)
    ui.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
