"""``lora-gui export``: a finished run's adapter with a model card, a merged text model, or GGUF
for llama.cpp / Ollama (engine/export/)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``export`` subcommand on ``sub`` (the CLI's subparsers)."""
    exp = sub.add_parser("export", help="copy the adapter with a model card, or save a merged model")
    exp.add_argument("--run", required=True, help="run folder (with adapter/)")
    exp.add_argument("--out", required=True, help="new or empty folder")
    exp.add_argument("--merged", action="store_true",
                     help="text: base + adapter merged, safetensors (AutoModelForCausalLM.from_pretrained)")
    exp.add_argument("--gguf", nargs="?", const="f16", choices=("f16", "bf16", "q8_0"),
                     help="text: the merged model as GGUF (default f16) for llama.cpp / Ollama, the "
                          "adapter alone as a GGUF LoRA where possible, and an Ollama Modelfile")
    exp.set_defaults(func=cmd_export)
    return exp


def cmd_export(args: argparse.Namespace) -> int:
    from lora_gui.engine.export.run_export import export_run

    out = export_run(args.run, args.out, merged=args.merged, gguf=args.gguf)
    what = "merged model" if args.merged else "adapter"
    what = f"GGUF ({args.gguf}) with a Modelfile" if args.gguf else what
    print(f"{what} exported to {out}")
    return 0
