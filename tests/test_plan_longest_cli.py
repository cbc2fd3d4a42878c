"""`python -m lora_gui plan --longest`: one JSON object with the keys the issue names, and bad
input answered with a message (exit code 2), not a traceback. In-process (``main``), which is
what ``python -m lora_gui`` runs, to keep the tests quick."""

from __future__ import annotations

import json
import subprocess

import pytest

from lora_gui.__main__ import main


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
    res = plan("--longest", "--set", "model=llama-3.1-8b", "--budget-gb", "6")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "the weights alone need 16.0" in res.stderr and "the budget is 6.00 GB" in res.stderr


def test_longest_for_an_image_run_gives_resolution_and_batch(plan):
    res = plan("--preset", "image-512", "--longest", "--json", "--device", "cpu", "--budget-gb", "2")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["task"] == "image" and out["largest_resolution"] >= 512 and out["batch_at_resolution"] >= 1
