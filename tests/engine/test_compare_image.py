"""compare --resolutions: image rows through the real image engine, labelled, resumable, OOM rows."""

import json

import pytest

from lora_gui.cli import main
from lora_gui.data.build_images import build
from lora_gui.engine.compare.image_rows import IMAGE_ABLATIONS, image_modes, image_overrides

FIELDS = {"question", "data", "mode", "resolution", "batch_size", "peak_bytes", "memory_source",
          "predicted_peak_bytes", "images_per_s", "final_loss", "eval_loss"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("pictures")
    build(out, count=5)  # 4 training images, 1 held out
    return out


def _args(folder, out, *extra):
    sets = {"data": folder, "batch_size": 2, "eval_fraction": 0.2}
    return ["compare", "--preset", "image-512", "--resolutions", "512", "--steps", "1", "--out", str(out),
            "--quiet", *[x for k, v in sets.items() for x in ("--set", f"{k}={v}")], *extra]


def test_ablation_rows_switch_one_thing_over_traditional():
    modes = image_modes("memory", ablations=True)
    assert modes[:3] == ["traditional", "strong_baseline", "optimized"]
    assert len(modes) == 3 + len(IMAGE_ABLATIONS) and image_modes("speed", True) == modes[:3]
    trad = image_overrides("traditional", "memory")
    for name in IMAGE_ABLATIONS:
        diff = {k for k, v in image_overrides(f"ablation:{name}", "memory").items() if trad[k] != v}
        assert len(diff) == 1, (name, diff)
    assert image_overrides("optimized", "memory")["gradient_checkpointing"] is True
    assert image_overrides("optimized", "speed")["gradient_checkpointing"] is False


def test_image_rows_are_real_labelled_resume_and_record_ooms(folder, tmp_path, capsys):
    """The speed question under a 0.15 GB budget: below traditional's (eager, encoders resident:
    ~1.7 GB) and the strong baseline's (~0.2 GB) step at batch 2, above optimized's (~0.1 GB).
    (The memory question's saving is tested in test_engine_diffusion; its rows are the same runs.)"""
    out = tmp_path / "cmp"
    args = _args(folder, out, "--no-ablations", "--questions", "speed", "--set", "budget_gb=0.15")
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in rows] == ["traditional", "strong_baseline", "optimized"]
    assert all(r["question"] == "speed" and r["data"] == "images" and r["resolution"] == 512
               and r["budget_bytes"] == 150_000_000 for r in rows)
    trad, strong, opt = rows
    assert trad["status"] == strong["status"] == "oom" and trad["message"].startswith("OOM at batch 2")
    assert FIELDS <= opt.keys() and opt["status"] == "ok" and opt["memory_source"] == "tracker"
    assert 0 < opt["peak_bytes"] <= 150_000_000 and opt["images_per_s"] > 0
    saved = (out / "compare.json").read_text()
    runs = sorted(p.stat().st_mtime_ns for p in (out / "runs").rglob("run.json"))
    assert main(args) == 0  # resumes: every row is there, nothing is trained again
    assert (out / "compare.json").read_text() == saved
    assert sorted(p.stat().st_mtime_ns for p in (out / "runs").rglob("run.json")) == runs
    assert "strong_baseline" in (out / "compare.csv").read_text()


def test_speed_without_a_budget_or_memory_row_is_refused(folder, tmp_path, capsys):
    assert main(_args(folder, tmp_path / "s", "--questions", "speed")) == 2
    assert "budget_gb" in capsys.readouterr().err
