"""plan --longest: the longest max_seq_len under a budget, the switches it picks, and bad input.

Small models built from configs in code (written as a config.json the planner reads) or the
bundled ones; the 8B checks use the closed-form estimate only (instant) and the weights check."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.memory.predict import longest_text as longest_mod
from lora_gui.memory.predict.longest_image import longest_image
from lora_gui.memory.predict.longest_text import GRANULE, longest_text
from lora_gui.memory.runtime.host import check_host_memory, host_available_bytes
from tests.memory.conftest import tiny_llama


@pytest.fixture
def tiny_dir(tmp_path):
    """A 2-layer Llama with a 4,096-token context, as a model folder (config.json only)."""
    cfg = tiny_llama()
    cfg.max_position_embeddings = 4096
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(cfg.to_json_string(), encoding="utf-8")
    return folder


def run_cfg(model, **extra) -> RunConfig:
    return apply_overrides(RunConfig(), {"model": str(model), "batch_size": 1, "precision": "fp32", **extra})


def traced_peak(cfg: RunConfig, result, seq_len: int) -> int:
    """The run's own trace (the search's confirm function) at another length, same switches."""
    search = longest_mod._Search(replace(cfg, **result.switches), result.budget_bytes, "cpu", True)
    return search.trace({}, seq_len).peak_bytes


def test_longest_fits_and_ten_percent_more_does_not(tiny_dir):
    cfg = run_cfg(tiny_dir)
    result = longest_text(cfg, 0.02e9, "cpu")
    assert result.confirmed_by_trace and not result.capped_by_context
    assert GRANULE <= result.seq_len < 4096 and result.seq_len % GRANULE == 0
    assert result.peak_bytes <= 0.02e9  # the trace at the answer (source: predicted)
    assert traced_peak(cfg, result, int(result.seq_len * 1.1)) > 0.02e9
    out = result.to_json()
    assert {"longest_seq_len", "switches", "host_bytes", "peak_bytes"} <= out.keys()
    assert out["source"] == "predicted" and out["longest_seq_len"] == result.seq_len


def test_a_tight_budget_turns_on_switches_a_loose_one_needs_none(tiny_dir):
    cfg = run_cfg(tiny_dir, gradient_checkpointing=False, loss_chunk=0)
    loose = longest_text(cfg, 1e9, "cpu", confirm=False)
    assert loose.seq_len == 4096 and loose.capped_by_context and loose.switches == {}
    assert any("capped at the model's context (4,096 tokens)" in n for n in loose.notes)
    assert loose.memory_allows > 4096
    tight = longest_text(cfg, 0.02e9, "cpu", confirm=False)
    assert tight.switches.get("gradient_checkpointing") is True
    plain = longest_mod._Search(cfg, tight.budget_bytes, "cpu", True).longest({}, 4096)
    assert tight.seq_len > plain  # the switches it picked buy length


def test_beyond_context_searches_past_the_cap(tiny_dir):
    result = longest_text(run_cfg(tiny_dir), 0.2e9, "cpu", confirm=False, beyond_context=True)
    assert result.seq_len > 4096 and not result.capped_by_context
    assert any("beyond the model's context" in n for n in result.notes)


def test_measured_costs_are_read_and_reported(tiny_dir, tmp_path, monkeypatch):
    costs = tmp_path / "long_switches.json"
    costs.write_text(json.dumps({"gradient_checkpointing": {"slowdown": 1.31}, "loss_chunk": "bad"}))
    monkeypatch.setattr(longest_mod, "COSTS_FILE", costs)
    assert longest_mod.measured_costs(costs) == {"gradient_checkpointing": 1.31}
    result = longest_text(run_cfg(tiny_dir, loss_chunk=0), 0.02e9, "cpu", confirm=False)
    assert result.speed_cost["gradient_checkpointing"] == 1.31
    assert all(v is None for k, v in result.speed_cost.items() if k != "gradient_checkpointing")


def test_cheaper_switch_wins_when_both_reach_the_same_length():
    measured = {"gradient_checkpointing": 1.3, "loss_chunk": 1.01}
    assert longest_mod._cost({"loss_chunk": 1024}, measured) < longest_mod._cost(
        {"gradient_checkpointing": True}, measured)
    assert longest_mod._cost({"loss_chunk": 1024}, {}) < longest_mod._cost({"loss_chunk": 256}, {})


def test_weights_above_the_budget_name_both_figures_and_the_quantization_that_fits():
    cfg = apply_overrides(RunConfig(), {"model": "llama-3.1-8b", "batch_size": 1, "lora_rank": 32})
    with pytest.raises(ConfigError) as err:
        longest_text(cfg, 10e9, "cuda")
    text = str(err.value)
    assert "the weights alone need 16.0" in text and "the budget is 10.00 GB" in text
    assert "quantization=nf4 fits" in text


def test_the_8b_at_nf4_on_8_gb_fits_a_length_by_the_estimate():
    cfg = apply_overrides(RunConfig(), {"model": "llama-3.1-8b", "batch_size": 1, "lora_rank": 32,
                                        "quantization": "nf4"})
    result = longest_text(cfg, 8e9, "cuda", count_cuda_context=False, confirm=False)
    assert result.seq_len >= 2048 and result.switches.get("gradient_checkpointing") is True
    assert not result.count_cuda_context and result.cuda_context_bytes > 0
    with_context = longest_text(cfg, 8e9, "cuda", confirm=False)
    assert with_context.seq_len < result.seq_len  # the 500 MiB context costs length


def test_the_search_keeps_within_the_host_memory(tiny_dir):
    cfg = run_cfg(tiny_dir)
    free = longest_text(cfg, 0.012e9, "cpu", confirm=False)
    assert free.host_bytes > 0 and free.switches.get("embeddings_on_host") is True  # buys length
    short = longest_text(cfg, 0.012e9, "cpu", confirm=False, host_limit_bytes=free.host_bytes // 2)
    assert short.host_bytes <= free.host_bytes // 2 and short.seq_len < free.seq_len
    note = f"about {free.seq_len:,} tokens (estimate, not traced; host memory allowed"
    assert any(note in n for n in short.notes)
    forced = run_cfg(tiny_dir, gradient_checkpointing=True, offload_checkpoints=True)
    with pytest.raises(ConfigError, match=r"need [\d.]+ GB of host memory; 0.0+10 GB is available"):
        longest_text(forced, 0.015e9, "cpu", confirm=False, host_limit_bytes=10)


def test_host_memory_short_is_refused_with_both_figures():
    with pytest.raises(ConfigError, match=r"need 30.00 GB of host memory; 16.00 GB is available"):
        check_host_memory(30 * 10**9, 16 * 10**9, "offloaded checkpoints")
    check_host_memory(10, None, "anything")  # unknown: nothing refused
    available = host_available_bytes()
    assert available is None or available > 0


def test_image_runs_get_the_largest_resolution_and_batch():
    cfg = apply_overrides(RunConfig(), {"task": "image", "model": "builtin", "resolution": 512})
    result = longest_image(cfg, 2e9, "cpu")
    assert result["task"] == "image" and 512 <= result["largest_resolution"] <= 1536
    assert result["peak_bytes_at_largest"] <= 2e9 and result["batch_at_resolution"] >= 1
    with pytest.raises(ConfigError, match="nothing fits: 512 px at batch 1 needs"):
        longest_image(cfg, 1e6, "cpu")
    with pytest.raises(ConfigError, match="text runs"):
        longest_text(cfg, 2e9, "cpu")


def test_head_groups_are_not_proposed_until_a_card_confirms_them(monkeypatch):
    """Attention in key/value head groups ran out of memory at the 8 GB edge on the H200 where the
    same length without them fit: the search does not propose them (a user's own setting stays),
    and proposes them on CUDA only once the saving is marked confirmed."""
    from lora_gui.memory.predict import confirmed

    cfg = apply_overrides(RunConfig(), {"model": "llama-3.1-8b", "batch_size": 1, "lora_rank": 32,
                                        "quantization": "nf4"})
    assert not confirmed.is_confirmed("attention_head_groups")
    def groups(at, device="cuda"):
        return longest_mod.switch_choices(at, device)["attention_head_groups"]

    assert groups(cfg) == [0] and groups(replace(cfg, attention_head_groups=8)) == [8]
    monkeypatch.setattr(longest_mod, "is_confirmed", lambda name: True)
    assert groups(cfg) == [0, 8]  # one kv head a call
    assert groups(cfg, "cpu") == [0]  # no kernel scratch there
    assert groups(replace(cfg, attn_backend="eager")) == [0]


class _LineSearch:
    """A stand-in for the search's trace: peak = bytes_per_token x length (+ a curve), and an
    estimate whose slope is off by ``estimate_error`` (records every traced length)."""

    def __init__(self, limit: int, estimate_error: float, curve: float = 0.0) -> None:
        self.slope, self.curve, self.error = 200_000.0, curve, estimate_error
        self.budget = self.peak(limit)
        self.traced: list[int] = []

    def peak(self, n: int) -> int:
        return int(self.slope * n + self.curve * n * n)

    def trace(self, changes, n):
        self.traced.append(n)
        return SimpleNamespace(n=n, info={})

    def counted(self, step) -> int:
        return self.peak(step.n)

    def estimate(self, changes, n):
        return int(self.slope * (1 + self.error) * n), None


@pytest.mark.parametrize("start,estimate_error,curve", [(190_464, 0.06, 0.0), (190_464, -0.08, 0.0),
                                                        (190_464, 0.0, 0.2), (230_016, 0.05, 0.0),
                                                        (9_856, 0.1, 0.0), (150_016, -0.1, 0.3)])
def test_confirm_answers_a_traced_fit_within_two_percent_of_the_limit_in_few_traces(
        start, estimate_error, curve):
    limit = 198_270  # tokens where the line reaches the budget
    search = _LineSearch(limit, estimate_error, curve)
    n, step, traces, bound = longest_mod._confirm(search, {}, start, 1 << 20)
    assert n in search.traced and search.peak(n) <= search.budget  # only a length the trace fit
    assert traces == len(search.traced) <= 3
    assert limit * 0.98 <= n <= limit, (n, search.traced)
    assert bound == "card memory"


def test_image_longest_stops_at_the_largest_side_the_model_covers():
    """The built-in drawing model's position embedding covers 64 px (8 patches of 2 latents of
    4 px): its largest resolution is 64 px whatever the budget, not the 1536 px a DiT without the
    limit would get (a run at 1536 px would be refused by its transformer)."""
    from lora_gui.presets import load_config

    result = longest_image(load_config("image-demo"), 24e9, "cuda")
    assert result["largest_resolution"] == 64 and "covers at most 64 px" in result["note"]
    assert result["peak_bytes_at_largest"] <= 24e9 and result["batch_at_resolution"] >= 1
