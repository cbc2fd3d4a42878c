"""Rank shares of global steps: every sample once, equal micro-batch counts, budgets kept."""

import random

import pytest

from lora_gui.data.batching import plan_epoch
from lora_gui.data.shard import deal, split_step, step_targets
from lora_gui.memory.runtime.guard import BatchCaps


def test_deal_is_snake_order():
    assert deal(list(range(7)), 3) == [[0, 5, 6], [1, 4], [2, 3]]


@pytest.mark.parametrize("batching", ["fixed", "bucketed", "packed"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_sample_once_and_ranks_step_together(batching, world):
    rng = random.Random(world)
    lengths = [rng.randint(2, 300) for _ in range(103)]  # 103: the last step is short
    budget, pad = 512, 64
    caps = BatchCaps({128: 3, 320: 1})
    seen = []
    for epoch in range(2):
        steps = plan_epoch(lengths, batching, batch_size=8, max_seq_len=320, seed=1, epoch=epoch,
                           token_budget=budget, pad_multiple=pad)
        for step in steps:
            global_step = caps.apply(step)
            shares = split_step(global_step, world, lengths, batching=batching, max_seq_len=320,
                                pad_multiple=pad, token_budget=budget, cap_for_len=caps.cap)
            assert len(shares) == world
            assert len({len(s.micro_batches) for s in shares}) == 1  # same count on every rank
            trained = sorted(i for s in shares for i in s.indices)
            assert trained == sorted(step.indices)  # each sample of the step on exactly one rank
            assert max(len(s.indices) for s in shares) - min(len(s.indices) for s in shares) <= 1
            for s in shares:
                for mb in s.micro_batches:
                    if mb.filler or mb.packed:
                        continue
                    assert all(lengths[i] <= mb.seq_len for i in mb.indices)
                    if batching == "bucketed":
                        assert len(mb.indices) * mb.seq_len <= max(budget, mb.seq_len)
                        assert len(mb.indices) <= (caps.cap(mb.seq_len) or len(mb.indices))
            seen += trained
        assert sorted(seen[-len(lengths):]) == list(range(len(lengths)))  # the epoch: each once
        assert len(seen) == len(lengths) * (epoch + 1)


def test_short_last_step_gets_fillers_that_train_nothing():
    lengths = [10, 20, 30]
    step = plan_epoch(lengths, "bucketed", batch_size=3, max_seq_len=64, seed=0, epoch=0,
                      pad_multiple=8)[0]
    shares = split_step(step, 4, lengths, batching="bucketed", max_seq_len=64, pad_multiple=8)
    fillers = [mb for s in shares for mb in s.micro_batches if mb.filler]
    assert len(fillers) == 1 and shares[3].indices == []  # the fourth rank only runs a filler
    assert fillers[0].indices == (0,)  # the shortest sample, labels ignored by collate


def test_one_process_gets_the_step_itself():
    lengths = [5, 9, 40]
    step = plan_epoch(lengths, "bucketed", batch_size=3, max_seq_len=64, seed=0, epoch=0)[0]
    assert split_step(step, 1, lengths, batching="bucketed", max_seq_len=64) == [step]


def test_filler_collates_to_no_targets():
    import torch

    from lora_gui.data.batching import MicroBatch, collate, count_targets
    from lora_gui.data.text import TokenizedSample

    sample = TokenizedSample(list(range(1, 9)), list(range(1, 9)))
    real = collate([sample], MicroBatch((0,), 8), pad_id=0)
    filler = collate([sample], MicroBatch((0,), 8, filler=True), pad_id=0)
    assert count_targets(real) == 7 and count_targets(filler) == 0
    assert torch.equal(real["input_ids"], filler["input_ids"])
    assert step_targets([sample], plan_epoch([8], "fixed", batch_size=1, max_seq_len=8, seed=0,
                                             epoch=0)[0]) == 7
