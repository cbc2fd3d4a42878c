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

and two kinds of data (``corpus`` / ``full``, see :mod:`lora_gui.engine.compare.data`). Rows are written to
``compare.json`` and ``compare.csv`` atomically after each one, so an interrupted comparison
resumes from the rows already written. A row that runs out of its budget is recorded as
``OOM at batch N`` with the predicted need, and the comparison goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lora_gui.config import ConfigError, RunConfig
from lora_gui.memory.runtime.meter import GB
from lora_gui.units import gb

log = logging.getLogger(__name__)

QUESTIONS = ("memory", "speed")
LOSS_CHUNK = 1024  # positions per chunk of the optimized rows' loss: 1024 x vocab x 12 bytes at most
SPEED_BUDGET_HEADROOM = 1.05  # default speed budget: traditional's predicted need at batch_size + 5%
CSV_FIELDS = ("question", "data", "mode", "seq_len", "resolution", "status", "message", "batch_size",
              "micro_batch", "steps", "samples", "peak_bytes", "memory_source", "predicted_peak_bytes",
              "budget_bytes", "real_tokens", "padded_tokens", "real_tokens_per_s", "images_per_s",
              "final_loss", "eval_loss", "eval_loss_full_attention", "attention", "precision",
              "measure", "train_seconds", "oom_recovered", "switches")
_OFF = {"attention": "full", "gradient_checkpointing": False, "loss_chunk": 0, "lora_fused": False,
        "lean_backward": "off"}
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
    variants: list[str] | None = None  # compare --variants: the adapters compared

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
    lines = [f"{'question':<8} {'data':<6} {'len':>5} {'mode':<30} {'batch':>5} {'peak GB':>9} "
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
            f"{gb(peak or 0, unit=False):>9} {ratio(peak, t.get('peak_bytes')):>7} "
            f"{f'{speed:.2f}' if images and speed else f'{speed:.0f}' if speed else '-':>9} "
            f"{ratio(speed, t.get(speed_key)):>7} "
            f"{f'{loss:.4f}' if loss is not None else '-':>9} "
            f"{loss_vs:>8}"
            f"  {r.get('memory_source')}{status}")
    return "\n".join(lines)


def budget_gb(nbytes: int | None) -> float:
    return nbytes / GB if nbytes else 0.0
