"""bench/gpu/check.py runs end to end on a CPU in its smoke mode (tiny models, the same code paths
the lent GPU runs), and writes one JSON with planned allocated / reserved per row."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.integration
def test_gpu_check_smoke_writes_planned_vs_measured_rows(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    plans = tmp_path / "plans.json"
    # the plans first, alone (what runs on a CPU before a card is lent), then the check reads them
    res = subprocess.run([sys.executable, "-m", "bench.gpu.check", "--smoke", "--out", str(tmp_path),
                          "--plan-only", "--plans", str(plans), "--sections", "text,card"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    stored = json.loads(plans.read_text(encoding="utf-8"))["plans"]
    assert any(key.startswith("card:8gb:") and key.endswith(":longest") for key in stored)
    assert not (tmp_path / "gpu_check.json").exists()  # nothing measured
    res = subprocess.run([sys.executable, "-m", "bench.gpu.check", "--smoke", "--out", str(tmp_path),
                          "--plans", str(plans)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    assert out["device_name"] == "cpu (smoke)" and out["errors"] == {}
    by_seq = {row["seq_len"]: row for row in out["text"]}  # read back: the stored trace's figures
    key = next(k for k in stored if k.startswith("text:llama 64x2:") and k.endswith(":64"))
    trace = stored[key]["trace"]
    assert by_seq[64]["predicted_nvidia_smi_bytes"] == trace["peak_bytes"]
    steps = out["text"] + out["nf4"] + out["unet"] + out["dit"]
    assert len(steps) == 9
    for row in steps:  # reserved is at least allocated, nvidia-smi adds the context
        assert row["predicted_bytes"] <= row["predicted_reserved_bytes"] < row["predicted_nvidia_smi_bytes"]
    for row in out["text"][:1] + out["unet"] + out["dit"]:  # speed rows: rate, FLOPs and MFU
        assert row["step_s"] > 0 and row["useful_flops"] > 0 and 0 < row["mfu"] < 1.5
        assert row.get("tokens_per_s", 0) > 0 or row.get("images_per_s", 0) > 0
    assert "## Speed" in (tmp_path / "gpu_check.md").read_text(encoding="utf-8")
    cards = out["card"]
    # the planned lengths, the +2% row, then the longest again with each memory switch the other way
    rows = [r["row"] for r in cards]
    assert rows[:4] == ["as planned", "as planned", "+2% over the answer", "rebuilds off"]
    assert [r["row"].split()[0] for r in cards[4:]] == ["head", "offloaded", "chunked"]
    assert [r["planned_longest"] for r in cards] == [False, True] + [False] * 5
    answer, over, heads = cards[1], cards[2], cards[4]
    assert over["seq_len"] == -(-int(answer["seq_len"] * 1.02) // 64) * 64 > answer["seq_len"]
    assert all(r["seq_len"] == answer["seq_len"] for r in cards[3:])
    assert {answer["attention_head_groups"] or 0, heads["attention_head_groups"] or 0} == {0, 2}  # 2 kv heads
    on, off = sorted([answer, heads], key=lambda r: -(r["attention_head_groups"] or 0))
    assert on["attention_workspace_bytes"] < off["attention_workspace_bytes"]
    assert all(r["out_of_memory"] is False and r["attention_workspace_bytes"] > 0 for r in cards)
    assert answer["predicted_nvidia_smi_bytes"] <= answer["budget_bytes"]  # the plan fits the card
    assert answer["planned_to_fit"] and answer["agrees"]
    grads = out["grads"][0]  # the rebuilds' gradients against none, float32 on a CPU
    assert grads["tensors"] > 0 and grads["within"] and grads["max_relative_difference"] <= 1e-5
    assert "## Cards" in (tmp_path / "gpu_check.md").read_text(encoding="utf-8")


def test_the_h200_report_pairs_each_row_with_its_plan():
    """The lent card's results: every row found its plan, and the 8 GB longest length that ran
    out of memory under its cap is refused by the capped-run rule the plan now uses."""
    from bench.gpu.report import report

    folder = Path(__file__).resolve().parent.parent / "bench" / "results" / "gpu_h200"
    check = json.loads((folder / "run2_gpu_check.json").read_text(encoding="utf-8"))
    plans = json.loads((folder / "run2_plans.json").read_text(encoding="utf-8"))["plans"]
    text = report(check, plans)
    measured_rows = sum(len(check[s]) for s in ("text", "nf4", "unet", "dit", "card"))
    table_rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| row")
                  and not line.startswith("| card")]
    assert len(table_rows) == measured_rows
    oom = [line for line in table_rows if line.endswith("| out of memory |")]
    assert oom and all("| no | out of memory |" in line for line in oom)


@pytest.mark.integration
def test_gpu_check_video_rows_plan_first_then_read_the_plans_back(tmp_path):
    """The video section's smoke mode: tiny Wan- and LTX-shaped configs, planned alone first (as
    on a CPU before a card is lent), then measured with those plans read back, not traced again."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    plans = tmp_path / "plans.json"
    base = [sys.executable, "-m", "bench.gpu.check", "--smoke", "--out", str(tmp_path), "--sections", "video",
            "--plans", str(plans)]
    res = subprocess.run([*base, "--plan-only"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    written = json.loads(plans.read_text(encoding="utf-8"))
    stored = written["plans"]
    keys = [k for k in stored if k.startswith("video:")]
    assert len(keys) == 3 and any("LTX" in k for k in keys) and any("checkpointing=True" in k for k in keys)
    assert not (tmp_path / "gpu_check.json").exists()  # nothing measured
    stored[keys[0]]["trace"]["peak_bytes"] += 4096  # a mark only the stored plan carries
    plans.write_text(json.dumps(written), encoding="utf-8")
    res = subprocess.run(base, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    assert out["errors"] == {}
    rows = out["video"]
    assert [(r["clip"], r["gradient_checkpointing"], r["card"]) for r in rows] == [
        ("64x32x9", False, None), ("64x32x9", True, "8gb"), ("64x64x17", False, None)]
    for row, key in zip(rows, keys, strict=True):
        trace = stored[key]["trace"]  # read back: the stored plan's figures, not a new trace
        assert row["predicted_nvidia_smi_bytes"] == trace["peak_bytes"]
        assert row["predicted_bytes"] <= row["predicted_reserved_bytes"] < row["predicted_nvidia_smi_bytes"]
        assert row["video_tokens"] > 0 and row["planned_to_fit"] and row["agrees"]
        assert row["out_of_memory"] is False
    assert "## Video" in (tmp_path / "gpu_check.md").read_text(encoding="utf-8")
