"""The predicted peak of a text run: the trace of the micro-batches the run will really execute.

The run's micro-batches are computed from its real data with the engine's own batch builders
(``plan_epoch``, the budget caps of :class:`~lora_gui.memory.runtime.guard.BatchCaps`, the per-rank
split of :func:`~lora_gui.data.shard.split_step`): their sizes, padded lengths, whether a row
has padding (a 2D attention mask reaches the model and a (B, 1, S, S) mask is built) or holds
several packed documents (a block-diagonal mask from the position ids), and whether LoRA
gradients already exist (every micro-batch after the first of an accumulated step). Every
shape that no other shape dominates is traced (:func:`~lora_gui.memory.predict.trace.trace_text_step`)
and the largest peak is the prediction. Without the data (a bundled architecture without a
tokenizer) the worst case is taken: the largest micro-batch at ``max_seq_len`` with a mask.

The training engine, ``python -m lora_gui plan`` and the dashboard call :func:`predict_text_run`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.data.batching import MicroBatch, Step, plan_epoch
from lora_gui.data.model_inputs import CAUSAL_KERNEL_BACKENDS
from lora_gui.data.shard import split_step
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.parallel import Parallel, per_gpu
from lora_gui.memory.predict.run_plan import model_config_for, plan_run, step_kwargs
from lora_gui.memory.predict.trace import TraceResult, trace_text_step
from lora_gui.memory.runtime.guard import BatchCaps
from lora_gui.units import gb

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class MicroShape:
    """What memory depends on in one micro-batch of the run."""

    batch_size: int  # rows
    seq_len: int  # padded tokens per row
    mask: str  # 'none', 'padding' or 'packed' (see trace_text_step)
    grads_before: bool  # LoRA gradients exist before its forward (not the step's first)

    def dominates(self, other: MicroShape) -> bool:
        """True when this shape needs at least the memory of ``other`` (every size >=, and the
        same mask or ``other`` has none)."""
        return (self.batch_size >= other.batch_size and self.seq_len >= other.seq_len
                and self.grads_before >= other.grads_before
                and (self.mask == other.mask or other.mask == "none"))


@dataclass
class RunPrediction:
    """The predicted peak of a run (source: predicted) and the micro-batch it comes from.

    Attributes:
        peak_bytes: predicted peak per GPU (CUDA overheads included when ``device`` is cuda).
        device: the device the plan is for ('cuda' or 'cpu').
        kernel: attention kernel of the peak micro-batch on that device (e.g. ``sdpa_flash``,
            ``sdpa_memory_efficient``, ``sdpa_flash_cpu``, ``eager``, ``windowed``).
        shape: the peak micro-batch.
        from_data: True when the shapes come from the run's real data (else a worst case).
        shapes: distinct micro-batch shapes of the run; traced: how many were traced.
        caps: micro-batch cap per padded length under the budget (empty: no cap).
        step: the trace of the peak micro-batch.
    """

    peak_bytes: int
    device: str
    kernel: str
    shape: MicroShape
    from_data: bool
    shapes: int
    traced: int
    step: TraceResult
    caps: dict[int, int] = field(default_factory=dict)
    source: str = "predicted"

    def to_json(self) -> dict[str, Any]:
        """The figures run.json and ``plan --json`` show."""
        return {"peak_bytes": self.peak_bytes, "source": self.source, "device": self.device,
                "kernel": self.kernel, "batch_size": self.shape.batch_size,
                "seq_len": self.shape.seq_len, "mask": self.shape.mask,
                "grads_before": self.shape.grads_before, "from_data": self.from_data,
                "shapes": self.shapes, "traced": self.traced,
                "host_bytes": self.step.info.get("host_bytes", 0)}  # per process, off the device


def padding_mask_kept(cfg: RunConfig) -> bool:
    """Whether a right-padded batch reaches the model with its mask: the engine drops it where
    the attention kernel is causal without one (:mod:`lora_gui.data.model_inputs`)."""
    return cfg.attention == "windowed" or cfg.resolved_attn_backend() not in CAUSAL_KERNEL_BACKENDS


def _mask_of(mb: MicroBatch, lengths: Sequence[int], keeps_mask: bool = True) -> str:
    if mb.packed:  # one row; the position ids restart per document and at its padding
        filled = sum(min(lengths[i], mb.seq_len) for i in mb.indices)
        return "packed" if len(mb.indices) > 1 or filled < mb.seq_len else "none"
    padded = any(min(lengths[i], mb.seq_len) < mb.seq_len for i in mb.indices)
    return "padding" if padded and keeps_mask else "none"


def run_steps(cfg: RunConfig, lengths: Sequence[int], caps: BatchCaps,
              world_size: int = 1) -> Iterator[Step]:
    """Every rank's share of every optimizer step the run executes (from step 0), cut as the
    engine cuts them: the epoch plan (the budget's caps replace the token budget), the caps,
    the per-rank split."""
    batching = cfg.resolved_batching()
    token_budget = cfg.batch_size * cfg.max_seq_len if caps.caps else cfg.sample_token_budget()
    per_epoch = math.ceil(len(lengths) / cfg.batch_size)
    total = cfg.max_steps or per_epoch * cfg.epochs
    for epoch in range(math.ceil(total / per_epoch)):
        plan = plan_epoch(lengths, batching, batch_size=cfg.batch_size, max_seq_len=cfg.max_seq_len,
                          seed=cfg.seed, epoch=epoch, token_budget=token_budget,
                          pad_multiple=cfg.pad_multiple, packed_row=cfg.packed_row_tokens())
        for step in plan[: total - epoch * per_epoch]:
            yield from split_step(caps.apply(step), world_size, lengths, batching=batching,
                                  max_seq_len=cfg.max_seq_len, pad_multiple=cfg.pad_multiple,
                                  token_budget=token_budget,
                                  cap_for_len=caps.cap if caps.caps else None,
                                  packed_row=cfg.packed_row_tokens())


def micro_shapes(cfg: RunConfig, lengths: Sequence[int], caps: BatchCaps,
                 world_size: int = 1) -> set[MicroShape]:
    """The distinct micro-batch shapes of the run."""
    keeps_mask = padding_mask_kept(cfg)
    shapes = set()
    for step in run_steps(cfg, lengths, caps, world_size):
        for k, mb in enumerate(step.micro_batches):
            rows = 1 if mb.packed else len(mb.indices)
            # a pair's two rows rarely share a length: a kept mask always has padding (err high)
            mask = "padding" if keeps_mask and cfg.is_preference else _mask_of(mb, lengths, keeps_mask)
            shapes.add(MicroShape(rows, mb.seq_len, mask, k > 0))
    return shapes


def dominant(shapes: set[MicroShape]) -> list[MicroShape]:
    """The shapes no other shape dominates (only these can hold the peak)."""
    return sorted(s for s in shapes if not any(o != s and o.dominates(s) for o in shapes))


def worst_case_shapes(cfg: RunConfig, caps: BatchCaps, world_size: int = 1) -> set[MicroShape]:
    """Without the data: the largest micro-batch each padded length allows, with a mask and
    the gradients of earlier micro-batches present (err high)."""
    per_rank = max(1, -(-cfg.batch_size // world_size))
    batching = cfg.resolved_batching()
    if batching == "packed":
        return {MicroShape(1, cfg.packed_row_tokens(), "packed", True)}
    token_budget = cfg.batch_size * cfg.max_seq_len if caps.caps else cfg.sample_token_budget()
    lengths = sorted({cfg.max_seq_len, *caps.caps}) if batching != "fixed" else [cfg.max_seq_len]
    out = set()
    for n in (s for s in lengths if s <= cfg.max_seq_len):
        rows = per_rank if batching == "fixed" else min(per_rank, max(1, token_budget // n))
        rows = min(rows, caps.cap(n) or rows)
        out.add(MicroShape(rows, n, "padding" if padding_mask_kept(cfg) else "none", rows < per_rank))
    return out


def train_samples(cfg: RunConfig, source: str) -> tuple[list[Any], int, bool]:
    """(the run's training samples, the tokenizer's length, whether the data is chat), read,
    split and tokenized as the engine does (a chat template may add tokens); a preference run's
    samples are its pairs."""
    from lora_gui.data.training_data import load_samples
    from lora_gui.models.text import load_tokenizer

    tokenizer = load_tokenizer(source)
    if cfg.is_preference:  # pairs: a sample's length is its longer answer's row
        from lora_gui.data.pairs import load_pairs

        pairs = load_pairs(cfg.data_path(), tokenizer, max_seq_len=cfg.max_seq_len,
                           eval_fraction=cfg.eval_fraction, seed=cfg.seed,
                           chat_template=cfg.chat_template, long_pairs=cfg.long_pairs)
        return list(pairs.train), len(tokenizer), True
    loaded = load_samples(cfg.data_path(), tokenizer, data_format=cfg.data_format,
                          max_seq_len=cfg.max_seq_len, eval_fraction=cfg.eval_fraction, seed=cfg.seed,
                          chat_template=cfg.chat_template, train_on_prompt=cfg.train_on_prompt)
    return list(loaded.train), len(tokenizer), loaded.is_chat


def data_lengths(cfg: RunConfig, source: str) -> tuple[list[int], int, bool]:
    """(token lengths of the run's training samples, the tokenizer's length, whether the data is
    chat), read, split and tokenized as the engine does (a chat template may add tokens)."""
    samples, tokenizer_len, is_chat = train_samples(cfg, source)
    return [len(s) for s in samples], tokenizer_len, is_chat


def added_rows(config: Any, tokenizer_len: int, is_chat: bool) -> int:
    """Embedding rows a chat run adds for its template's tokens (models.text.fit_embeddings)."""
    return max(0, tokenizer_len - config.get_text_config().vocab_size) if is_chat else 0


def _source_for(cfg: RunConfig, source: str | None) -> str | None:
    """The model's tokenizer source, or None for a bundled architecture (shapes only)."""
    from lora_gui.memory.predict.model_configs import bundled_models

    if cfg.model in bundled_models():
        return None
    if source is None:
        from lora_gui.models.text import resolve_model_source

        source = resolve_model_source(cfg.model)
    return source


def budget_caps(cfg: RunConfig, budget_bytes: int | None, device: str, source: str | None,
                parallel: Parallel | None) -> BatchCaps:
    """The planner's micro-batch cap per length bucket under the budget (bucketed runs only:
    the adaptive batch); no caps otherwise."""
    caps = BatchCaps()
    if budget_bytes and cfg.resolved_batching() == "bucketed":
        plan = plan_run(cfg, budget_bytes, device, source, parallel=parallel)
        caps.caps = {int(b.bucket): max(1, b.micro_batch) for b in plan.buckets}
    return caps


def predict_text_run(cfg: RunConfig, device: str = "cuda", source: str | None = None, *,
                budget_bytes: int | None = None, lengths: Sequence[int] | None = None,
                parallel: Parallel | None = None, caps: BatchCaps | None = None,
                added_tokens: int | None = None) -> RunPrediction:
    """Predicted peak of the run on ``device``: the worst micro-batch it will execute, traced.

    Args:
        cfg: the run's settings.
        device: 'cuda' (the default for planning) or 'cpu' (what a CPU run measures).
        source: the model's resolved source (default: resolved from ``cfg.model``).
        budget_bytes: VRAM budget; bucketed runs get the planner's caps under it.
        lengths: token lengths of the training samples (default: tokenized from the data; a
            bundled architecture without a tokenizer gets the worst case).
        parallel: several processes (and FSDP): the prediction is per GPU.
        caps: the caps to use instead of planning them under ``budget_bytes``.
        added_tokens: embedding rows the run adds for a chat template's tokens (default: read
            from the data and tokenizer when ``lengths`` is not given, else none).

    Returns:
        A :class:`RunPrediction` (source: predicted).
    """
    source = _source_for(cfg, source)
    if caps is None:
        caps = budget_caps(cfg, budget_bytes, device, source, parallel)
    world = parallel.world_size if parallel else 1
    config = model_config_for(cfg, source)
    if lengths is None and source is not None:
        lengths, tokenizer_len, is_chat = data_lengths(cfg, source)
        if added_tokens is None:
            added_tokens = added_rows(config, tokenizer_len, is_chat)
    shapes = micro_shapes(cfg, lengths, caps, world) if lengths else worst_case_shapes(cfg, caps, world)
    kwargs = {**step_kwargs(cfg, device), "added_tokens": added_tokens or 0}
    best: tuple[TraceResult, MicroShape] | None = None
    candidates = dominant(shapes)
    for shape in candidates:
        step = trace_text_step(config, batch_size=shape.batch_size, seq_len=shape.seq_len,
                               mask=shape.mask, grads_before=shape.grads_before,
                               lora_dropout=cfg.lora_dropout, **kwargs)
        if best is None or step.peak_bytes > best[0].peak_bytes:
            best = (step, shape)
    step, shape = best
    step = with_reference_table(per_gpu(step, config, parallel), cfg, device, len(lengths) if lengths else 0)
    log.info("predicted peak %s on %s: %s (%d shapes, %d traced)", gb(step.peak_bytes),
             device, shape, len(shapes), len(candidates))
    return RunPrediction(step.peak_bytes, device, step.info.get("kernel", ""), shape, bool(lengths),
                         len(shapes), len(candidates), step, dict(caps.caps))


def with_reference_table(step: TraceResult, cfg: RunConfig, device: str, pairs: int) -> TraceResult:
    """``step`` with a DPO run's precomputed reference log-probabilities (pairs x 2 float32) in
    its breakdown: the run keeps that table in host memory for all its steps, which on a CPU is
    the device; on a GPU it is not on the card (``step`` unchanged)."""
    if not (cfg.objective == "dpo" and cfg.ref_logps == "precomputed" and device == "cpu" and pairs):
        return step
    table = 2 * 4 * pairs
    return replace(step, peak_bytes=step.peak_bytes + table, traced_peak_bytes=step.traced_peak_bytes + table,
                   breakdown={**step.breakdown, "reference_logps": table})


def plan_and_predict(cfg: RunConfig, budget_bytes: int, device: str = "cuda", source: str | None = None,
                     confirm: bool = True, parallel: Parallel | None = None,
                     ) -> tuple[planner.Plan, TraceResult]:
    """The plan under a budget and the trace of the micro-batch the run will peak at.

    With a budget the planner's micro-batch per bucket replaces the token budget (adaptive batch,
    bucketed runs), and the peak is the worst micro-batch the run will execute on its real data
    (:func:`predict_text_run`, the function the training run calls);
    ``step.info["prediction"]`` holds its figures (device, kernel, micro-batch).
    """
    from lora_gui.memory.runtime.guard import BatchCaps
    plan = plan_run(cfg, budget_bytes, device, source, confirm, parallel)
    caps = BatchCaps()
    if cfg.resolved_batching() == "bucketed":
        caps.caps = {int(b.bucket): max(1, b.micro_batch) for b in plan.buckets}
    prediction = predict_text_run(cfg, device, source, parallel=parallel, caps=caps)
    step = prediction.step
    step.info["prediction"] = prediction.to_json()
    return plan, step
