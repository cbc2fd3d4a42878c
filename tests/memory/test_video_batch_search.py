"""The bundled video config's micro-batch search: the same answer as walking down from the top
(batch_size, half of it, ... 1), with fewer traces of the step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lora_gui.memory.predict.video_run import halvings, largest_that_fits


def _walk_down(batch_size: int, peak, budget: int | None) -> int:
    batch = batch_size
    while budget is not None and batch > 1 and peak(batch) > budget:
        batch = max(1, batch // 2)
    return batch


@pytest.mark.parametrize("batch_size", [1, 2, 3, 6, 8, 13, 32])
def test_the_answer_is_the_walk_downs_with_each_size_traced_once(batch_size: int) -> None:
    def peak(b: int) -> int:
        return 1000 + 300 * b

    for budget in [None, 0, 1000, 1300, 1301, 1900, 2200, 3400, 5000, 11_000, 20_000]:
        traced: list[int] = []

        def trace(b: int, traced: list[int] = traced) -> SimpleNamespace:
            traced.append(b)
            return SimpleNamespace(peak_bytes=peak(b))

        batch, step = largest_that_fits(halvings(batch_size), trace, budget)
        assert batch == _walk_down(batch_size, peak, budget), budget
        assert step.peak_bytes == peak(batch)
        assert len(traced) == len(set(traced))


@pytest.mark.parametrize("per_rank", [1, 2, 5, 8])
def test_every_micro_batch_as_the_runs_plan_tries_them(per_rank: int) -> None:
    """The run's plan tries every micro-batch from the largest down: the same first fit."""
    for budget in range(0, 4000, 97):
        traced: list[int] = []

        def trace(b: int, traced: list[int] = traced) -> SimpleNamespace:
            traced.append(b)
            return SimpleNamespace(peak_bytes=1000 + 300 * b)

        fitting = [m for m in range(per_rank, 0, -1) if 1000 + 300 * m <= budget]
        assert largest_that_fits(list(range(per_rank, 0, -1)), trace, budget)[0] == (fitting or [1])[0]
        assert len(traced) == len(set(traced)) <= 2 + per_rank.bit_length()


def test_a_model_that_does_not_fit_one_clip_is_traced_once() -> None:
    traced: list[int] = []

    def trace(b: int) -> SimpleNamespace:
        traced.append(b)
        return SimpleNamespace(peak_bytes=10**12 * b)

    assert largest_that_fits(halvings(8), trace, 24 * 10**9)[0] == 1
    assert traced == [1]


def test_without_a_budget_only_the_top_is_traced() -> None:
    traced: list[int] = []
    def trace(b: int) -> SimpleNamespace:
        traced.append(b)
        return SimpleNamespace(peak_bytes=b)

    assert largest_that_fits(halvings(8), trace, None)[0] == 8
    assert traced == [8]
