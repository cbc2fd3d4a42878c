"""Command line: ``lora-gui`` (or ``python -m lora_gui``) ``train | settings | plan | compare |
generate | export | queue | ui``, one module per command, each with its arguments
(``add_parser``) and what it does.

The CLI and the UI call the same engine functions. The engine (torch, transformers, peft: seconds
to import) is imported inside each command, so --help and a bad setting answer at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from lora_gui.cli import compare, export, generate, plan, queue, settings, train, ui
from lora_gui.errors import USER_ERRORS

COMMANDS = (train, settings, plan, compare, generate, export, queue, ui)  # in the order --help lists


def build_parser() -> argparse.ArgumentParser:
    """Every command's arguments; each command's function is its parser's ``func`` default."""
    parser = argparse.ArgumentParser(prog=settings.program(), description="LoRA training that fits.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command; a user error is printed as one line and gives exit status 2."""
    args = build_parser().parse_args(argv)
    # before torch starts CUDA: the allocator the plans model (kept if the user set it)
    from lora_gui.memory.runtime.alloc_conf import use_expandable_segments

    use_expandable_segments()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except USER_ERRORS as err:
        if os.environ.get("RANK", "0") == "0":  # every rank of a launch raises it: say it once
            print(f"error: {err}", file=sys.stderr)
        return 2
