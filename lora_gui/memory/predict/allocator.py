"""What PyTorch's CUDA caching allocator reserves for a traced step: a replay of its allocations.

``torch.cuda.max_memory_allocated`` counts live blocks; ``max_memory_reserved`` counts the
segments the allocator got from ``cudaMalloc`` and keeps cached, and that is what the card (and
``set_per_process_memory_fraction``, which caps reserved memory) sees. The trace records when
every storage was born and died; :func:`replay` plays those events, in order, through a model of
the native allocator of ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x, default settings):

- sizes: ``round_size``: below ``kMinBlockSize`` (512 B) a request is 512 B, else rounded up to a
  multiple of 512 B;
- pools: requests of at most ``kSmallSize`` (1 MiB) use the small pool, larger ones the large pool
  (``get_pool``);
- segments (``get_allocation_size``): small pool 2 MiB (``kSmallBuffer``); large requests under
  ``kMinLargeAlloc`` (10 MiB) get a 20 MiB segment (``kLargeBuffer``); larger ones are rounded up
  to a multiple of 2 MiB (``kRoundLarge``);
- reuse (``get_free_block``): the smallest cached free block of the pool that is large enough
  (best fit, ``std::set::lower_bound`` on size); a new segment only when none is;
- splitting (``should_split``): a block larger than the request is split when the remainder is at
  least 512 B (small pool) or more than 1 MiB (large pool); the remainder stays cached;
- freeing (``free_block`` / ``try_merge_blocks``): a freed block merges with free neighbours of
  its segment; segments are never returned to the driver during a step...
- ...unless a new segment would not fit the limit: then, as ``alloc_block`` failing leads to
  ``release_cached_blocks``, every wholly free segment is released and the allocation retried;
  if it still does not fit, the step runs out of memory (``replay(limit=...)``).

With ``expandable_segments:True``, which every run sets (:mod:`lora_gui.memory.runtime.alloc_conf`),
:class:`ExpandableAllocator` replays what the same file does then (read at pytorch/pytorch commit
001074d25084, ``Note [Expandable Segments]`` and the functions named here):

- one segment per pool and stream that grows (``find_expandable_block``: the address space of
  1 1/8 of the card is reserved once; physical pages are mapped as needed), 2 MiB pages in the
  small pool and 20 MiB (``kLargeBuffer``) in the large one (``ExpandableSegment`` constructor,
  ``segment_size``);
- a request no cached block holds maps whole pages after the segment's end and merges them with a
  free block there (``try_allocate_expandable_block`` -> ``map_block`` -> ``try_merge_blocks``);
- best fit as above, except that the free block at the end of the mapped part counts as the size
  it could grow to, so it is taken last (``get_free_block``, ``expandable_size``);
- blocks of both pools split when at least 512 B remain (``should_split``);
- under a cap (``set_per_process_memory_fraction``), before it reports out of memory the allocator
  unmaps every wholly free page (``release_cached_blocks`` -> ``release_blocks`` -> ``unmap_block``
  -> ``ExpandableSegment::unmap``) and maps the request again: a capped run needs the pages that
  hold live blocks, :attr:`Replay.peak_pages`, which is what the plan counts; an uncapped run keeps
  freed pages mapped, ``peak_reserved`` (the most ``max_memory_reserved`` can show).

Not modelled: several streams (every allocation is on one stream; the offloaded checkpoints'
side stream only copies), ``max_split_size_mb``, ``roundup_power2_divisions``, garbage-collection
thresholds, where a capped expandable segment re-maps a request (it may fill unmapped holes; the
replay keeps the uncapped layout and counts its live pages), and the order in which the real
kernels allocate inside one op (the trace sees an op's outputs together).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

# Closed-form estimates cannot replay allocations: they add this share of the allocated peak as
# reserved-but-unused memory. Not from the allocator's source: the replay of Llama-3.1-8B nf4 r32
# traces (batch 1) measured 6.9% (512 tokens), 10.3% (2,048) and 9.9% (4,096, checkpointed) of the
# allocated peak; the largest, rounded up, so the estimate errs high. The trace replays instead.
CACHE_ALLOWANCE = 0.11
# The same with expandable_segments:True (what runs use, lora_gui.memory.runtime.alloc_conf): a
# capped run needs the pages that hold live blocks (ExpandableAllocator.peak_pages) plus
# CAPPED_FRAGMENTATION; the replay of the same traces measured pages +0.65% (2,048 tokens) and
# +0.32% (4,096, the long-context switches) of the allocated peak; with the 2% below, 4% is
# taken so the estimate errs high.
EXPANDABLE_CACHE_ALLOWANCE = 0.04
# What a capped run held on a card beyond the replay's live pages, as a share of the allocated
# peak (bench/gpu/check.py on an H200, Llama-3.1-8B nf4 r32 at the 8 GB card's longest length
# under its cap): +1.3% fitted (head groups off), and with attention in head groups the run ran
# out of memory 0.6% above the pages (the allocator could not unmap 340 MiB of partly used pages
# and the side stream's blocks). Not from the allocator's source: the largest seen, rounded up.
# The need never exceeds the uncapped replay (peak_reserved), which matched every uncapped
# run's max_memory_reserved within -1.8%...+1.4% there.
CAPPED_FRAGMENTATION = 0.02
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: largest "small" request
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small-pool segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer: segment for large requests under kMinLargeAlloc
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge


def cache_allowance(allocated: int) -> int:
    """Reserved beyond allocated that a closed form adds on CUDA, for the allocator runs use."""
    from lora_gui.memory.runtime.alloc_conf import expandable_segments_planned

    share = EXPANDABLE_CACHE_ALLOWANCE if expandable_segments_planned() else CACHE_ALLOWANCE
    return int(share * allocated)


def round_size(nbytes: int) -> int:
    """``round_size``: the block size the allocator hands out for ``nbytes``."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else (nbytes + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def segment_size(block: int) -> int:
    """``get_allocation_size``: bytes of the segment ``cudaMalloc`` gets for a ``block`` request."""
    if block <= SMALL_SIZE:
        return SMALL_BUFFER
    if block < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (block + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class _Block:
    __slots__ = ("seg", "offset", "size", "free", "prev", "next")

    def __init__(self, seg: int, offset: int, size: int) -> None:
        self.seg, self.offset, self.size, self.free = seg, offset, size, True
        self.prev: _Block | None = None
        self.next: _Block | None = None

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.seg, self.offset)


@dataclass
class Replay:
    """The allocator's figures over a replayed step (bytes).

    Attributes:
        peak_allocated: max of live rounded blocks (what max_memory_allocated shows).
        peak_reserved: max of cached segments (what max_memory_reserved shows).
        out_of_memory: a segment did not fit ``limit`` even after releasing the free ones.
        segments: segments allocated at the end.
        peak_pages: with expandable segments, the most bytes of mapped pages that held a live
            block at once: what a run capped below ``peak_reserved`` needs, since the allocator
            unmaps wholly free pages before it reports out of memory (the default allocator:
            ``peak_reserved``).
    """

    peak_allocated: int
    peak_reserved: int
    out_of_memory: bool
    segments: int
    peak_pages: int = 0  # expandable segments: most bytes of pages with a live block at once
    expandable: bool = False


class CachingAllocator:
    """The native CUDA caching allocator's bookkeeping (see the module doc), no memory behind it."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # small? -> keys
        self.blocks: dict[tuple[int, int, int], _Block] = {}
        self.segments: dict[int, tuple[bool, int, _Block]] = {}  # id -> (small, size, first block)
        self.next_segment = 0
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.out_of_memory = False

    def _cache(self, block: _Block, small: bool) -> None:
        key = block.key()
        self.blocks[key] = block
        bisect.insort(self.free[small], key)

    def _uncache(self, block: _Block, small: bool) -> None:
        key = block.key()
        pool = self.free[small]
        pool.pop(bisect.bisect_left(pool, key))
        del self.blocks[key]

    def _new_segment(self, size: int, small: bool) -> _Block:
        if self.limit is not None and self.reserved + size > self.limit:
            self._release_free_segments()
            if self.reserved + size > self.limit:
                self.out_of_memory = True  # counted anyway, so the replay goes on
        seg = self.next_segment
        self.next_segment += 1
        block = _Block(seg, 0, size)
        self.segments[seg] = (small, size, block)
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_free_segments(self) -> None:
        for seg, (small, size, first) in list(self.segments.items()):
            if first.free and first.next is None:  # one free block spanning the segment
                self._uncache(first, small)
                del self.segments[seg]
                self.reserved -= size

    def malloc(self, nbytes: int) -> _Block:
        """Allocates a block for a request of ``nbytes``."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.free[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            block = self.blocks[pool[i]]
            self._uncache(block, small)
        else:
            block = self._new_segment(segment_size(size), small)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:  # should_split
            rest = _Block(block.seg, block.offset + size, remaining)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._cache(rest, small)
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def release(self, block: _Block) -> _Block:
        """Frees a block: it merges with free neighbours and stays cached (returns the merged block)."""
        small = self.segments[block.seg][0]
        self.allocated -= block.size
        block.free = True
        for other in (block.prev, block.next):
            if other is not None and other.free:
                self._uncache(other, small)
                if other is block.prev:
                    other.size += block.size
                    other.next = block.next
                    if block.next is not None:
                        block.next.prev = other
                    block = other
                else:
                    block.size += other.size
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
        if block.prev is None:
            first_small, seg_size, _ = self.segments[block.seg]
            self.segments[block.seg] = (first_small, seg_size, block)
        self._cache(block, small)
        return block


class ExpandableAllocator(CachingAllocator):
    """The same allocator with ``expandable_segments:True`` (see :data:`EXPANDABLE_SOURCE`).

    Each pool has one segment that grows: a request no cached block holds maps pages at the end
    of the segment (2 MiB pages in the small pool, 20 MiB in the large one), merged with a free
    block at its end; blocks of both pools split when at least 512 B remain. Replayed without a
    limit: under one, the real allocator also unmaps wholly free pages before it fails
    (``release_blocks`` -> ``unmap_block``), so this reserved figure is an upper bound there.
    """

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(limit)
        self.last: dict[bool, _Block | None] = {True: None, False: None}  # block at the mapped end
        self.live_pages: dict[bool, dict[int, int]] = {True: {}, False: {}}  # page -> live blocks on it
        self.pages = self.peak_pages = 0  # bytes of pages holding a live byte (both pools)

    def _pages(self, block: _Block, small: bool, delta: int) -> None:
        """Counts the pages under a block that is born (+1) or freed (-1)."""
        page = SMALL_BUFFER if small else LARGE_BUFFER
        counts = self.live_pages[small]
        for p in range(block.offset // page, (block.offset + block.size - 1) // page + 1):
            n = counts.get(p, 0) + delta
            if n and not counts.get(p, 0):
                self.pages += page
            elif not n:
                self.pages -= page
            counts[p] = n
        self.peak_pages = max(self.peak_pages, self.pages)

    def malloc(self, nbytes: int) -> _Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool, last = self.free[small], self.last[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool) and last is not None and pool[i] == last.key() and i + 1 < len(pool):
            i += 1  # get_free_block: the end block counts as what it can expand to, so it comes last
        if i < len(pool):
            block = self.blocks[pool[i]]
            self._uncache(block, small)
        else:
            block = self._expand(size, small)
        remaining = block.size - size
        if remaining >= MIN_BLOCK:  # should_split with expandable segments: both pools
            rest = _Block(block.seg, block.offset + size, remaining)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            else:
                self.last[small] = rest
            block.next, block.size = rest, size
            self._cache(rest, small)
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self._pages(block, small, 1)
        return block

    def _expand(self, size: int, small: bool) -> _Block:
        """``try_allocate_expandable_block``: maps whole pages after the segment's end block."""
        page = SMALL_BUFFER if small else LARGE_BUFFER
        last = self.last[small]
        if last is None:  # the pool's segment, reserved address space, nothing mapped yet
            seg = self.next_segment
            self.next_segment += 1
            block = _Block(seg, 0, 0)
            self.segments[seg] = (small, 0, block)
        elif last.free:
            block = last
            self._uncache(block, small)
        else:
            block = _Block(last.seg, last.offset + last.size, 0)
            block.prev, last.next = last, block
        mapped = (size - block.size + page - 1) // page * page
        if self.limit is not None and self.reserved + mapped > self.limit:
            self.out_of_memory = True  # counted anyway, so the replay goes on
        block.size += mapped
        small_, seg_size, first = self.segments[block.seg]
        self.segments[block.seg] = (small_, seg_size + mapped, first)
        self.reserved += mapped
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.last[small] = block
        return block

    def release(self, block: _Block) -> _Block:
        small = self.segments[block.seg][0]
        self._pages(block, small, -1)
        merged = super().release(block)
        if merged.next is None:
            self.last[small] = merged
        return merged


def capped_need(replay: Replay) -> int:
    """Bytes of segments a run capped at the card's memory needs: with expandable segments the
    pages of live blocks plus :data:`CAPPED_FRAGMENTATION` of the allocated peak, at most what an
    uncapped run maps; with fixed segments, what it reserves."""
    if not replay.expandable:
        return replay.peak_reserved
    margin = -(-int(CAPPED_FRAGMENTATION * replay.peak_allocated) // MIN_BLOCK) * MIN_BLOCK
    return max(replay.peak_pages, min(replay.peak_reserved, replay.peak_pages + margin))


def replay_records(records: Iterable[tuple[int, int, int | None]], *, limit: int | None = None,
                   expandable: bool = False) -> Replay:
    """Replays a trace's storages through the allocator, in the order they were born and died.

    Args:
        records: ``(nbytes, born, died)`` per storage, event numbers from one counter (``died``
            None: alive at the end). Storages born at event 0 or before the others (weights,
            optimizer state) are allocated first, in their order.
        limit: bytes the allocator may reserve; None: no cap.
        expandable: replay ``expandable_segments:True`` (:class:`ExpandableAllocator`).

    Returns:
        A :class:`Replay`.
    """
    alloc = (ExpandableAllocator if expandable else CachingAllocator)(limit)
    events: list[tuple[int, int, int]] = []  # (event, 0 = free first / 1 = malloc, index)
    sizes: list[int] = []
    for i, (nbytes, born, died) in enumerate(records):
        sizes.append(nbytes)
        events.append((born, 1, i))
        if died is not None:
            events.append((died, 0, i))
    events.sort()
    live: dict[int, _Block] = {}
    for _, kind, i in events:
        if kind == 1:
            live[i] = alloc.malloc(sizes[i])
        elif i in live:
            alloc.release(live.pop(i))
    return Replay(alloc.peak_allocated, alloc.peak_reserved, alloc.out_of_memory, len(alloc.segments),
                  getattr(alloc, "peak_pages", alloc.peak_reserved), expandable)


def two_steps(before: list[int], state: list[int], step: list[tuple[int, int, int | None]],
              fixed: Iterable[int] = ()) -> list[tuple[int, int, int | None]]:
    """The records of a run's first two steps, built from one traced steady-state step.

    The allocator's cache depends on history: the first step runs without the optimizer state,
    which is then created in blocks the step's activations left cached; the second step needs
    its activations again around it. Replaying both gives the reserved memory a run reaches.

    Args:
        before: sizes alive before the first step (weights, LoRA parameters, ...), in order.
        state: sizes of the optimizer state, created after the first step's backward.
        step: ``(nbytes, born, died)`` of the traced step's own storages (event numbers of the
            trace; ``died`` None: alive at its end, freed here when the next step starts).
        fixed: sizes allocated first and never freed (cuBLAS workspaces).
    """
    out: list[tuple[int, int, int | None]] = []
    t = 0
    for nbytes in (*fixed, *before):
        t += 1
        out.append((nbytes, t, None))
    first = min((b for _, b, _ in step), default=0)
    span = max((max(b, d or b) for _, b, d in step), default=0) - first + 2
    for copy, offset in enumerate((t, t + span + len(state) + 1)):
        for nbytes, born, died in step:
            end = offset + span if died is None else offset + died - first + 1
            out.append((nbytes, offset + born - first + 1, end))
        if copy == 0:
            out += [(nbytes, offset + span + 1 + k, None) for k, nbytes in enumerate(state)]
    return out
