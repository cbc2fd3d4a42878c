import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lora_gui.memory.runtime.tracker import StorageTracker


def test_counts_new_storages_once_and_frees_them():
    with StorageTracker() as t:
        a = torch.zeros(1000)  # 4000 bytes
        view = a.view(10, 100)  # same storage: free
        b = torch.ones(500, dtype=torch.float64)  # 4000 bytes
        assert t.live_bytes == 8000
        del a, view
        assert t.live_bytes == 4000
        del b
        assert t.live_bytes == 0 and t.peak_bytes == 8000
        t.reset_peak()
        assert t.peak_bytes == 0


def test_tracks_existing_tensors_and_backward():
    layer = torch.nn.Linear(64, 32)
    with StorageTracker() as t:
        t.track(layer.parameters())
        assert t.live_bytes == (64 * 32 + 32) * 4
        x = torch.randn(16, 64)
        layer(x).sum().backward()
        grads = (64 * 32 + 32) * 4
        assert t.live_bytes >= (64 * 32 + 32) * 4 + grads


def test_works_on_fake_tensors():
    with FakeTensorMode(), StorageTracker() as t:
        x = torch.empty(1024, 1024)
        y = x @ x
        assert t.live_bytes == 2 * 4 * 2**20
        del y


def test_budget_raises_out_of_memory_and_keeps_count_consistent():
    with pytest.raises(torch.OutOfMemoryError, match="simulated VRAM budget"):
        with StorageTracker(budget_bytes=10_000) as t:
            keep = torch.zeros(1000)  # 4000: fits
            torch.zeros(2000)  # 8000 more: would pass 10000
    assert t.live_bytes == 4000
    del keep
    assert t.live_bytes == 0


def test_a_freed_storage_is_uncounted_and_a_new_one_at_its_address_counted_again():
    with StorageTracker() as t:
        for _ in range(50):  # the allocator hands the same addresses back: each one counts anew
            a = torch.empty(256)
            b = a + 1
            assert t.live_bytes == 2 * 1024
            del a, b
            assert t.live_bytes == 0
        assert t.peak_bytes == 2 * 1024
        pair = torch.empty(8).chunk(2)  # several outputs of one storage count once
        assert t.live_bytes == 32
        del pair


def _reference_dispatch(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
    """The tracker's per-op count without its fast paths: every output walked as a pytree."""
    from torch.utils._pytree import tree_leaves

    from lora_gui.memory.runtime.tracker import in_host_scope

    out = func(*args, **(kwargs or {}))
    new = self._new_storages(tree_leaves(out))
    (self._count_host if new and in_host_scope() else self._count)(new)
    return out


def test_the_trace_fast_path_predicts_the_same_bytes_as_the_plain_count(monkeypatch):
    """The trace's dispatch (no-tensor ops returned at once, unwrapped by dynamo) changes no
    predicted byte: every figure of a CUDA trace with the long-context switches is the same as
    with the plain per-op count."""
    from lora_gui.memory.predict.trace import trace_text_step
    from lora_gui.memory.predict.trace_result import _PhaseTracker
    from tests.memory.conftest import tiny_llama

    kw = dict(config=tiny_llama(), batch_size=1, seq_len=256, device="cuda", gradient_checkpointing=True,
              offload_checkpoints=True, mlp_chunk=64, embeddings_on_host=True, loss_chunk=64,
              attention_head_groups=2, lora_dropout=0.1)
    fast = trace_text_step(**kw)
    monkeypatch.setattr(_PhaseTracker, "__torch_dispatch__", _reference_dispatch)
    plain = trace_text_step(**kw)
    for step in (fast, plain):
        step.info.pop("seconds", None)
    assert (fast.peak_bytes, fast.breakdown, fast.cuda_overheads, fast.info) == \
        (plain.peak_bytes, plain.breakdown, plain.cuda_overheads, plain.info)
    assert fast.info["host_bytes"] > 0 and fast.info["allocator_replay"]["peak_pages"] > 0


def test_a_storage_resized_in_place_moves_the_count():
    """FSDP2 frees a gathered layer by resizing its storage to 0 bytes and gathers it again into
    the same storage: the tracker follows both, and stops following once it is left."""
    with StorageTracker() as t:
        x = torch.empty(1000, dtype=torch.float32)
        assert t.live_bytes == 4000
        x.untyped_storage().resize_(0)
        assert t.live_bytes == 0 and t.peak_bytes == 4000
        x.untyped_storage().resize_(8000)
        assert t.live_bytes == 8000 and t.peak_bytes == 8000
        del x
        assert t.live_bytes == 0
    assert torch.UntypedStorage.resize_ is torch._C.StorageBase.resize_  # the method is back
