import pytest
import torch
from accelerate import Accelerator

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.data.batching import MicroBatch, Step
from lora_gui.engine.text.train import load_text_data, run_step
from lora_gui.memory.runtime.guard import BatchCaps, MicroBatchOutOfMemory, RunOutOfMemoryError, run_guarded
from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models import text as text_models


def test_caps_recut_micro_batches_by_smallest_bucket_above():
    caps = BatchCaps({128: 4, 256: 2})
    step = Step((MicroBatch((0, 1, 2, 3, 4), 100), MicroBatch((5, 6, 7), 256), MicroBatch((8,), 512)))
    sizes = [(len(mb.indices), mb.seq_len) for mb in caps.apply(step).micro_batches]
    assert sizes == [(4, 100), (1, 100), (2, 256), (1, 256), (1, 512)]
    assert caps.apply(step).indices == step.indices


def test_a_cap_also_bounds_longer_rows():
    """An out-of-memory error at 64 tokens caps 64 and below; rows of more tokens never fit more
    of them, so they get the same cap instead of running out of memory again first."""
    caps = BatchCaps({64: 2})
    assert (caps.cap(32), caps.cap(64), caps.cap(100)) == (2, 2, 2)
    caps = BatchCaps({128: 4, 256: 6})  # a longer bucket's larger cap never lifts a shorter one's
    assert (caps.cap(100), caps.cap(200), caps.cap(512)) == (4, 4, 4)
    assert BatchCaps().cap(100) is None


def test_split_and_retry_lowers_the_cap_and_logs():
    events, calls = [], []

    def run(step):
        calls.append([len(mb.indices) for mb in step.micro_batches])
        for mb in step.micro_batches:
            if len(mb.indices) > 2:
                raise MicroBatchOutOfMemory(mb, torch.OutOfMemoryError("test"))
        return {"ok": True}

    caps = BatchCaps()
    assert run_guarded(run, Step((MicroBatch(tuple(range(8)), 64),)), caps, lambda: None, events.append)
    assert calls == [[8], [4, 4], [2, 2, 2, 2]]
    assert caps.caps == {64: 2} and [e["new_cap"] for e in events] == [4, 2]


def test_three_failures_at_one_stop_with_advice():
    def run(step):
        raise MicroBatchOutOfMemory(step.micro_batches[0], torch.OutOfMemoryError("test"))

    events = []
    with pytest.raises(RunOutOfMemoryError, match="max_seq_len|gradient_checkpointing"):
        run_guarded(run, Step((MicroBatch((0,), 64),)), BatchCaps(), lambda: None, events.append)
    assert [e["failures_at_one"] for e in events] == [1, 2, 3]


def test_real_out_of_memory_split_gives_the_unsplit_gradient(small_corpus, builtin_model_dir):
    cfg = apply_overrides(RunConfig(), {"data": str(small_corpus), "max_seq_len": 64})
    data = load_text_data(cfg, text_models.load_tokenizer(str(builtin_model_dir)))
    torch.manual_seed(0)
    model = text_models.attach_lora(text_models.load_base_model(str(builtin_model_dir), "sdpa"), cfg)
    accel = Accelerator(cpu=True)
    ids = tuple(range(8))
    step = Step((MicroBatch(ids, 64),))
    params = [p for p in model.parameters() if p.requires_grad]

    def peak_of(s: Step) -> int:
        model.zero_grad(set_to_none=True)
        with StorageTracker() as t:
            t.track(list(model.parameters()))
            run_step(model, accel, data, s)
            return t.peak_bytes

    whole_peak = peak_of(step)
    reference = [p.grad.clone() for p in params]
    half_peak = peak_of(Step((MicroBatch(ids[:4], 64), MicroBatch(ids[4:], 64))))
    assert half_peak < whole_peak
    model.zero_grad(set_to_none=True)
    events = []
    with StorageTracker(budget_bytes=(half_peak + whole_peak) // 2) as t:
        t.track(list(model.parameters()))
        run_guarded(lambda s: run_step(model, accel, data, s), step, caps := BatchCaps(),
                    lambda: model.zero_grad(set_to_none=True), events.append)
    assert caps.caps == {64: 4} and events[0]["event"] == "oom"
    for ref, p in zip(reference, params):
        torch.testing.assert_close(p.grad, ref, rtol=1e-4, atol=1e-6)


def test_run_that_cannot_fit_stops_cleanly_with_a_checkpoint(tmp_path, small_corpus):
    import json

    from lora_gui.engine.core import checkpoint as ckpt
    from lora_gui.engine.text.train import train_text

    cfg = apply_overrides(RunConfig(), {"data": str(small_corpus), "max_seq_len": 64, "budget_gb": 0.001,
                                        "max_steps": 3})
    run = train_text(cfg, tmp_path / "r", progress=False)  # 1 MB: below the 17 MB of frozen weights
    assert run["status"] == "out_of_memory" and run["steps"] == 0
    assert "does not fit" in run["message"] and "budget_gb" in run["message"]
    assert ckpt.latest_checkpoint(tmp_path / "r") is not None
    events = [json.loads(line) for line in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    assert [e["failures_at_one"] for e in events if e["event"] == "oom"] == [1, 2, 3]
    assert run["memory_report"]["budget_bytes"] == 1_000_000
