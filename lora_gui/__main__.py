"""Command line: ``lora-gui`` (or ``python -m lora_gui``) ``train | plan | compare | settings |
generate | export | queue | ui``.

The CLI and the UI call the same engine functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from lora_gui.cli_plan import cmd_plan
from lora_gui.cli_settings import add_parser as add_settings_parser
from lora_gui.cli_settings import program, set_help
from lora_gui.cli_summary import summary_lines
from lora_gui.config import ConfigError, parse_set_args
from lora_gui.engine.core.lock import RunDirError
from lora_gui.errors import USER_ERRORS
from lora_gui.presets import load_config

# The engine (torch, transformers, peft: seconds to import) is imported inside each command, so
# --help and a bad setting answer at once.


def _stop_on_signals(stop) -> None:
    """First Ctrl-C / SIGTERM asks the loop to checkpoint and stop; a second one kills. Under a
    launcher (several processes) every rank gets the terminal's Ctrl-C and the launcher's forwarded
    signal at once, so the handler stays: the launcher's own kill timeout is the hard stop."""
    from lora_gui.engine.core.distributed import launched_world_size

    launched = launched_world_size() > 1

    def handler(signum, _frame):
        if stop.is_set() and launched:
            return
        logging.getLogger("lora_gui").warning("signal %d: saving a checkpoint and stopping "
                                              "(press Ctrl-C again to abort at once)", signum)
        stop.set()
        if not launched:
            signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


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
    _stop_on_signals(control.stop)
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
    _stop_on_signals(stop)
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
    _stop_on_signals(stop)
    result = run_variants(cfg, variants, Path(args.out), seq_len=lengths[0] if lengths else None,
                          steps=args.steps or DEFAULT_STEPS, eval_samples=args.eval_samples,
                          overwrite=args.overwrite, stop=stop, progress=not args.quiet and not args.json)
    if args.json:
        print(json.dumps(result["rows"], indent=1))
    else:
        print(format_variants_table(result["rows"]))
        print(f"\nrows: {Path(args.out) / 'compare.json'}, {Path(args.out) / 'compare.csv'}")
    return 130 if stop.is_set() else 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Base and adapter outputs of a run from one prompt (text: streamed; image: two PNGs)."""
    from lora_gui.engine.generate import ImageTrial, TextTrial, open_run

    run = open_run(args.run)
    if run.cfg.task == "image":
        out = Path(args.out or run.out / "try")
        out.mkdir(parents=True, exist_ok=True)
        base, tuned = ImageTrial(run).pictures(args.prompt, seed=args.seed, scale=args.scale,
                                               steps=args.steps)
        base.save(out / "base.png")
        tuned.save(out / "adapter.png")
        print(f"base: {out / 'base.png'}")
        print(f"adapter (LoRA scale {args.scale:g}): {out / 'adapter.png'}")
        return 0
    trial = TextTrial(run)
    for label, adapter in (("base", False), ("adapter", True)):
        print(f"--- {label} ---", flush=True)
        shown = ""
        for text in trial.stream(args.prompt, adapter=adapter, max_new_tokens=args.max_new_tokens,
                                 temperature=args.temperature, seed=args.seed):
            print(text[len(shown):], end="", flush=True)
            shown = text
        print(flush=True)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from lora_gui.engine.export import export_run

    out = export_run(args.run, args.out, merged=args.merged, gguf=args.gguf)
    what = "merged model" if args.merged else "adapter"
    what = f"GGUF ({args.gguf}) with a Modelfile" if args.gguf else what
    print(f"{what} exported to {out}")
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    """Runs waiting for the card: see engine/queue_cli.py."""
    from lora_gui.engine.queue_cli import run

    stop = threading.Event()
    if args.queue_command == "run":
        _stop_on_signals(stop)
    return run(args, lambda line: print(line, flush=True), stop)


def cmd_ui(args: argparse.Namespace) -> int:
    from app import main as app_main

    return app_main(args.ui_args)


def build_parser() -> argparse.ArgumentParser:
    from lora_gui.cards import card_names

    parser = argparse.ArgumentParser(prog=program(), description="LoRA training that fits.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
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
    add_settings_parser(sub)
    plan = sub.add_parser("plan", help="predict peak memory and batch sizes before a run (CPU only)")
    plan.add_argument("--preset", help="presets/NAME.yaml or a path")
    plan.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help())
    plan.add_argument("--budget-gb", type=float,
                      help="VRAM budget in decimal GB (1 GB = 1e9 bytes; default: the budget_gb setting, "
                           "this GPU, else a 24 GB card)")
    plan.add_argument("--budget-gib", type=float,
                      help="VRAM budget in GiB (1 GiB = 2**30 bytes), instead of --budget-gb")
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
                      help="--longest on cuda: leave the CUDA context (920 MiB) out of the budget, "
                           "as published figures do")
    plan.add_argument("--estimate-only", action="store_true",
                      help="--longest: the closed-form estimate only (instant; not confirmed by the trace)")
    plan.add_argument("--count-unconfirmed", action="store_true",
                      help="--longest: count memory savings no card has confirmed yet instead of keeping "
                           "them as a margin (see the answer's note)")
    plan.add_argument("--beyond-context", action="store_true",
                      help="--longest: search past the model's context (only for runs that extend it)")
    plan.set_defaults(func=cmd_plan)
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
    gen = sub.add_parser("generate", help="base and adapter outputs of a finished run, side by side")
    gen.add_argument("--run", required=True, help="run folder (with adapter/)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=64, help="text: tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.7, help="text: 0 = greedy")
    gen.add_argument("--seed", type=int, default=0, help="the same seed for base and adapter")
    gen.add_argument("--scale", type=float, default=1.0, help="image: LoRA scale")
    gen.add_argument("--steps", type=int, help="image: denoising steps (default: the run's sample_steps)")
    gen.add_argument("--out", help="image: folder for base.png and adapter.png (default RUN/try)")
    gen.set_defaults(func=cmd_generate)
    exp = sub.add_parser("export", help="copy the adapter with a model card, or save a merged model")
    exp.add_argument("--run", required=True, help="run folder (with adapter/)")
    exp.add_argument("--out", required=True, help="new or empty folder")
    exp.add_argument("--merged", action="store_true",
                     help="text: base + adapter merged, safetensors (AutoModelForCausalLM.from_pretrained)")
    exp.add_argument("--gguf", nargs="?", const="f16", choices=("f16", "bf16", "q8_0"),
                     help="text: the merged model as GGUF (default f16) for llama.cpp / Ollama, the "
                          "adapter alone as a GGUF LoRA where possible, and an Ollama Modelfile")
    exp.set_defaults(func=cmd_export)
    from lora_gui.engine.queue_cli import add_parser as add_queue_parser

    add_queue_parser(sub).set_defaults(func=cmd_queue)
    ui = sub.add_parser("ui", help="open the web dashboard (same as python app.py)")
    ui.add_argument("ui_args", nargs=argparse.REMAINDER)
    ui.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
