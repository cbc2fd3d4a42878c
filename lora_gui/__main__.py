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
from lora_gui.data.text import DataError
from lora_gui.engine.rundir import RunDirError, load_run_config
from lora_gui.models.text import ModelError
from lora_gui.presets import load_config

USER_ERRORS = (ConfigError, DataError, ModelError, RunDirError)


def _stop_on_signals(stop) -> None:
    """First Ctrl-C / SIGTERM asks the loop to checkpoint and stop; a second one kills."""

    def handler(signum, _frame):
        logging.getLogger("lora_gui").warning("signal %d: saving a checkpoint and stopping "
                                              "(press Ctrl-C again to abort at once)", signum)
        stop.set()
        signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def cmd_train(args: argparse.Namespace) -> int:
    from lora_gui.engine.text import TrainControl, train_text

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
    summary = train_text(cfg, out, resume=bool(args.resume), overwrite=args.overwrite,
                         control=control, progress=not args.quiet)
    shown = {k: v for k, v in summary.items() if k != "config"}
    print(json.dumps(shown, indent=1))
    return 0 if summary["status"] == "completed" else 130


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
