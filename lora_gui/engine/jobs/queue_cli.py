"""``python -m lora_gui queue add | list | run | cancel | move | sweep``: the queue from a
terminal (the commands' arguments and what each does; the CLI prints what ``say`` is given)."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from lora_gui.config import ConfigError, parse_set_args
from lora_gui.engine.jobs.queue_file import Entry, Queue
from lora_gui.presets import load_config

DEFAULT_RUNS = "runs"  # the dashboard's runs folder, relative to where it is started


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``queue`` command and its sub-commands."""
    queue = sub.add_parser("queue", help="runs waiting for the card: add, list, run, cancel, move, sweep")
    cmds = queue.add_subparsers(dest="queue_command", required=True)

    def with_runs(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--runs", default=DEFAULT_RUNS, help="the runs folder (holds queue.json)")
        return p

    def with_settings(p: argparse.ArgumentParser) -> None:
        p.add_argument("--preset", help="presets/NAME.yaml or a path")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one setting (repeatable)")
        p.add_argument("--processes", type=int, default=1, help="processes (GPUs) of the run")
        p.add_argument("--fsdp", action="store_true",
                       help="several processes: shard the frozen weights (FSDP) instead of replicating")
        p.add_argument("--offload", action="store_true", help="with --fsdp: the shards in host memory")

    add = with_runs(cmds.add_parser("add", help="check a run and queue it (its run folder is reserved)"))
    with_settings(add)
    add.add_argument("--name", required=True, help="run name: its folder under --runs")
    with_runs(cmds.add_parser("list", help="the queue in order, with states")).add_argument(
        "--json", action="store_true", help="print the entries as JSON")
    with_runs(cmds.add_parser("run", help="run the queue to its end in the foreground (Ctrl-C: stop "
                                          "the current run, start no more)"))
    cancel = with_runs(cmds.add_parser("cancel", help="cancel a queued run (a started one is asked to stop)"))
    cancel.add_argument("entry", help="entry id or run name (see queue list)")
    move = with_runs(cmds.add_parser("move", help="move a queued run to a position (1 = next)"))
    move.add_argument("entry", help="entry id or run name")
    move.add_argument("position", type=int)
    sweep = with_runs(cmds.add_parser("sweep", help="queue one run per value of a setting"))
    with_settings(sweep)
    sweep.add_argument("--sweep", required=True, metavar="KEY=V1,V2,...",
                       help="the setting and its values, e.g. lr=1e-4,2e-4,4e-4")
    sweep.add_argument("--name", required=True, help="base run name: runs are named NAME-KEY-VALUE")
    return queue


def describe(entries: list[Entry]) -> list[str]:
    """The queue as lines: position, id, state, run name, sweep, message."""
    if not entries:
        return ["the queue is empty"]
    lines = [f"{'#':>3}  {'id':8}  {'state':9}  {'run':30}  message"]
    for i, e in enumerate(entries, 1):
        sweep = f" [sweep {e.sweep}]" if e.sweep else ""
        lines.append(f"{i:>3}  {e.id:8}  {e.state:9}  {e.name + sweep:30}  {e.message}")
    return lines


def run(args: argparse.Namespace, say: Callable[[str], None], stop: threading.Event) -> int:
    """Runs one ``queue`` sub-command; user errors are raised for the CLI to print."""
    from lora_gui.engine.jobs import queue_runner as runner  # torch and the engine: seconds to import

    root = Path(args.runs)
    what = args.queue_command
    if what == "add":
        cfg = load_config(args.preset, parse_set_args(args.set))
        entry = runner.add(root, cfg, args.name, args.processes, fsdp=args.fsdp, offload=args.offload)
        position = [e.id for e in Queue(root).entries()].index(entry.id) + 1
        say(f"queued {entry.label()} at position {position} in {Queue(root).path}")
    elif what == "sweep":
        key, sep, values = args.sweep.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--sweep {args.sweep!r}: expected KEY=V1,V2,...")
        cfg = load_config(args.preset, parse_set_args(args.set))
        entries = runner.sweep(root, cfg, key.strip(), values, args.name, args.processes, fsdp=args.fsdp,
                               offload=args.offload)
        say(f"queued a sweep of {key.strip()} ({entries[0].sweep}): "
            + ", ".join(e.label() for e in entries))
    elif what == "list":
        entries = Queue(root).entries()
        if args.json:
            say(json.dumps([asdict(e) for e in entries], indent=1))
        else:
            say("\n".join(describe(entries)))
    elif what == "cancel":
        say(runner.cancel(root, args.entry))
    elif what == "move":
        say(runner.move(root, args.entry, args.position))
    elif what == "run":
        from lora_gui.engine.jobs.manager import JobManager

        failed = runner.run_to_end(JobManager(), root, say, stop)
        say("\n".join(describe(Queue(root).entries())))
        return 1 if failed else (130 if stop.is_set() else 0)
    return 0
