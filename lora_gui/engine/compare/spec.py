"""Traditional vs optimized, measured: the same data and steps under every mode, per length.

For every sequence length the comparison trains real runs through :func:`train_text` (one run a
row, config overrides only) under these modes:

- ``traditional``: every sample padded to the length, eager attention, one fixed batch;
- ``strong_baseline``: padded to the longest sample of the batch (multiple of 8, length-grouped
  like the Trainer's ``group_by_length``) + SDPA: what a careful Hugging Face Trainer user gets;
- ``optimized``: bucketed dynamic sizing, SDPA, token-budgeted (or, under a budget, planned)
  micro-batches, gradient checkpointing and the chunked loss;
- ``ablation:NAME``: one optimization switched on alone over traditional (memory question).

Two questions, labelled in every row:

- ``memory`` (same work): every mode trains the same samples with the same samples per optimizer
  step; the row's peak is what that work needs;
- ``speed`` (same budget): every mode gets the same simulated (CPU) or real (CUDA) VRAM budget
  (``budget_gb``, or traditional's predicted need at ``batch_size`` plus 5%) and trains ``steps``
  optimizer steps with the largest batch that fits it: traditional and the strong baseline one
  fixed batch for the length (the largest whose traced peak fits), optimized the planner's batch
  at the bucket of the data's median length, longer buckets split into the planner's
  micro-batches. Under a budget, optimized switches gradient checkpointing on only when batch 1
  of the longest bucket does not fit without it (recompute costs ~30% compute and buys nothing
  when the batch fits). Every mode draws its samples from the start of the same seeded order.
  The figure is real (non-padding) tokens/s over the steps after the first (the first carries
  one-off kernel-selection and allocation costs; ``real_tokens_per_s_all_steps`` keeps them).

and two kinds of data (``corpus`` / ``full``, see :mod:`compare_data`). Rows are written to
``compare.json`` and ``compare.csv`` atomically after each one, so an interrupted comparison
resumes from the rows already written. A row that runs out of its budget is recorded as
``OOM at batch N`` with the predicted need, and the comparison goes on.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora_gui.config import ConfigError, RunConfig
from lora_gui.engine.core.checkpoint import write_atomic
from lora_gui.engine.core.lock import holds_run_folder
from lora_gui.memory.meter import GB

log = logging.getLogger(__name__)

QUESTIONS = ("memory", "speed")
LOSS_CHUNK = 1024  # positions per chunk of the optimized rows' loss: 1024 x vocab x 12 bytes at most
SPEED_BUDGET_HEADROOM = 1.05  # default speed budget: traditional's predicted need at batch_size + 5%
CSV_FIELDS = ("question", "data", "mode", "seq_len", "resolution", "status", "message", "batch_size",
              "micro_batch", "steps", "samples", "peak_bytes", "memory_source", "predicted_peak_bytes",
              "budget_bytes", "real_tokens", "padded_tokens", "real_tokens_per_s", "images_per_s",
              "final_loss", "eval_loss", "eval_loss_full_attention", "attention", "precision",
              "measure", "train_seconds", "oom_recovered", "switches")
_OFF = {"attention": "full", "gradient_checkpointing": False, "loss_chunk": 0}
TRADITIONAL = {**_OFF, "mode": "traditional", "batching": "fixed", "attn_backend": "eager"}
PROFILES: dict[str, dict[str, Any]] = {
    "traditional": TRADITIONAL,
    "strong_baseline": {**_OFF, "mode": "optimized", "batching": "bucketed", "attn_backend": "sdpa",
                        "pad_multiple": 8},
    "optimized": {"mode": "optimized", "batching": "bucketed", "attn_backend": "sdpa",
                  "attention": "full", "gradient_checkpointing": True, "loss_chunk": LOSS_CHUNK},
}
ABLATIONS: dict[str, dict[str, Any]] = {  # each switched on alone over traditional
    "bucketed": {"batching": "bucketed"},
    "packed": {"batching": "packed"},
    "sdpa": {"attn_backend": "sdpa"},
    "windowed": {"attention": "windowed"},
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "loss_chunk": {"loss_chunk": LOSS_CHUNK},
}
MAX_SPEED_BATCH = 64  # largest batch the speed question searches (samples per step)
WHOLE_BATCH = ("traditional", "strong_baseline", "ablation:bucketed")  # one micro-batch per step


@dataclass
class CompareSettings:
    """What a comparison measures (saved in compare.json; a resume must match it)."""

    seq_lens: list[int]
    steps: int
    questions: list[str] = field(default_factory=lambda: list(QUESTIONS))
    data_kinds: list[str] = field(default_factory=lambda: ["corpus", "full"])
    ablations: bool = True
    ablation_data: list[str] | None = None  # data kinds that get ablation rows (None: all)
    measure: str = "measured"  # or "predicted": the planner alone
    eval_samples: int = 8
    device: str = "auto"  # predicted: the device to plan for ("cuda" or "cpu"); auto: this one

    def validate(self) -> CompareSettings:
        if not self.seq_lens or any(n < 16 for n in self.seq_lens):
            raise ConfigError(f"--seq-lens: expected lengths of 16 tokens or more, got {self.seq_lens}")
        if self.steps < 1:
            raise ConfigError(f"--steps: expected 1 or more, got {self.steps}")
        for name, values, allowed in (("questions", self.questions, QUESTIONS),
                                      ("data", self.data_kinds, ("corpus", "full"))):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise ConfigError(f"--{name}: {bad or values} not among {', '.join(allowed)}")
        if self.measure not in ("measured", "predicted"):
            raise ConfigError(f"--measure: {self.measure!r} is not measured or predicted")
        return self


@dataclass(frozen=True)
class RowSpec:
    """One row to fill: which question, data, mode, length; its overrides, batch and budget."""

    question: str
    data: str
    mode: str
    seq_len: int
    overrides: dict[str, Any]
    budget_bytes: int | None = None

    @property
    def key(self) -> str:
        return f"{self.question}|{self.data}|{self.mode}|{self.seq_len}"

    @property
    def folder(self) -> str:
        return self.key.replace("|", "-").replace(":", "-")


def row_key(row: dict[str, Any]) -> str:
    size = row.get("seq_len") if row.get("seq_len") is not None else row.get("resolution")
    return f"{row['question']}|{row['data']}|{row['mode']}|{size}"


def mode_overrides(mode: str, seq_len: int, batch_size: int, cfg: RunConfig) -> dict[str, Any]:
    """Config overrides of a mode at a length (profiles above; 'ablation:NAME' over traditional)."""
    if mode.startswith("ablation:"):
        name = mode.split(":", 1)[1]
        if name not in ABLATIONS:
            raise ConfigError(f"unknown ablation {name!r}; known: {', '.join(ABLATIONS)}")
        over = {**TRADITIONAL, **ABLATIONS[name]}
        if name == "windowed":  # the window must be shorter than the sequence
            over.update(window=min(cfg.window, max(1, seq_len // 2)),
                        global_tokens=min(cfg.global_tokens, seq_len // 4))
    else:
        over = dict(PROFILES[mode])
    if mode in WHOLE_BATCH:  # dynamic sizing only, no token-budget micro-batching
        over["token_budget"] = batch_size * seq_len
    return over


def modes_for(question: str, ablations: bool) -> list[str]:
    names = list(PROFILES)
    if question == "memory" and ablations:
        names += [f"ablation:{a}" for a in ABLATIONS]
    return names


# -- files ------------------------------------------------------------------------------------
def _csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in row.items()})
    return buf.getvalue()


def write_results(out: Path, settings: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """compare.json (settings + rows) and compare.csv, each replaced atomically."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "compare.json", json.dumps({"settings": settings, "rows": rows}, indent=1))
    write_atomic(out / "compare.csv", _csv_text(rows))


def load_results(path: Path) -> dict[str, Any]:
    """Reads a compare.json (or the compare.json in a folder); errors name the file."""
    path = Path(path)
    if path.is_dir():
        path = path / "compare.json"
    if not path.is_file():
        raise ConfigError(f"{path}: no compare.json here (run `python -m lora_gui compare`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not a compare.json ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ConfigError(f"{path}: expected an object with a 'rows' list")
    return data


def _resume_rows(out: Path, settings: dict[str, Any], overwrite: bool) -> list[dict[str, Any]]:
    path = out / "compare.json"
    if overwrite or not path.is_file():
        return []
    saved = load_results(path)
    if saved.get("settings") != settings:
        raise ConfigError(f"{path}: holds a comparison with other settings; pass --overwrite to "
                          "replace it or choose another --out")
    return saved["rows"]


# -- the runner ---------------------------------------------------------------------------------
@dataclass
class Comparison:
    """State of one comparison while it runs: settings, rows so far, where they go."""

    base: RunConfig
    settings: CompareSettings
    out: Path
    stop: threading.Event = field(default_factory=threading.Event)
    on_row: Callable[[dict[str, Any]], None] | None = None
    progress: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)

    def saved_settings(self) -> dict[str, Any]:
        return {**self.settings.__dict__, "config": self.base.to_dict()}

    def add(self, row: dict[str, Any]) -> None:
        self.rows = [r for r in self.rows if row_key(r) != row_key(row)] + [row]
        write_results(self.out, self.saved_settings(), self.rows)
        if self.on_row:
            self.on_row(row)

    def done(self) -> set[str]:
        return {row_key(r) for r in self.rows}


@holds_run_folder("out")  # one writer per folder, as a training run
def run_comparison(base: RunConfig, settings: CompareSettings, out: str | Path, *,
                   overwrite: bool = False, stop: threading.Event | None = None,
                   on_row: Callable[[dict[str, Any]], None] | None = None,
                   progress: bool = False) -> dict[str, Any]:
    """Fills (or resumes) ``out/compare.json`` and ``compare.csv``; returns {settings, rows}.

    Args:
        base: the run settings every row starts from (preset + --set); each mode overrides only
            its switches, the length, the data file and the batch.
        settings: lengths, steps, questions, data kinds, ablations, measured or predicted.
        out: output folder (compare.json, compare.csv, data/, runs/).
        overwrite: start again instead of resuming rows already in out/compare.json.
        stop: set it to stop after the row in progress (rows written so far are kept).
        on_row: called with every new row.
    """
    if settings.measure == "predicted":  # the planner knows shapes, not documents or speed
        settings.questions, settings.data_kinds = ["memory"], ["full"]
    settings.validate()
    if base.task != "text":
        raise ConfigError(f"task: compare --seq-lens runs text presets; {base.task!r} needs --resolutions")
    cmp = Comparison(base, settings, Path(out), stop or threading.Event(), on_row, progress)
    cmp.rows = _resume_rows(cmp.out, cmp.saved_settings(), overwrite)
    if settings.measure == "predicted":
        from lora_gui.engine.compare.text_rows import predicted_rows

        predicted_rows(cmp)
    else:
        from lora_gui.engine.compare.text_rows import measured_rows

        measured_rows(cmp)
    write_results(cmp.out, cmp.saved_settings(), cmp.rows)
    return {"settings": cmp.saved_settings(), "rows": cmp.rows}


def iter_specs(settings: CompareSettings) -> Iterator[tuple[str, str, int, str]]:
    """(question, data, seq_len, mode) in the order rows are filled: length by length."""
    for seq_len in settings.seq_lens:
        for data in settings.data_kinds:
            for question in settings.questions:
                ablate = settings.ablations and data in (settings.ablation_data or [data])
                for mode in modes_for(question, ablate):
                    yield question, data, seq_len, mode


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of the rows with ratios against traditional of the same group."""
    trad = {(r["question"], r["data"], r.get("seq_len") or r.get("resolution")): r
            for r in rows if r["mode"] == "traditional" and r.get("peak_bytes")}
    lines = [f"{'question':<8} {'data':<6} {'len':>5} {'mode':<30} {'batch':>5} {'peak MiB':>9} "
             f"{'vs trad':>7} {'tok|img/s':>9} {'vs trad':>7} {'eval loss':>9} {'vs trad':>8}  source"]
    for r in rows:
        size = r.get("seq_len") or r.get("resolution")
        t = trad.get((r["question"], r["data"], size), {})
        images = r.get("seq_len") is None  # image rows: images/s with two decimals
        speed_key = "images_per_s" if images else "real_tokens_per_s"
        peak, speed = r.get("peak_bytes"), r.get(speed_key)
        loss = r.get("eval_loss")

        def ratio(a: float | None, b: float | None) -> str:
            return f"{a / b:.2f}x" if a and b else "-"

        base_loss = t.get("eval_loss")
        loss_vs = f"{loss / base_loss - 1:+.2%}" if loss and base_loss else "-"
        status = "" if r.get("status") == "ok" else f"  [{r.get('message')}]"
        lines.append(
            f"{r['question']:<8} {r['data']:<6} {size!s:>5} {r['mode']:<30} {r.get('batch_size')!s:>5} "
            f"{(peak or 0) / 2**20:>9.1f} {ratio(peak, t.get('peak_bytes')):>7} "
            f"{f'{speed:.2f}' if images and speed else f'{speed:.0f}' if speed else '-':>9} "
            f"{ratio(speed, t.get(speed_key)):>7} "
            f"{f'{loss:.4f}' if loss is not None else '-':>9} "
            f"{loss_vs:>8}"
            f"  {r.get('memory_source')}{status}")
    return "\n".join(lines)


def budget_gb(nbytes: int | None) -> float:
    return nbytes / GB if nbytes else 0.0
