"""``lora-gui train``: one run from a preset and ``--set`` overrides, or a resumed one; it ends
with a short summary (``train_summary.py``) or, with ``--json``, the whole run summary."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from lora_gui.cli.settings import program, set_help
from lora_gui.cli.signals import stop_on_signals
from lora_gui.cli.train_summary import summary_lines
from lora_gui.config import ConfigError, parse_set_args
from lora_gui.engine.core.lock import RunDirError
from lora_gui.presets import load_config


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``train`` subcommand on ``sub`` (the CLI's subparsers)."""
    train = sub.add_parser("train", help="train a LoRA adapter",
                           epilog=f"Settings: '{program()} settings' lists every setting with what it "
                                  f"accepts, its default and its help; '{program()} settings NAME' "
                                  "shows one in full.")
    train.add_argument("--preset", help="presets/NAME.yaml or a path")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help())
    train.add_argument("--out", help="run folder")
    train.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its checkpoint")
    train.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--json", action="store_true",
                       help="end with the whole run summary as JSON (run.json without the settings) "
                            "instead of the short one")
    train.set_defaults(func=cmd_train)
    return train


def cmd_train(args: argparse.Namespace) -> int:
    from lora_gui.engine import train
    from lora_gui.engine.core.control import TrainControl
    from lora_gui.engine.core.distributed import Dist
    from lora_gui.engine.core.rundir import load_run_config
    from lora_gui.engine.core.runstate import storage_error_message

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
    stop_on_signals(control.stop)
    started = time.monotonic()
    try:
        summary = train(cfg, out, resume=bool(args.resume), overwrite=args.overwrite,
                        control=control, progress=not args.quiet)
    except OSError as err:  # full disk, quota, read-only folder: say so, keep what was saved
        message = storage_error_message(err, out)
        if message is None:
            raise
        raise RunDirError(message) from None
    dist = Dist.from_env()  # the launch's process group (joined by the engine), or one process
    if dist.is_main:  # one summary per launch, not one per process
        if args.json:
            print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=1))
        else:
            print("\n".join(summary_lines(summary, out, time.monotonic() - started, program())))
    dist.release()
    return 0 if summary["status"] == "completed" else 130
