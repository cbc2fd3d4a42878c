"""The caching-allocator model: sizes, pools, splitting, merging and the limit, as in
c10/cuda/CUDACachingAllocator.cpp."""

from lora_gui.memory.predict.allocator import (
    CachingAllocator,
    ExpandableAllocator,
    replay_records,
    round_size,
    segment_size,
    two_steps,
)

MIB = 2**20


def test_sizes_and_segments():
    assert round_size(1) == 512 and round_size(513) == 1024 and round_size(1024) == 1024
    assert segment_size(512) == 2 * MIB and segment_size(MIB) == 2 * MIB  # small pool
    assert segment_size(5 * MIB) == 20 * MIB  # large request under 10 MiB: a 20 MiB segment
    assert segment_size(11 * MIB + 1) == 12 * MIB  # larger: rounded up to 2 MiB


def test_small_blocks_share_a_segment_and_are_reused():
    a = CachingAllocator()
    blocks = [a.malloc(100) for _ in range(4)]
    assert a.reserved == 2 * MIB and a.allocated == 4 * 512
    for b in blocks:
        a.release(b)
    a.malloc(1000)
    assert a.reserved == 2 * MIB  # the freed blocks merged back and were reused


def test_large_split_only_when_more_than_1_mib_remains():
    a = CachingAllocator()
    a.malloc(5 * MIB)  # 20 MiB segment, 15 MiB remainder cached
    a.malloc(5 * MIB)
    assert a.reserved == 20 * MIB
    b = CachingAllocator()
    x = b.malloc(12 * MIB)
    b.release(x)
    b.malloc(int(11.5 * MIB))  # remainder 0.5 MiB: not split, the whole block is handed out
    assert b.allocated == 12 * MIB and b.reserved == 12 * MIB


def test_fragmentation_reserves_beyond_allocated():
    a = CachingAllocator()
    first, _second = a.malloc(100 * MIB), a.malloc(100 * MIB)
    a.release(first)
    a.malloc(150 * MIB)  # no cached block is large enough
    assert a.reserved == 350 * MIB and a.peak_allocated == 250 * MIB


def test_a_limit_releases_free_segments_before_running_out():
    records = [(100 * MIB, 1, 2), (150 * MIB, 3, None)]
    assert replay_records(records).peak_reserved == 250 * MIB  # the freed 100 MiB stays cached
    capped = replay_records(records, limit=160 * MIB)  # released to make room, as release_cached_blocks
    assert not capped.out_of_memory and capped.peak_reserved == 150 * MIB
    assert replay_records([(100 * MIB, 1, None), (150 * MIB, 2, None)], limit=200 * MIB).out_of_memory


def test_two_steps_places_the_optimizer_state_between_the_steps():
    step = [(30 * MIB, 10, 12), (30 * MIB, 11, 13)]
    out = two_steps([50 * MIB], [40 * MIB], step)
    r = replay_records(out)
    assert r.peak_allocated == 50 * MIB + 40 * MIB + 60 * MIB
    assert r.peak_reserved >= r.peak_allocated


def test_expandable_segments_grow_one_segment_by_pages():
    a = ExpandableAllocator()
    x = a.malloc(5 * MIB)  # one 20 MiB page of the large pool's segment, 15 MiB left free at its end
    a.malloc(5 * MIB)  # fits in that free end: no new page
    assert a.reserved == 20 * MIB and len(a.segments) == 1
    a.malloc(30 * MIB)  # the free end (10 MiB) + one more page (20 MiB), merged: still one segment
    assert a.reserved == 40 * MIB and len(a.segments) == 1
    a.release(x)
    a.malloc(4 * MIB)  # best fit reuses the freed block in the middle
    assert a.reserved == 40 * MIB
    a.malloc(100)  # the small pool: a segment of its own, 2 MiB pages
    assert a.reserved == 42 * MIB and len(a.segments) == 2


def test_expandable_segments_keep_holes_mapped_but_a_cap_needs_only_live_pages():
    records = [(100 * MIB, 1, 2), (100 * MIB, 1, None), (150 * MIB, 3, None)]
    default, expandable = replay_records(records), replay_records(records, expandable=True)
    assert default.peak_reserved == 350 * MIB and default.peak_pages == default.peak_reserved
    # the freed 100 MiB stays mapped (reserved), while only the pages under live blocks are needed
    # once the allocator unmaps free pages under a cap: 100 MiB + 150 MiB rounded to 20 MiB pages
    assert expandable.peak_reserved == 360 * MIB and expandable.peak_pages == 260 * MIB
    assert expandable.peak_allocated == default.peak_allocated == 250 * MIB and expandable.expandable


def test_the_run_sets_expandable_segments_unless_the_user_chose():
    from lora_gui.memory.runtime.alloc_conf import expandable_segments_planned, use_expandable_segments

    env: dict[str, str] = {}
    assert use_expandable_segments(env) and env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    assert not use_expandable_segments(mine) and mine["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    both = "max_split_size_mb:64,expandable_segments:True"
    assert expandable_segments_planned({"PYTORCH_CUDA_ALLOC_CONF": both})
    assert not expandable_segments_planned({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
