"""Batch builders: which samples form each optimizer step, and how each step is cut into
micro-batches that the device runs one at a time (gradient accumulation).

- ``fixed`` (traditional): ``batch_size`` samples a step, one micro-batch, every sample padded or
  truncated to ``max_seq_len``. Costs: all the padding; saves: nothing.
- ``bucketed`` (dynamic sequence sizing): samples grouped by length inside seeded mega-chunks
  (as Hugging Face's length-grouped sampler does), each micro-batch padded only to its longest
  sample rounded up to ``pad_multiple``, and as many samples per micro-batch as fit under
  ``token_budget`` padded tokens (or the planner's cap for that length bucket). Saves: padding
  compute and activation memory; costs: steps whose samples have similar lengths.
- ``packed``: a step's documents concatenated into rows of at most ``packed_row`` tokens (the
  caller's: the token budget where each document is attended on its own, else
  ``min(max_seq_len, token_budget)``) with per-document position ids; a row is padded only up
  to a multiple of ``pad_multiple`` (a CPU builds a matmul kernel for each new row length),
  the padding a separate segment without labels. No attention crosses a document.

In every mode each sample appears in exactly one step per epoch, and the order is a pure
function of (seed, epoch), so a resumed run replays the same order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lora_gui.data.text import IGNORE_INDEX, TokenizedSample

MEGA_CHUNK_STEPS = 16  # steps per length-sorted chunk: wide enough to group, narrow enough to mix
# The fixed cost of one more micro-batch (a forward and backward pass: every op's dispatch, the
# Python around it) in padded tokens' worth of compute. A chosen constant: on a 1-thread CPU one
# more pass of the text demo's model costs 0.03-0.09 s of per-op work, at 0.5-1 ms per token. The
# bucketed builder splits a step where the padding it saves is worth more.
MICRO_BATCH_COST_TOKENS = 256


@dataclass(frozen=True)
class MicroBatch:
    """Sample indices run together; ``seq_len`` is the padded row length (tokens).

    ``filler``: a stand-in run by a data-parallel rank that has no sample left for this slot of
    the step (see :mod:`lora_gui.data.shard`): its labels are all ignored, so it adds nothing to
    the loss or the gradient, and its sample is not counted as trained.
    """

    indices: tuple[int, ...]
    seq_len: int
    packed: bool = False
    filler: bool = False


@dataclass(frozen=True)
class Step:
    """One optimizer step: its micro-batches, accumulated with token-weighted loss."""

    micro_batches: tuple[MicroBatch, ...]

    @property
    def indices(self) -> list[int]:
        """The samples this step trains (fillers excluded)."""
        return [i for mb in self.micro_batches if not mb.filler for i in mb.indices]


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _permutation(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def _fixed_steps(order: list[int], batch_size: int, max_seq_len: int) -> list[Step]:
    return [Step((MicroBatch(tuple(order[i : i + batch_size]), max_seq_len),))
            for i in range(0, len(order), batch_size)]


def _split_by_budget(
    ids: list[int], lengths: Sequence[int], max_seq_len: int, pad_multiple: int, token_budget: int,
    cap_for_len: Callable[[int], int] | None,
) -> tuple[MicroBatch, ...]:
    """Cuts length-descending ids into micro-batches whose padded tokens fit the budget, at the
    cuts that cost least: padded tokens plus :data:`MICRO_BATCH_COST_TOKENS` per micro-batch
    (a shorter tail of the step gets its own, narrower micro-batch when the padding it saves is
    worth more than one more pass). Exact over every contiguous cut (a step holds few samples)."""
    n = len(ids)
    widths = [min(round_up(lengths[i], pad_multiple), max_seq_len) for i in ids]
    fits = []
    for width in widths:
        fit = max(1, token_budget // width)
        fits.append(max(1, min(fit, cap_for_len(width))) if cap_for_len is not None else fit)
    best = [0.0] * (n + 1)  # best[i]: least cost of ids[i:]
    cut = [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i] = float("inf")
        for j in range(i + 1, min(n, i + fits[i]) + 1):  # ids[i:j] in one micro-batch, width widths[i]
            cost = (j - i) * widths[i] + MICRO_BATCH_COST_TOKENS + best[j]
            if cost <= best[i]:  # a tie keeps the larger first micro-batch (fewer passes)
                best[i], cut[i] = cost, j
    out: list[MicroBatch] = []
    i = 0
    while i < n:
        out.append(MicroBatch(tuple(ids[i : cut[i]]), widths[i]))
        i = cut[i]
    return tuple(out)


def _bucketed_steps(order: list[int], lengths: Sequence[int], batch_size: int, rng: random.Random,
                    **split: object) -> list[Step]:
    chunk = batch_size * MEGA_CHUNK_STEPS
    steps: list[Step] = []
    for start in range(0, len(order), chunk):
        ids = sorted(order[start : start + chunk], key=lambda i: -lengths[i])
        for s in range(0, len(ids), batch_size):
            steps.append(Step(_split_by_budget(ids[s : s + batch_size], lengths, **split)))
    rng.shuffle(steps)  # mix lengths across the epoch; each step stays length-homogeneous
    return steps


def _packed_steps(order: list[int], lengths: Sequence[int], batch_size: int, row_len: int,
                  pad_multiple: int = 1) -> list[Step]:
    steps = []
    for start in range(0, len(order), batch_size):
        ids = sorted(order[start : start + batch_size], key=lambda i: -lengths[i])
        rows: list[list[int]] = []
        room: list[int] = []
        for i in ids:  # first-fit decreasing
            size = min(lengths[i], row_len)
            slot = next((r for r, free in enumerate(room) if free >= size), None)
            if slot is None:
                rows.append([i])
                room.append(row_len - size)
            else:
                rows[slot].append(i)
                room[slot] -= size
        steps.append(Step(tuple(MicroBatch(tuple(r), min(row_len, round_up(row_len - free, pad_multiple)),
                                           packed=True) for r, free in zip(rows, room))))
    return steps


def plan_epoch(
    lengths: Sequence[int], batching: str, *, batch_size: int, max_seq_len: int, seed: int,
    epoch: int, token_budget: int = 2048, pad_multiple: int = 8,
    cap_for_len: Callable[[int], int] | None = None, packed_row: int | None = None,
) -> list[Step]:
    """All steps of one epoch for samples of the given token lengths.

    Args:
        lengths: token count of each sample (already truncated to max_seq_len).
        batching: 'fixed', 'bucketed' or 'packed'.
        batch_size: samples per optimizer step.
        cap_for_len: optional largest micro-batch for a padded length (from the planner).
        packed_row: tokens a packed row holds at most (default ``min(max_seq_len, token_budget)``).
    """
    order = _permutation(len(lengths), seed, epoch)
    if batching == "fixed":
        return _fixed_steps(order, batch_size, max_seq_len)
    if batching == "bucketed":
        rng = random.Random(seed * 7919 + epoch)
        return _bucketed_steps(order, lengths, batch_size, rng, max_seq_len=max_seq_len,
                               pad_multiple=pad_multiple, token_budget=token_budget,
                               cap_for_len=cap_for_len)
    if batching == "packed":
        return _packed_steps(order, lengths, batch_size, packed_row or min(max_seq_len, token_budget),
                             pad_multiple)
    raise ValueError(f"batching: unknown builder {batching!r}; use fixed, bucketed or packed")


def collate(samples: Sequence[TokenizedSample], micro_batch: MicroBatch,
            pad_id: int) -> dict[str, torch.Tensor]:
    """Tensors for one micro-batch: input_ids, labels, and attention_mask or position_ids."""
    rows = [samples[i] for i in micro_batch.indices]
    if micro_batch.packed:
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for s in rows:
            n = min(len(s), micro_batch.seq_len)
            ids += s.input_ids[:n]
            labels += [IGNORE_INDEX] + s.labels[1:n]  # never predict across a document boundary
            positions += list(range(n))
        if micro_batch.filler:
            labels = [IGNORE_INDEX] * len(labels)
        pad = micro_batch.seq_len - len(ids)  # up to the row's padded length: its own segment
        if pad > 0:
            ids += [pad_id] * pad
            labels += [IGNORE_INDEX] * pad
            positions += list(range(pad))
        return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]),
                "position_ids": torch.tensor([positions])}
    width = micro_batch.seq_len
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels_t = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, s in enumerate(rows):
        n = min(len(s), width)
        input_ids[r, :n] = torch.tensor(s.input_ids[:n])
        if not micro_batch.filler:
            labels_t[r, :n] = torch.tensor(s.labels[:n])
        mask[r, :n] = 1
    return {"input_ids": input_ids, "labels": labels_t, "attention_mask": mask}


def count_targets(batch: dict[str, torch.Tensor]) -> int:
    """Tokens that carry a loss in a collated micro-batch (labels are shifted by one)."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
