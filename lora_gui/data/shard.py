"""One optimizer step split across data-parallel ranks, so that the ranks step together.

The epoch plan (:func:`lora_gui.data.batching.plan_epoch`) is global: a pure function of
(seed, epoch, global batch size) that does not know how many processes train it. Each rank
takes its share of every global step here, deterministically, with no communication:

- samples are dealt to ranks in length order, snake-wise (0, 1, .., N-1, N-1, .., 0, ..), so each
  rank gets a similar number of samples and of tokens, and the k-th micro-batch of every rank
  has similar lengths (no rank waits on a longer bucket every step); with packing each rank
  packs its own share into rows;
- each share is cut into micro-batches by the same rule as one process uses (token budget and
  the planner's per-bucket caps);
- every rank then gets the same number of micro-batches: a share with fewer is cut finer (its
  largest micro-batch halved) and, when it runs out of samples (the last, short step of an
  epoch), padded with *filler* micro-batches whose labels are all ignored. Equal counts keep
  FSDP's per-layer all-gathers in lockstep and make the step's collectives line up.

Every sample of the global step is in exactly one rank's share, so every sample is seen exactly
once per epoch across all ranks. The loss of every micro-batch is divided by the *global* number
of target tokens of the step (:func:`step_targets`), so the summed gradient over ranks equals the
gradient one process computes for the same global batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from lora_gui.data.batching import MicroBatch, Step, _packed_steps, _split_by_budget, round_up


def deal(items: Sequence, world_size: int) -> list[list]:
    """Snake-order deal of items (longest first) to ``world_size`` hands."""
    hands: list[list] = [[] for _ in range(world_size)]
    for k, item in enumerate(items):
        lap, pos = divmod(k, world_size)
        hands[pos if lap % 2 == 0 else world_size - 1 - pos].append(item)
    return hands


def _cut_share(ids: list[int], lengths: Sequence[int], batching: str, max_seq_len: int,
               pad_multiple: int, token_budget: int,
               cap_for_len: Callable[[int], int | None] | None) -> list[MicroBatch]:
    if not ids:
        return []
    if batching == "fixed":  # traditional: the whole share at max_seq_len, split only by a cap
        cap = (cap_for_len(max_seq_len) if cap_for_len else None) or len(ids)
        return [MicroBatch(tuple(ids[i : i + cap]), max_seq_len) for i in range(0, len(ids), cap)]
    caps = None if cap_for_len is None else (lambda n: cap_for_len(n) or token_budget)
    return list(_split_by_budget(ids, lengths, max_seq_len, pad_multiple, token_budget, caps))


def _refine(mbs: list[MicroBatch], count: int, filler: MicroBatch) -> list[MicroBatch]:
    """Cuts the largest micro-batches in half, then pads with fillers, up to ``count``."""
    mbs = list(mbs)
    while len(mbs) < count:
        k = max(range(len(mbs)), key=lambda j: len(mbs[j].indices), default=None)
        if k is None or len(mbs[k].indices) < 2 or mbs[k].packed:
            mbs.append(filler)
            continue
        mb = mbs[k]
        half = len(mb.indices) // 2
        mbs[k : k + 1] = [replace(mb, indices=mb.indices[:half]), replace(mb, indices=mb.indices[half:])]
    return mbs


def split_step(step: Step, world_size: int, lengths: Sequence[int], *, batching: str,
               max_seq_len: int, pad_multiple: int = 8, token_budget: int = 2048,
               cap_for_len: Callable[[int], int | None] | None = None,
               packed_row: int | None = None) -> list[Step]:
    """Every rank's share of one global step (index = rank); one process gets ``step`` itself.

    Args:
        step: a global step from ``plan_epoch`` (caps may already be applied).
        world_size: number of data-parallel processes.
        lengths: token count of every sample.
        batching: the run's resolved builder ('fixed', 'bucketed' or 'packed').
        cap_for_len: the largest micro-batch for a padded length (the guard's caps), or None.
        packed_row: tokens a packed row holds at most (as in ``plan_epoch``).

    Returns:
        ``world_size`` steps with the same number of micro-batches each.
    """
    if world_size == 1:
        return [step]
    ids = sorted(step.indices, key=lambda i: -lengths[i])
    shortest = ids[-1]
    if step.micro_batches[0].packed:  # each rank packs its own share (first-fit decreasing)
        row_len = packed_row or min(max_seq_len, token_budget)
        shares = [list(_packed_steps(h, lengths, len(h), row_len, pad_multiple)[0].micro_batches) if h else []
                  for h in deal(ids, world_size)]
        filler = MicroBatch((shortest,), min(lengths[shortest], row_len), packed=True, filler=True)
    else:
        shares = [_cut_share(h, lengths, batching, max_seq_len, pad_multiple, token_budget, cap_for_len)
                  for h in deal(ids, world_size)]
        width = max_seq_len if batching == "fixed" else min(round_up(lengths[shortest], pad_multiple),
                                                             max_seq_len)
        filler = MicroBatch((shortest,), width, filler=True)
    count = max(len(s) for s in shares)
    return [Step(tuple(_refine(s, count, filler))) for s in shares]


def step_targets(samples: Sequence, step: Step) -> int:
    """Target tokens of a whole (global) step: the loss normaliser shared by every rank."""
    return sum(samples[i].targets_within(mb.seq_len) for mb in step.micro_batches if not mb.filler
               for i in mb.indices)
