"""``lora-gui compare``: traditional vs optimized per length (text) or resolution (image), the
quick memory-only version, and adapter variants side by side (``--variants``); see
engine/compare/."""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any

from lora_gui.cli.settings import set_help
from lora_gui.cli.signals import stop_on_signals
from lora_gui.config import ConfigError, parse_set_args
from lora_gui.presets import load_config


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``compare`` subcommand on ``sub`` (the CLI's subparsers)."""
    cmp = sub.add_parser("compare", help="traditional vs optimized, measured per length or resolution")
    cmp.add_argument("--preset", help="presets/NAME.yaml or a path")
    cmp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help=f"{set_help()} (every row)")
    cmp.add_argument("--seq-lens", help="text: comma-separated lengths, e.g. 512,1024,2048")
    cmp.add_argument("--resolutions", help="image: comma-separated resolutions, e.g. 512,768")
    cmp.add_argument("--steps", type=int, help="optimizer steps per row (default 20; --quick: 2)")
    cmp.add_argument("--quick", action="store_true",
                     help="memory question only: traditional, strong baseline and optimized on the "
                          "preset's data, a few steps a row (minutes instead of the full comparison)")
    cmp.add_argument("--variants", help="adapters side by side on the same data, steps and budget, e.g. "
                                         "lora,dora,loha,lokr,oft (text; one --seq-lens length, default "
                                         "the preset's max_seq_len; --steps default 20)")
    cmp.add_argument("--out", required=True, help="folder for compare.json, compare.csv and the runs")
    cmp.add_argument("--questions", default="memory,speed", help="memory (same work), speed (same budget)")
    cmp.add_argument("--data", default="corpus,full", help="corpus (real documents), full (filled rows)")
    cmp.add_argument("--no-ablations", action="store_true", help="skip the one-switch-alone rows")
    cmp.add_argument("--ablation-data", help="data kinds that get ablation rows (default: all)")
    cmp.add_argument("--measure", choices=("measured", "predicted"), default="measured",
                     help="predicted: fill the memory rows from the planner alone (big models)")
    cmp.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                     help="--measure predicted: the device to plan for (auto: this machine's)")
    cmp.add_argument("--eval-samples", type=int, default=8, help="held-out samples for eval_loss")
    cmp.add_argument("--overwrite", action="store_true", help="start again instead of resuming --out")
    cmp.add_argument("--html", help="also write a self-contained report page (plotly.js embedded)")
    cmp.add_argument("--json", action="store_true", help="print the rows as JSON")
    cmp.add_argument("--quiet", action="store_true", help="no progress bar")
    cmp.set_defaults(func=cmd_compare)
    return cmp


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated whole numbers, got {text!r}") from None


def cmd_compare(args: argparse.Namespace) -> int:
    """Traditional vs optimized per length (text) or resolution (image): see engine/compare/."""
    from lora_gui.engine.compare.spec import CompareSettings, format_table
    from lora_gui.engine.compare.text_rows import run_comparison

    if args.variants:
        return _compare_variants(args)
    if bool(args.seq_lens) == bool(args.resolutions):
        raise ConfigError("compare: give --seq-lens (text) or --resolutions (image), not both")
    cfg = load_config(args.preset, parse_set_args(args.set))
    stop = threading.Event()
    stop_on_signals(stop)
    if args.quick:
        from lora_gui.engine.compare.quick import QUICK_STEPS, run_quick

        flag = "--resolutions" if args.resolutions else "--seq-lens"
        sizes = _int_list(args.resolutions or args.seq_lens, flag)
        result = run_quick(cfg, sizes, Path(args.out), steps=args.steps or QUICK_STEPS, stop=stop,
                           overwrite=args.overwrite, progress=not args.quiet and not args.json)
    elif args.resolutions:
        from lora_gui.engine.compare.image_rows import run_image_comparison

        result = run_image_comparison(cfg, _int_list(args.resolutions, "--resolutions"), args.steps or 20,
                                      Path(args.out), overwrite=args.overwrite, stop=stop,
                                      progress=not args.quiet and not args.json,
                                      ablations=not args.no_ablations,
                                      questions=tuple(args.questions.split(",")))
    else:
        settings = CompareSettings(
            seq_lens=_int_list(args.seq_lens, "--seq-lens"), steps=args.steps or 20,
            questions=args.questions.split(","), data_kinds=args.data.split(","),
            ablations=not args.no_ablations,
            ablation_data=args.ablation_data.split(",") if args.ablation_data else None,
            measure=args.measure, eval_samples=args.eval_samples,
            device=args.device)
        result = run_comparison(cfg, settings, Path(args.out), overwrite=args.overwrite, stop=stop,
                                progress=not args.quiet and not args.json)
    if args.html:
        from lora_gui.ui.charts import write_compare_report

        write_compare_report(result["rows"], Path(args.html), title=f"lora_gui compare: {args.out}")
    if args.json:
        print(json.dumps(result["rows"], indent=1))
    else:
        print(format_table(result["rows"]))
        print(f"\nrows: {Path(args.out) / 'compare.json'}, {Path(args.out) / 'compare.csv'}"
              + (f"; report: {args.html}" if args.html else ""))
    return 130 if stop.is_set() else 0


def _compare_variants(args: argparse.Namespace) -> int:
    """compare --variants: each adapter variant trained on the same data, steps and budget."""
    from lora_gui.engine.compare.variants import (
        DEFAULT_STEPS,
        format_variants_table,
        parse_variants,
        run_variants,
    )

    variants = parse_variants(args.variants)
    if args.resolutions:
        raise ConfigError("--variants: compares text runs (--seq-lens); drop --resolutions")
    lengths = _int_list(args.seq_lens, "--seq-lens") if args.seq_lens else []
    if len(lengths) > 1:
        raise ConfigError(f"--variants: give one length in --seq-lens, got {args.seq_lens}")
    cfg = load_config(args.preset, parse_set_args(args.set))
    stop = threading.Event()
    stop_on_signals(stop)
    result = run_variants(cfg, variants, Path(args.out), seq_len=lengths[0] if lengths else None,
                          steps=args.steps or DEFAULT_STEPS, eval_samples=args.eval_samples,
                          overwrite=args.overwrite, stop=stop, progress=not args.quiet and not args.json)
    if args.json:
        print(json.dumps(result["rows"], indent=1))
    else:
        print(format_variants_table(result["rows"]))
        print(f"\nrows: {Path(args.out) / 'compare.json'}, {Path(args.out) / 'compare.csv'}")
    return 130 if stop.is_set() else 0
