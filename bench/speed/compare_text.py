"""Issue 7's text measurement in one command: traditional vs strong baseline vs optimized.

    .venv/bin/python -m bench.speed.compare_text [--seq-lens 512,1024,2048] [--steps 2] [--batch 4]

Runs ``python -m lora_gui compare`` with the built-in model and the bundled fine-tune corpus
(text-demo preset, fp32) for both questions (memory at the same work, speed at the same budget)
and both kinds of data (corpus, full), ablations on full data, then prints the table and each
target of the issue as MET or MISSED. Rows go to runs/bench-compare/compare.json and an offline
report to runs/bench-compare/report.html. Memory figures (source: tracker) are deterministic;
tokens/s on a shared machine are not: compare rows of one run.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import torch

from lora_gui.engine.compare.results import load_results
from lora_gui.engine.compare.spec import CompareSettings, format_table
from lora_gui.engine.compare.text_rows import run_comparison
from lora_gui.presets import load_config
from lora_gui.ui.charts import write_compare_report

MEMORY_TARGET = 0.50  # optimized peak / traditional peak, every length
MEMORY_TARGET_LONGEST = 0.35  # at 2048
SPEED_TARGET = {"full": 1.3, "corpus": 3.0}  # optimized real tokens/s / traditional
LOSS_TOLERANCE = 0.02


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def targets(rows: list[dict]) -> list[str]:
    """One line per target and length: the measured ratio and MET / MISSED."""
    by = {(r["question"], r["data"], r["mode"], r["seq_len"]): r for r in rows}
    lines = []
    for data in ("corpus", "full"):
        for n in sorted({r["seq_len"] for r in rows}):
            trad, opt = by.get(("memory", data, "traditional", n)), by.get(("memory", data, "optimized", n))
            if trad and opt and trad.get("peak_bytes") and opt.get("peak_bytes"):
                ratio = opt["peak_bytes"] / trad["peak_bytes"]
                limit = MEMORY_TARGET_LONGEST if n >= 2048 else MEMORY_TARGET
                lines.append(f"memory  {data:<6} {n:>5}: optimized peak {ratio:.1%} of traditional "
                             f"(target <= {limit:.0%}): {_verdict(ratio <= limit)}")
                loss = opt["eval_loss"] / trad["eval_loss"] - 1
                lines.append(f"quality {data:<6} {n:>5}: optimized eval loss {loss:+.2%} vs traditional "
                             f"(target within {LOSS_TOLERANCE:.0%}): {_verdict(abs(loss) <= LOSS_TOLERANCE)}")
            win = by.get(("memory", data, "ablation:windowed", n))
            if trad and win and win.get("eval_loss"):
                own = win["eval_loss"] / trad["eval_loss"] - 1
                full = win["eval_loss_full_attention"] / trad["eval_loss"] - 1
                lines.append(f"windowed {data:<6} {n:>4}: eval loss {own:+.2%} (own window), {full:+.2%} "
                             "(full attention) vs traditional: reported, no target")
            trad, opt = by.get(("speed", data, "traditional", n)), by.get(("speed", data, "optimized", n))
            if trad and opt and trad.get("real_tokens_per_s") and opt.get("real_tokens_per_s"):
                ratio = opt["real_tokens_per_s"] / trad["real_tokens_per_s"]
                lines.append(f"speed   {data:<6} {n:>5}: optimized {ratio:.2f}x traditional real tokens/s "
                             f"at batch {opt['batch_size']} vs {trad['batch_size']} (target >= "
                             f"{SPEED_TARGET[data]}x): {_verdict(ratio >= SPEED_TARGET[data])}")
    return lines


def markdown(rows: list[dict]) -> str:
    """Markdown tables for docs/BENCHMARKS.md: main rows with ratios, then the ablation."""
    trad = {(r["question"], r["data"], r["seq_len"]): r for r in rows if r["mode"] == "traditional"}
    out = ["| question | data | len | mode | batch | peak MiB (tracker) | vs trad | real tokens/s | vs trad "
           "| eval loss | vs trad |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["mode"].startswith("ablation:"):
            continue
        t = trad.get((r["question"], r["data"], r["seq_len"]), {})
        if r["status"] != "ok":
            out.append(f"| {r['question']} | {r['data']} | {r['seq_len']} | {r['mode']} | {r['batch_size']} "
                       f"| {r['message']} | | | | | |")
            continue
        peak, speed, loss = r["peak_bytes"], r["real_tokens_per_s"], r["eval_loss"]
        out.append(f"| {r['question']} | {r['data']} | {r['seq_len']} | {r['mode']} | {r['batch_size']} | "
                   f"{peak / 2**20:,.1f} | {peak / t['peak_bytes']:.1%} | {speed:,.0f} | "
                   f"{speed / t['real_tokens_per_s']:.2f}x | {loss:.4f} | {loss / t['eval_loss'] - 1:+.2%} |"
                   if t.get("peak_bytes") and t.get("real_tokens_per_s") else
                   f"{peak / 2**20:,.1f} | - | {speed:,.0f} | - | {loss:.4f} | - |")
    out += ["", "| data | len | ablation (alone over traditional) | peak MiB | vs trad | real tokens/s | "
            "eval loss (own attention) | eval loss (full attention) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = trad.get(("memory", r["data"], r["seq_len"]), {})
        if r["mode"].startswith("ablation:") and r["status"] == "ok" and t.get("peak_bytes"):
            full = r.get("eval_loss_full_attention")
            out.append(f"| {r['data']} | {r['seq_len']} | {r['mode'].split(':')[1]} | "
                       f"{r['peak_bytes'] / 2**20:,.1f} | {r['peak_bytes'] / t['peak_bytes']:.1%} | "
                       f"{r['real_tokens_per_s']:,.0f} | {r['eval_loss']:.4f} | "
                       f"{f'{full:.4f}' if full else '-'} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="512,1024,2048")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4, help="samples per optimizer step (memory question)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-compare"))
    parser.add_argument("--resume", action="store_true", help="keep rows already in --out")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default); 1 keeps timings stable on a shared machine")
    parser.add_argument("--from-json", type=Path, help="print the tables of an earlier run, run nothing")
    args = parser.parse_args()
    if args.from_json:
        rows = load_results(args.from_json)["rows"]
        print(markdown(rows) + "\n\n" + "\n".join(targets(rows)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    base = load_config("text-demo", {"batch_size": args.batch, "precision": "fp32", "warmup_steps": 0})
    settings = CompareSettings(seq_lens=[int(x) for x in args.seq_lens.split(",")], steps=args.steps,
                               ablation_data=["full"], eval_samples=8)
    result = run_comparison(base, settings, args.out, overwrite=not args.resume, progress=True)
    rows = result["rows"]
    write_compare_report(rows, args.out / "report.html", title="bench.speed.compare_text")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"built-in model, text-demo preset, fp32, {args.steps} steps x {args.batch} samples "
          "(memory question); speed question: same budget, largest batch, same steps\n")
    print(format_table(rows))
    print()
    print("\n".join(targets(rows)))
    print("\n" + markdown(rows))


if __name__ == "__main__":
    main()
