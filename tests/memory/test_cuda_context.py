"""The budget a run plans against on a card whose context is larger than the plan's figure."""

import torch

from lora_gui.memory.predict.trace_result import CUDA_CONTEXT_BYTES
from lora_gui.memory.runtime.cuda_context import budget_for_plan, outside_allocator_bytes

MIB = 2**20
CUDA = torch.device("cuda")


def test_a_larger_context_comes_off_the_budget():
    measured = CUDA_CONTEXT_BYTES + 900 * MIB  # an H200 with a CUDA 13 build holds ~1.4 GB
    budget, info = budget_for_plan(8_000 * MIB, CUDA, CUDA_CONTEXT_BYTES, measured=measured)
    assert budget == 7_100 * MIB
    assert info["budget_lowered_by_bytes"] == 900 * MIB
    assert info["cuda_outside_allocator_bytes"] == measured and info["cuda_context_source"]


def test_a_smaller_context_keeps_the_budget_and_no_budget_stays_none():
    budget, info = budget_for_plan(8_000 * MIB, CUDA, CUDA_CONTEXT_BYTES, measured=300 * MIB)
    assert budget == 8_000 * MIB and "budget_lowered_by_bytes" not in info
    assert budget_for_plan(None, CUDA, CUDA_CONTEXT_BYTES, measured=2_000 * MIB)[0] is None


def test_nothing_is_read_off_cuda():
    cpu = torch.device("cpu")
    assert outside_allocator_bytes(cpu) is None
    assert budget_for_plan(5 * MIB, cpu, CUDA_CONTEXT_BYTES) == (5 * MIB, {})
