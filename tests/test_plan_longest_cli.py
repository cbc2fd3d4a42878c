"""`python -m lora_gui plan --longest`: one JSON object with the keys the issue names, and bad
input answered with a message (exit code 2), not a traceback. In-process (``main``), which is
what ``python -m lora_gui`` runs, to keep the tests quick."""

from __future__ import annotations

import json
import subprocess

import pytest

from lora_gui.cli import main


@pytest.fixture
def plan(capsys):
    def run(*args: str) -> subprocess.CompletedProcess:
        code = main(["plan", *args])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)
    return run


def test_longest_json_for_the_builtin_model_on_cpu(plan):
    res = plan("--preset", "text-demo", "--longest", "--json", "--device", "cpu", "--budget-gb", "0.05",
               "--set", "batch_size=1")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"longest_seq_len", "switches", "host_bytes", "peak_bytes", "capped_by_context"} <= out.keys()
    assert isinstance(out["longest_seq_len"], int) and 64 <= out["longest_seq_len"] <= 2048
    assert out["peak_bytes"] <= 0.05e9 and out["source"] == "predicted" and out["confirmed_by_trace"]


def test_longest_refuses_a_budget_below_the_weights(plan):
    res = plan("--longest", "--set", "model=llama-3.1-8b", "--budget-gb", "6", "--device", "cuda")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "the weights alone need 16.0" in res.stderr and "the budget is 6.00 GB" in res.stderr


def test_longest_for_an_image_run_gives_resolution_and_batch(plan):
    res = plan("--preset", "image-512", "--longest", "--json", "--device", "cpu", "--budget-gb", "2")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["task"] == "image" and out["largest_resolution"] >= 512 and out["batch_at_resolution"] >= 1


def test_longest_stops_at_host_memory_and_names_the_bound(plan):
    """The longest length fits the host memory allowed too (offloaded layer inputs live there),
    and the answer names the bound that stopped it."""
    args = ("--preset", "text-demo", "--longest", "--json", "--device", "cpu", "--budget-gb", "0.05",
            "--set", "batch_size=1")
    roomy = json.loads(plan(*args, "--host-gb", "100").stdout)
    tight = plan(*args, "--host-gb", "0.002")
    assert tight.returncode == 0, tight.stderr
    tight = json.loads(tight.stdout)
    assert roomy["bound"] == "card memory" and roomy["switches"].get("offload_checkpoints")
    assert tight["bound"] == "host memory" and tight["host_bytes"] <= 0.002e9 == tight["host_limit_bytes"]
    assert tight["longest_seq_len"] < roomy["longest_seq_len"]


def test_the_traced_host_memory_bounds_the_answer_where_the_estimate_was_low():
    """A length the estimate let through but whose trace needs more host memory than allowed
    steps down until the trace fits both bounds (it used to end in an error)."""
    from types import SimpleNamespace

    from lora_gui.memory.predict import longest_text

    def step(n):
        return SimpleNamespace(peak_bytes=1000 * n, cuda_overheads={}, info={"host_bytes": 50 * n})

    search = SimpleNamespace(budget=1_000_000, trace=lambda changes, n: step(n),
                             counted=lambda s: s.peak_bytes, estimate=lambda changes, n: (1000 * n, step(n)))
    seq_len, traced, traces, bound = longest_text._confirm(search, {}, 960, 4096, host_limit=25_000)
    assert 448 <= seq_len <= 500 and traced.info["host_bytes"] <= 25_000 and bound == "host memory"
    seq_len, _, _, bound = longest_text._confirm(search, {}, 960, 4096, host_limit=None)
    assert 960 <= seq_len <= 1000 and bound == "card memory"
