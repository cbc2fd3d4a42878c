"""Each long-context switch measured on this CPU against the tracker: the real step (random
weights, real tensors, StorageTracker) against the planner's fake-tensor trace and closed form.

On a CPU "host" and "device" are the same RAM: the tracker counts the storages the switches
create as host memory (``on_host``) apart from the device peak, so the device peak a CUDA run
would see drops, and the host bytes are what it would keep in host memory."""

from __future__ import annotations

import pytest

from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.trace import trace_text_step
from tests.memory.conftest import tiny_llama

LOW, HIGH = 0.0, 0.03  # predicted / measured - 1, the project's bound
SWITCHES = {"offload_checkpoints": {"offload_checkpoints": True}, "mlp_chunk": {"mlp_chunk": 128},
            "embeddings_on_host": {"embeddings_on_host": True}}
STEP = dict(batch_size=1, seq_len=512, gradient_checkpointing=True, device="cpu", dtype="float32",
            loss_chunk=128, lora_rank=8)


def _config():
    cfg = tiny_llama(layers=3, vocab=2000)
    cfg.tie_word_embeddings = False
    return cfg


@pytest.fixture(scope="module")
def plain() -> tuple:
    return (trace_text_step(_config(), fake=False, **STEP), trace_text_step(_config(), **STEP))


@pytest.mark.slow  # ~10 s each alone: two real and two fake steps
@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_device_peak_drops_by_what_the_planner_says(switch, plain):
    measured_plain, predicted_plain = plain
    measured = trace_text_step(_config(), fake=False, **STEP, **SWITCHES[switch])
    predicted = trace_text_step(_config(), **STEP, **SWITCHES[switch])
    assert measured.info["source"] == "tracker" and predicted.info["source"] == "predicted"
    drop = measured_plain.traced_peak_bytes - measured.traced_peak_bytes
    predicted_drop = predicted_plain.traced_peak_bytes - predicted.traced_peak_bytes
    assert drop > 0, (switch, drop)
    assert LOW <= predicted.traced_peak_bytes / measured.traced_peak_bytes - 1 <= HIGH
    assert LOW <= predicted_drop / drop - 1 <= HIGH, (switch, predicted_drop, drop)
    assert predicted.info["host_bytes"] == measured.info["host_bytes"]
    assert (measured.info["host_bytes"] > 0) == (switch != "mlp_chunk")
    estimate = estimate_text_step(_config(), **{k: v for k, v in STEP.items() if k != "lora_rank"},
                                  lora_rank=8, **SWITCHES[switch])
    assert estimate.info["host_bytes"] == measured.info["host_bytes"]


def test_host_bytes_are_the_offloaded_inputs_and_the_table():
    cfg = _config()
    both = trace_text_step(cfg, **STEP, offload_checkpoints=True, embeddings_on_host=True)
    tokens, hidden, fp32 = 512, cfg.hidden_size, 4
    # all three layer inputs at the end of the forward, plus the table (the rows are gone by then)
    assert both.info["host_bytes"] == 3 * tokens * hidden * fp32 + cfg.vocab_size * hidden * fp32
