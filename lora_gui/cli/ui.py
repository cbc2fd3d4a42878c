"""``lora-gui ui``: the web dashboard, the same as ``python app.py`` (its arguments follow)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``ui`` subcommand on ``sub`` (the CLI's subparsers)."""
    ui = sub.add_parser("ui", help="open the web dashboard (same as python app.py)")
    ui.add_argument("ui_args", nargs=argparse.REMAINDER)
    ui.set_defaults(func=cmd_ui)
    return ui


def cmd_ui(args: argparse.Namespace) -> int:
    from app import main as app_main

    return app_main(args.ui_args)
