"""bench/gpu/check.py runs end to end on a CPU in its smoke mode (tiny models, the same code paths
the lent GPU runs), and writes one JSON with planned allocated / reserved per row."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    plan, *runs = out["offload"]  # a CPU never offloads: the plan says so, the on-card run still runs
    assert plan["choice"]["offload_checkpoints"] is False and "a CPU" in plan["note"]
    assert [r["row"] for r in runs] == ["on the card"] and runs[0]["measured_tokens_per_s"] > 0
    assert runs[0]["peak_bytes"] <= runs[0]["budget_bytes"]


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


def test_the_tuned_peers_name_why_a_peer_cannot_run(tmp_path, monkeypatch):
    from bench.gpu import peers_tuned as tuned

    assert tuned.why_not("unsloth", cuda=False) == "Unsloth needs a CUDA GPU"
    monkeypatch.delenv(tuned.UNSLOTH_SITE_ENV, raising=False)
    assert tuned.UNSLOTH_SITE_ENV in tuned.why_not("unsloth", cuda=True)
    (tmp_path / "unsloth").mkdir()
    monkeypatch.setenv(tuned.UNSLOTH_SITE_ENV, str(tmp_path))
    assert tuned.why_not("unsloth", cuda=True) is None
    monkeypatch.setattr(tuned.importlib.util, "find_spec", lambda name: None)
    assert "trl is not installed" in tuned.why_not("trl-tuned", cuda=True)
    assert tuned.why_not("lora_gui", cuda=False) is None


def test_the_tuned_peers_documents_have_the_issue_lengths():
    from bench.gpu.peers_tuned import documents

    fixed = documents(2048, 4096, total=8192)
    assert [len(d) for d in fixed] == [2048] * 4 and all(3 <= t < 4096 for d in fixed for t in d)
    mixed = [len(d) for d in documents("mixed", 4096, total=20_000)]
    assert sum(mixed) >= 20_000 and min(mixed) >= 64 and max(mixed) <= 2048 and len(set(mixed)) > 10


def test_the_tuned_peers_table_shows_measured_and_skipped_rows():
    from bench.gpu.peers_tuned import markdown

    rows = [{"model": "llama-1b", "length": 2048, "trainer": "trl-tuned", "real_tokens_per_s": 12345.6,
             "peak_allocated_bytes": 3 * 2**30, "peak_reserved_bytes": 4 * 2**30, "train_loss": 8.25},
            {"model": "llama-1b", "length": 2048, "trainer": "unsloth",
             "skipped": "Unsloth needs a CUDA GPU"},
            {"model": "llama-1b", "length": 2048, "trainer": "lora_gui", "error": "Traceback\nValueError: x"}]
    table = "\n".join(markdown(rows))
    assert "| llama-1b | 2048 | trl-tuned | 12,346 | 3,072 | 4,096 | 8.250 |  |" in table
    assert "| Unsloth needs a CUDA GPU |" in table and "failed: ValueError: x" in table


def _check(tmp_path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "bench.gpu.check", "--out", str(tmp_path), *args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))


def test_the_2_gpu_check_says_it_skipped_without_two_gpus(tmp_path):
    """On a machine without two GPUs the section writes one row saying so, and the report too."""
    import torch

    out = _check(tmp_path, "--sections", "multi_gpu")
    assert out["errors"] == {}
    assert out["multi_gpu"] == [{"row": "2 GPUs, FSDP, nf4 base",
                                 "skipped": f"skipped: {torch.cuda.device_count()} GPUs"}]
    assert "2 GPUs, FSDP, nf4 base: skipped: " in (tmp_path / "gpu_check.md").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.integration
def test_peers_smoke_runs_tuned_trl_and_says_why_unsloth_cannot(tmp_path):
    pytest.importorskip("trl")  # a bench-only package (bench/requirements.txt)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "bench.gpu.check", "--smoke", "--out", str(tmp_path),
                          "--sections", "peers"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [r for r in json.loads((tmp_path / "gpu_check.json").read_text())["peers"] if "length" in r]
    by = {(r["length"], r["trainer"]): r for r in rows}
    assert {t for _, t in by} == {"lora_gui", "trl-tuned", "unsloth"}
    assert all(by[(n, "unsloth")]["skipped"] == "Unsloth needs a CUDA GPU" for n in (128, "mixed"))
    assert all(by[(n, t)]["real_tokens_per_s"] > 0 for n in (128, "mixed") for t in ("lora_gui", "trl-tuned"))


def test_the_2_gpu_checks_smoke_mode_reads_each_ranks_peak_beside_the_per_rank_plan(tmp_path):
    """Smoke mode: the same launch (accelerate, the FSDP config, 2 gloo processes) on the bundled
    model; each rank's measured peak (the tracker) beside the per-rank plan, which is the figure
    the run logged as its own plan."""
    out = _check(tmp_path, "--smoke", "--sections", "multi_gpu")
    assert out["errors"] == {}
    rows = out["multi_gpu"]
    assert [r["rank"] for r in rows] == [0, 1]
    for row in rows:
        assert row["fsdp"] is True and row["world_size"] == 2 and row["measured_source"] == "tracker"
        assert row["predicted_bytes"] == row["run_predicted_bytes"] > 0
        assert row["measured_bytes"] > row["frozen_bytes"] > 0
        assert row["error"] == (row["predicted_bytes"] - row["measured_bytes"]) / row["measured_bytes"]
    assert "| bundled demo model | 1 | 64 x 4 |" in (tmp_path / "gpu_check.md").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.integration
def test_image_peers_smoke_runs_both_sides_and_judges_them(tmp_path):
    """The image_peers section on a CPU (tiny SDXL and Flux, 64 px): lora_gui's run and each script
    configuration in processes of their own, with images/s, MFU and peaks per row. The scripts
    need the bench's torchvision (bench/.peer_deps); where it is missing their rows say so and the
    verdict says it was not measured."""
    from bench.gpu.image_peers import PEER_DEPS

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bench.gpu.check", "--smoke", "--out", str(tmp_path),
                             "--sections", "image_peers"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=600)
    finally:  # a timeout or an interrupt ends the check and the runs it started (one process group)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, output[-3000:]
    out = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    assert out["errors"] == {}
    section = out["image_peers"]
    rows, verdicts = section["rows"], section["verdicts"]
    assert [v["pipeline"] for v in verdicts] == ["sdxl", "flux"]
    for pipeline in ("sdxl", "flux"):
        mine = [r for r in rows if r["pipeline"] == pipeline]
        assert [r["side"] for r in mine] == ["diffusers script", "diffusers script", "lora_gui"]
        assert [r.get("gradient_checkpointing") for r in mine[:2]] == [False, True]
        lora = mine[2]
        assert lora["images_per_s"] > 0 and lora["timed_steps"] == 2  # 4 steps, 2 of warm-up
        assert lora["useful_flops_per_image"] > 0 and 0 < lora["mfu"] < 1.5
        assert lora["peak_allocated_bytes"] > 0 and lora["memory_source"] == "tracker"
        if (PEER_DEPS / "torchvision").is_dir():
            for script in mine[:2]:  # the same LoRA on both sides: the same FLOPs per image
                assert script["images_per_s"] > 0 and script["trainable_params"] == lora["trainable_params"]
                assert script["useful_flops_per_image"] == lora["useful_flops_per_image"]
            verdict = verdicts[[v["pipeline"] for v in verdicts].index(pipeline)]
            assert verdict["met"] in (True, False) and verdict["speed_ratio"] > 0 and verdict["same_lora"]
        else:
            assert all("torchvision" in script["error"] for script in mine[:2])
            assert all(v["met"] is None and "no script configuration ran" in v["why"] for v in verdicts)
    assert "## Images: diffusers' LoRA scripts vs lora_gui" in (tmp_path / "gpu_check.md").read_text(
        encoding="utf-8")


def test_image_peers_verdict_is_against_the_fastest_script_configuration_that_ran():
    from bench.gpu.image_peers import markdown, verdict

    def row(side, rate, peak, gc=False, oom=False, params=100):
        return {"pipeline": "flux", "side": side, "config": f"{side} gc={gc}", "images_per_s": rate,
                "peak_allocated_bytes": peak, "peak_reserved_bytes": peak + 10, "out_of_memory": oom,
                "trainable_params": params, "memory_source": "cuda_allocator", "resolution": 1024, "batch": 1}

    scripts = [row("diffusers script", None, 90, oom=True), row("diffusers script", 1.0, 50, gc=True)]
    met = verdict([*scripts, row("lora_gui", 1.4, 50)])
    assert met["fastest_script_config"] == "diffusers script gc=True"  # the one without checkpointing ran out
    assert met["met"] and abs(met["speed_ratio"] - 1.4) < 1e-9 and met["peak_allocated_ratio"] == 1.0
    assert not verdict([*scripts, row("lora_gui", 1.2, 40)])["met"]  # too slow
    assert not verdict([*scripts, row("lora_gui", 2.0, 51)])["met"]  # faster, but more peak memory
    assert not verdict([*scripts, row("lora_gui", 2.0, 40, params=99)])["same_lora"]
    none = verdict([scripts[0], row("lora_gui", 2.0, 40)])
    assert none["met"] is None and "no script configuration ran" in none["why"]
    text = "\n".join(markdown({"rows": [*scripts, row("lora_gui", 1.4, 50)], "verdicts": [met, none]}))
    assert "| 1.40x | 1.00x |" in text and "| met |" in text and "out of memory" in text


def test_image_peer_step_meter_stamps_real_steps_only_and_stops_a_script_after_its_last():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bench.gpu.image_peer_run import StepMeter, StepsDone
    from bench.gpu.image_peers import Contest, speed

    meter = StepMeter(warmup=1, stop_after=2)
    handle = meter.install()
    try:
        with FakeTensorMode():  # a planner's traced step: fake parameters, not a training step
            fake = torch.nn.Parameter(torch.ones(3))
            torch.optim.SGD([fake], lr=0.1).step()
        real = torch.nn.Parameter(torch.ones(5))
        opt = torch.optim.SGD([real], lr=0.1)
        opt.step()
        with pytest.raises(StepsDone):
            opt.step()
    finally:
        handle.remove()
    result = meter.result()
    assert len(result["stamps"]) == 2 and result["trainable_params"] == 5
    contest = Contest("flux", batch=2, steps=4, warmup=1)
    timed = speed({"stamps": [0.0, 1.0, 1.5, 2.5]}, contest)  # gaps after the warm-up step: 1, 0.5, 1
    assert timed == {"images_per_s": 2.0, "median_step_s": 1.0, "timed_steps": 3}
    assert speed({"stamps": [0.0, 1.0], "out_of_memory": True}, contest)["images_per_s"] is None


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
    assert len(keys) == 5 and any("LTX" in k for k in keys) and any("checkpointing=True" in k for k in keys)
    assert any("blocks_to_swap=1" in k for k in keys)
    assert any("quantization=fp8" in k for k in keys)
    assert not (tmp_path / "gpu_check.json").exists()  # nothing measured
    stored[keys[0]]["trace"]["peak_bytes"] += 4096  # a mark only the stored plan carries
    plans.write_text(json.dumps(written), encoding="utf-8")
    res = subprocess.run(base, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    assert out["errors"] == {}
    rows = out["video"]
    assert [(r["clip"], r["gradient_checkpointing"], r["card"]) for r in rows] == [
        ("64x32x9", False, None), ("64x32x9", True, "8gb"), ("64x32x9", True, None),
        ("64x32x9", True, None), ("64x64x17", False, None)]
    swapped = rows[2]  # block swap: the host bytes planned are the host bytes the step held
    assert swapped["blocks_to_swap"] == 1
    assert swapped["planned_host_bytes"] == swapped["measured_host_bytes"] > 0
    for row, key in zip(rows, keys, strict=True):
        trace = stored[key]["trace"]  # read back: the stored plan's figures, not a new trace
        assert row["predicted_nvidia_smi_bytes"] == trace["peak_bytes"]
        assert row["predicted_bytes"] <= row["predicted_reserved_bytes"] < row["predicted_nvidia_smi_bytes"]
        assert row["video_tokens"] > 0 and row["planned_to_fit"] and row["agrees"]
        assert row["out_of_memory"] is False
    assert "## Video" in (tmp_path / "gpu_check.md").read_text(encoding="utf-8")
