"""`train`'s closing lines: the adapter, the steps, the loss and held-out loss against the base
model's, the peak with what measured it, the time; --json for the whole summary; the progress bar
in words ('peak 0.0419 GB')."""

from __future__ import annotations

import json
from pathlib import Path

from lora_gui.cli import main
from lora_gui.cli.train_summary import duration_text, summary_lines
from lora_gui.engine.core.loop import progress_text
from lora_gui.units import gb

MIB = 2**20
TINY = {"max_steps": 2, "max_seq_len": 32, "batch_size": 4, "eval_fraction": 0.05, "precision": "fp32",
        "monitor_hz": 0.0, "warmup_steps": 0}


def _summary(adapter: Path, **extra) -> dict:
    """A text run's summary as train() returns it (the fields the lines read)."""
    return {"status": "completed", "message": None, "steps": 3, "final_loss": 4.98707,
            "eval_loss": 5.0123, "base_eval_loss": 5.0187, "eval_samples": 61, "train_seconds": 27.2,
            "peak_bytes": 117 * MIB, "memory_source": "tracker", "steps_measured": 2,
            "steps_not_measured": 1, "predicted_peak_bytes": 117 * MIB, "budget_bytes": None,
            "adapter": str(adapter), "real_tokens_per_s": 237.9, "world_size": 1, **extra}


def test_a_completed_run_in_a_few_lines(tmp_path):
    (tmp_path / "adapter").mkdir()
    lines = summary_lines(_summary(tmp_path / "adapter"), tmp_path, wall_seconds=57.0)
    assert lines[0] == "Training completed: 3 steps in 57 s (27 s of training steps)."
    text = "\n".join(lines)
    assert f"adapter:     {tmp_path / 'adapter'}" in text
    assert "loss:        4.9871 at the last step" in text
    assert "eval loss:   5.0123 on 61 held-out samples; the base model 5.0187 (-0.0064, -0.1%)" in text
    assert "peak memory: 0.123 GB (tracker, 2 of 3 steps measured); planned 0.123 GB (+0.0%)" in text
    assert f"details:     {tmp_path / 'run.json'}" in text
    assert len(lines) <= 8


def test_a_gpu_run_names_its_allocator_budget_and_processes(tmp_path):
    summary = _summary(tmp_path / "adapter", memory_source="cuda_allocator", steps_measured=None,
                       peak_bytes=10_240 * MIB, predicted_peak_bytes=10_342 * MIB,
                       budget_bytes=24_000_000_000, world_size=2)
    text = "\n".join(summary_lines(summary, tmp_path, wall_seconds=4000))
    assert ("peak memory: 10.74 GB (cuda_allocator), the largest of 2 processes; planned "
            "10.84 GB (+1.0%); budget 24.00 GB") in text
    assert "in 1 h 06 min" in text
    assert "adapter:     not saved" in text  # the folder is not there


def test_stopped_out_of_memory_and_unmeasured_runs_say_so(tmp_path):
    stopped = summary_lines(_summary(tmp_path, status="stopped", steps=1), tmp_path, 10, prog="lora-gui")
    assert stopped[0] == (f"Training stopped after 1 step in 10 s (27 s of training steps, earlier "
                          f"sessions included); continue with: lora-gui train --resume {tmp_path}.")
    oom = summary_lines(_summary(tmp_path, status="out_of_memory", message="step 2 needs 9 GB",
                                 peak_bytes=None, predicted_peak_bytes=None), tmp_path)
    assert oom[0] == ("Training ran out of memory after 3 steps in 27 s of training steps: "
                      "step 2 needs 9 GB")
    assert any(line.endswith("peak memory: not measured (tracker)") for line in oom)


def test_image_and_preference_runs_show_their_own_figures(tmp_path):
    (tmp_path / "adapter").mkdir()
    image = _summary(tmp_path / "adapter", eval_samples=None, eval_images=4, real_tokens_per_s=None,
                     images_per_s=1.5, cache_peak_bytes=300 * MIB, train_peak_bytes=200 * MIB,
                     peak_bytes=300 * MIB, kohya_adapter=str(tmp_path / "adapter" / "kohya.safetensors"))
    text = "\n".join(summary_lines(image, tmp_path, 5))
    assert "on 4 held-out pictures" in text and "1.50 pictures/s" in text and "kohya file:" in text
    assert "0.315 GB (tracker, 2 of 3 steps measured), while caching latents and embeddings; " \
           "training steps 0.210 GB" in text
    pairs = _summary(tmp_path / "adapter", eval_likelihood_accuracy=0.625,
                     base_eval_likelihood_accuracy=0.5, eval_pairs=16)
    assert ("  preference:  the chosen answer is the likelier one in 62% of 16 held-out pairs "
            "(the base model: 50%)") in summary_lines(pairs, tmp_path, 5)


def test_durations_and_the_progress_bar_in_words():
    assert [duration_text(s) for s in (0.4, 57.2, 119, 252, 3725)] == [
        "0 s", "57 s", "119 s", "4 min 12 s", "1 h 02 min"]
    assert progress_text({"loss": 5.10512, "peak_bytes": 40 * MIB + 5}) == "loss 5.105, peak 0.0419 GB"
    assert progress_text({"loss": 5.0, "peak_bytes": None}) == "loss 5.000, peak not measured"


def test_train_ends_with_the_summary_and_json_gives_the_whole_one(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    sets = [a for k, v in {**TINY, "data": small_corpus}.items() for a in ("--set", f"{k}={v}")]
    assert main(["train", "--out", str(out), *sets]) == 0
    printed, bar = capsys.readouterr()
    lines = printed.splitlines()
    assert lines[0].startswith("Training completed: 2 steps in ") and len(lines) <= 8, printed
    run = json.loads((out / "run.json").read_text())
    assert f"adapter:     {out / 'adapter'}" in printed and (out / "adapter").is_dir()
    assert f"peak memory: {gb(run['peak_bytes'])} (tracker" in printed
    assert f"the base model {run['base_eval_loss']:.4f}" in printed
    assert "peak_mb" not in bar and " GB" in bar and "loss " in bar  # the progress bar
    assert main(["train", "--out", str(out), "--overwrite", "--quiet", "--json", *sets]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["steps"] == 2 and shown["adapter"] == str(out / "adapter") and "config" not in shown
