"""fp8 base weights and 8-bit AdamW on a video run (the built-in tiny Wan pipeline): the run's own
prediction and `plan` against the tracked peak, the saving against the same run without them,
the loss, and the settings refused before a run starts."""

from __future__ import annotations

import pytest
import torch

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine import train
from lora_gui.memory.predict import predict
from tests.engine.test_video_run import HIGH, LOW, clips_folder, video_cfg  # noqa: F401 (fixture)


def _run(cfg: RunConfig, out) -> dict:
    summary = train(cfg, out, progress=False)
    assert summary["status"] == "completed"
    return summary


def _train_error(summary: dict) -> float:
    return summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1


@pytest.fixture(scope="module")
def baseline(clips_folder, tmp_path_factory):  # noqa: F811
    cfg = video_cfg(clips_folder, gradient_checkpointing=True)
    return _run(cfg, tmp_path_factory.mktemp("base") / "run")


def test_fp8_base_is_predicted_within_band_and_lowers_the_training_peak(clips_folder, tmp_path, baseline):  # noqa: F811
    cfg = video_cfg(clips_folder, gradient_checkpointing=True, quantization="fp8")
    summary = _run(cfg, tmp_path / "run")
    report = summary["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    assert LOW <= _train_error(summary) <= HIGH, (summary["prediction"], summary["train_peak_bytes"])
    planned = predict(cfg, None, "cpu")  # `plan`: the same function on the meta pipeline
    assert planned.train_peak_bytes == summary["prediction"]["train_peak_bytes"]
    assert summary["train_peak_bytes"] < baseline["train_peak_bytes"]  # 1 byte a weight, not 4
    losses = [summary["final_loss"], baseline["final_loss"]]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert abs(losses[0] - losses[1]) < 0.05 * losses[1]  # the same steps on rounded weights


def test_fp8_keeps_lora_and_norms_in_the_compute_dtype():
    from lora_gui.models.diffusion import image_model_for_run

    cfg = apply_overrides(RunConfig(), {"task": "video", "model": "builtin:video", "quantization": "fp8",
                                        "gradient_checkpointing": True})
    model = image_model_for_run(cfg, torch.float32)
    dtypes = {name: p.dtype for name, p in model.unet.named_parameters()}
    assert dtypes["blocks.0.attn1.to_q.base_layer.weight"] == torch.float8_e4m3fn
    assert dtypes["blocks.0.ffn.net.0.proj.weight"] == torch.float8_e4m3fn
    assert all(d == torch.float32 for n, d in dtypes.items() if "lora_" in n or "norm" in n)
    assert dtypes["patch_embedding.weight"] == torch.float32


def test_adamw8bit_is_planned_as_it_runs(clips_folder, tmp_path, baseline):  # noqa: F811
    cfg = video_cfg(clips_folder, gradient_checkpointing=True, optimizer="adamw8bit")
    summary = _run(cfg, tmp_path / "run")
    assert LOW <= _train_error(summary) <= HIGH, (summary["prediction"], summary["train_peak_bytes"])
    planned = predict(cfg, None, "cpu")
    assert planned.step.info["optimizer"] == "adamw8bit"
    assert abs(summary["final_loss"] - baseline["final_loss"]) < 0.05 * baseline["final_loss"]


def test_plan_counts_8bit_states_below_adamw_at_a_real_shape():
    from lora_gui.memory.predict.video_run import plan_video_shape, shape_config

    base = {"task": "video", "model": "builtin:video", "resolution": "32x32", "video_frames": 5,
            "text_max_length": 8, "batch_size": 1, "lora_rank": 128}
    cfg = apply_overrides(RunConfig(), base)
    config = shape_config(cfg)
    adamw = plan_video_shape(cfg, config, None, "cpu").step.breakdown["optimizer_state"]
    eight = plan_video_shape(apply_overrides(cfg, {"optimizer": "adamw8bit"}), config, None,
                             "cpu").step.breakdown["optimizer_state"]
    assert 0 < eight < adamw


@pytest.mark.parametrize("settings, field", [
    ({"task": "video", "quantization": "fp8"}, "gradient_checkpointing"),
    ({"task": "video", "quantization": "nf4", "gradient_checkpointing": True}, "quantization"),
    ({"task": "text", "quantization": "fp8"}, "quantization"),
    ({"task": "image", "quantization": "fp8"}, "quantization"),
])
def test_combinations_that_do_not_run_are_refused_naming_the_field(settings, field):
    with pytest.raises(ConfigError, match=field):
        apply_overrides(RunConfig(), settings)
