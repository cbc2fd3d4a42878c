"""``lora-gui queue add | list | run | cancel | move | sweep``: runs waiting for the card. The
sub-commands' arguments and what each does are the queue's own (engine/jobs/queue_cli.py); this
module prints what they say and stops ``queue run`` on Ctrl-C."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from lora_gui.cli.signals import stop_on_signals


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``queue`` subcommand and its sub-commands on ``sub`` (the CLI's subparsers)."""
    from lora_gui.engine.jobs.queue_cli import add_parser as add_queue_parser

    queue = add_queue_parser(sub)
    queue.set_defaults(func=cmd_queue)
    return queue


def cmd_queue(args: argparse.Namespace) -> int:
    """Runs waiting for the card: see engine/jobs/queue_cli.py."""
    from lora_gui.engine.jobs.queue_cli import run

    stop = threading.Event()
    if args.queue_command == "run":
        stop_on_signals(stop)
    return run(args, lambda line: print(line, flush=True), stop)
