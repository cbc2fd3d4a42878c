"""Markdown from the results in bench/results/: a transcribed or printed table, the long-context
table from the planner's committed plans, and the README's figures at a glance."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench.docs.meta import ROOT

RESULTS = ROOT / "bench" / "results"
TABLES = RESULTS / "tables"
GIB = 2 ** 30


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def grid(columns: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; a ``|`` inside a cell is escaped."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") if "\\|" not in str(c) else str(c)
                                 for c in cells) + " |"
    return "\n".join([line(columns), "|" + "---|" * len(columns), *(line(r) for r in rows)])


def relative(path: Path) -> str:
    """The path from the repository root (as given when it lies elsewhere)."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()


def provenance(path: Path, meta: dict[str, str]) -> str:
    rel = relative(path)
    return (f"Results: [`{rel}`](../../{rel}), made at commit `{meta['commit'][:12]}` "
            f"(planner fingerprint `{meta['planner']}`).")


def table(slug: str, level: str = "###") -> str:
    """One transcribed table: its title, the command that reproduces it, the table, its source."""
    path = TABLES / f"{slug}.json"
    data = load(path)
    command = data["meta"].get("command", "").strip()
    parts = [f"{level} {data['title']}", ""]
    if command:
        parts += ["```", command, "```", ""]
    if data.get("note"):
        parts += [data["note"], ""]
    parts += [grid(data["columns"], data["rows"]), "", provenance(path, data["meta"])]
    return "\n".join(parts)


# -- long context, from the planner's committed plans ---------------------------------------------

PLANS = RESULTS / "gpu_plans.json"
PUBLISHED = TABLES / "unsloth_context.json"  # Unsloth's published longest lengths, for comparison


def _longest_rows() -> list[tuple[str, dict[str, Any]]]:
    plans = load(PLANS)["plans"]
    rows = []
    for key, value in plans.items():
        parts = key.split(":")
        if parts[0] == "card" and parts[-1] == "longest":
            rows.append((parts[1], value["value"]))
    return sorted(rows, key=lambda r: r[1]["budget_bytes"])


def longest_table() -> str:
    """The longest length per card from ``bench/results/gpu_plans.json``: what ``plan --longest``
    answered when the plans were traced (the GPU check runs the same answers on a card)."""
    published = load(PUBLISHED)
    unsloth = dict(published["rows"])
    rows = []
    for card, v in _longest_rows():
        switches = ", ".join(f"{k}={w}" for k, w in v["switches"].items())
        base = unsloth.get(card)
        ratio = f"{v['seq_len'] / base:.2f}x" if base else "-"
        how = (f"trace ({v['traces']} traces)" if v.get("confirmed_by_trace")
               else "closed-form estimate, no trace")
        usable = min(v["seq_len"], v["context_len"])
        kept = v.get("margin_bytes", 0) + v.get("reserve_margin_bytes", 0)
        rows.append([f"{card} ({v['budget_bytes'] / 1e9:.2f} GB)", f"{v['seq_len']:,}", f"{usable:,}",
                     f"{v['peak_bytes'] / 1e9:.2f}", f"{v['host_bytes'] / 1e9:.1f}",
                     str(v["micro_batch"]), how, v.get("bound", "-"), f"{kept / 1e9:.3f}",
                     switches, f"{base:,}" if base else "-", ratio])
    columns = ["card (memory)", "longest", "usable (capped at context)", "peak GB", "host GB",
               "micro-batch", "confirmed by", "stopped by", "margin kept GB", "switches",
               "Unsloth (published)", "vs Unsloth"]
    meta = load(PLANS)["meta"]
    return "\n".join([grid(columns, rows), "", provenance(PLANS, meta),
                      f"Unsloth's figures: {published['meta']['made_by']}."])


# -- the README's figures at a glance -------------------------------------------------------------

def _percents(cells: list[str]) -> tuple[float, float]:
    values = [float(m.group(0)) for c in cells for m in [re.search(r"[-+]?\d+(\.\d+)?", c)] if m]
    return min(values), max(values)


def _column(slug: str, name: str) -> list[str]:
    data = load(TABLES / f"{slug}.json")
    at = data["columns"].index(name)
    return [row[at] for row in data["rows"]]


def figures() -> str:
    """A small table: one figure per question, each linking to its page."""
    low, high = _percents(_column("h200_allocated", "error"))
    run_low, run_high = _percents(_column("run_predicted_vs_measured", "error"))
    longest = {card: v for card, v in _longest_rows()}
    context = ", ".join(f"{c}: {v['seq_len']:,} tokens" for c, v in longest.items())
    targets = load(TABLES / "targets.json")["rows"]
    met = sum(row[2].startswith("met") for row in targets)
    pages = load(TABLES / "many_pages.json")
    busy = [row for row in pages["rows"] if row[1].startswith("20")]
    ticks = [float(row[3]) for row in busy]
    peers = load(TABLES / "image_peer_targets.json")["rows"]
    speed = ", ".join(f"{row[0]} {row[2].split()[0]}" for row in peers)
    video = load(TABLES / "video_plans.json")
    wan14 = next(r for r in video["rows"] if r[:2] == ["wan2.1-t2v-14b", "832x480x81"])
    rows = [
        ["Memory on a card: plan vs an H200's allocator",
         f"{low:+.1f}%...{high:+.1f}% on {len(_column('h200_allocated', 'error'))} rows",
         "[memory on a card](docs/results/memory-on-a-card.md)"],
        ["Prediction accuracy: a run's plan vs its measured peak (CPU)",
         f"{run_low:+.2f}%...{run_high:+.2f}%",
         "[prediction accuracy](docs/results/prediction-accuracy.md)"],
        ["Long context: Llama-3.1-8B nf4 r32, longest length `plan --longest` answers", context,
         "[long context](docs/results/long-context.md)"],
        ["Peers and speed: targets against TRL and diffusers' scripts", f"{met} of {len(targets)} met",
         "[peers and speed](docs/results/peers-and-speed.md)"],
        ["Images: images/s against diffusers' own LoRA scripts' fastest", speed,
         "[images](docs/results/images.md)"],
        ["Video: Wan 2.1 14B at 832x480x81 with gradient checkpointing, planned peak and the "
         "smallest card", f"{wan14[5]} GB, {wan14[6]}", "[video](docs/results/video.md)"],
        ["The dashboard: 20 pages on one live run, a tick's median", f"{min(ticks):.0f}-{max(ticks):.0f} ms",
         "[the dashboard](docs/results/dashboard.md)"],
    ]
    return grid(["question", "figure", "page"], rows)
