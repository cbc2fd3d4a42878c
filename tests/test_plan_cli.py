import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lora_gui.memory.predict.trace_result import CUDA_CONTEXT_BYTES
from lora_gui.units import gb

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lora_gui", "plan", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)


def test_plan_json_for_the_demo_preset():
    res = plan("--preset", "text-demo", "--budget-gb", "8", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"peak_bytes", "breakdown", "fits", "batch_by_bucket", "traced_peak_bytes"} <= out.keys()
    assert out["fits"] is True and out["source"] == "predicted"
    assert sum(out["breakdown"].values()) == out["traced_peak_bytes"]
    assert out["peak_bytes"] == out["traced_peak_bytes"] + sum(out["cuda_overheads"].values())
    assert out["batch_by_bucket"]["1024"] >= 1


def test_plan_an_8b_model_offline_that_does_not_fit():
    res = plan("--set", "model=llama-3.1-8b", "--set", "max_seq_len=2048", "--budget-gb", "8", "--device",
               "cuda", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["fits"] is False and "frozen weights" in out["message"] and "short" in out["message"]
    assert out["peak_bytes"] > 16e9


def test_plan_text_output_has_breakdown_and_card_table():
    res = plan("--preset", "text-demo", "--budget-gb", "4")
    assert res.returncode == 0, res.stderr
    for word in ("frozen_weights", "activations", "micro-batch", "What fits where", "80 GB"):
        assert word in res.stdout


def test_plan_rejects_absurd_budgets():
    for bad in ("-1", "0", "1e9"):
        res = plan("--preset", "text-demo", "--budget-gb", bad)
        assert res.returncode == 2 and "budget" in res.stderr and "Traceback" not in res.stderr


def test_plan_for_a_card_shows_what_the_card_holds():
    from lora_gui.cards import CARDS

    res = plan("--preset", "text-demo", "--card", "8GB", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["budget_bytes"] == CARDS["8gb"].total_bytes  # the card's whole memory, context counted
    assert out["allocated_bytes"] <= out["reserved_bytes"] < out["nvidia_smi_bytes"] == out["peak_bytes"]
    assert out["nvidia_smi_bytes"] - out["reserved_bytes"] == out["cuda_overheads"]["cuda_context"]
    names = {(r["kernel"], r["name"]) for r in out["cuda_kernels"]}
    assert ("sdpa_flash", "dq_accum (float32)") in names and out["attention_workspace_bytes"] > 0


def test_plan_card_and_budget_flags_are_checked():
    res = plan("--preset", "text-demo", "--card", "rtx-9999")
    assert res.returncode == 2 and "known cards" in res.stderr and "h100-80gb" in res.stderr
    res = plan("--preset", "text-demo", "--card", "8gb", "--budget-gb", "8")
    assert res.returncode == 2 and "give one budget" in res.stderr
    res = plan("--preset", "text-demo", "--budget-gb", "0.3", "--device", "cuda", "--json")
    out = json.loads(res.stdout)
    short = gb(CUDA_CONTEXT_BYTES - 0.3e9)  # the context the plan counts, less the budget
    assert out["fits"] is False and "CUDA context alone" in out["message"] and short in out["message"]


def test_plan_says_how_few_layers_a_checkpointing_run_can_checkpoint():
    """With checkpointing on every layer (here: the largest micro-batches, so the plan does not
    choose the layers itself) and room in the budget, the plan names the fewest layers to
    checkpoint with the same micro-batches (the search itself: tests/models/test_checkpoint_layers.py;
    the plan's own choice: tests/memory/test_checkpoint_choice.py)."""
    roomy = plan("--preset", "text-demo", "--set", "gradient_checkpointing=true", "--set", "precision=fp32",
                 "--set", "batch_choice=largest", "--device", "cpu", "--budget-gb", "0.1")
    assert roomy.returncode == 0, roomy.stderr
    assert "Faster within the budget: checkpoint_layers=3 " in roomy.stdout


def test_a_bundled_unet_without_a_budget_plans_as_a_run_without_one():
    """No card, no budget and no GPU: every bucket at batch_size, as a run without a budget trains,
    not a plan against a card nobody picked."""
    res = plan("--set", "task=image", "--set", "model=sd15-unet", "--set", "resolution=256",
               "--set", "batch_size=2", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert "No budget to judge against: every bucket at batch_size 2" in res.stdout
    assert "24 GB" not in res.stdout and "Budget" not in res.stdout


@pytest.mark.parametrize("fields, words", [
    ({"video_frames": "10"}, "video_frames: 10 is not 4k+1 frames for this model; use 9 or 13"),
    ({"resolution": "72x32"},
     "resolution: 72x32 is not a multiple of wan2.1-t2v-1.3b's 16 px grid on both sides"),
])
def test_a_video_clip_off_the_grid_names_the_field_and_value_as_the_plan_tab_does(fields, words):
    """A bundled Wan config with a clip off its grid: `plan` refuses it before any trace, in the
    Plan tab's words (one check on the engine side, both front ends call it)."""
    from lora_gui.ui.tabs import plan_handlers

    shape = {"resolution": "64x32", "video_frames": "5", **fields}
    sets = [arg for key, value in shape.items() for arg in ("--set", f"{key}={value}")]
    res = plan("--set", "task=video", "--set", "model=wan2.1-t2v-1.3b", "--device", "cpu",
               "--budget-gb", "24", *sets)
    assert res.returncode != 0 and res.stdout == ""
    assert res.stderr.strip() == f"error: {words}"
    _, tab, _, _ = plan_handlers.plan("text-demo", "wan2.1-t2v-1.3b", 0, 0, 24, "cpu", False, "none",
                                      video_resolution=shape["resolution"],
                                      video_frames=int(shape["video_frames"]))
    assert tab.startswith(f"Error: {words}"), tab
