"""Checkpointing only the first blocks of a video transformer (``checkpoint_layers``) on the
built-in tiny Wan pipeline (4 blocks): the same loss and LoRA gradients as every block
checkpointed (with and without block swap), the run's prediction and `plan` within the band of
the tracked peak, the peak between every block checkpointed and none, with block swap, fp8 and a
space-time window, the fewest blocks under a budget, and a value above the block count refused
before the run starts."""

from __future__ import annotations

import types
from dataclasses import replace

import pytest
import torch

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine import train
from lora_gui.memory.predict import predict
from lora_gui.models.diffusion import image_model_for_run
from lora_gui.models.errors import ModelError
from tests.engine.test_video_run import HIGH, LOW, clips_folder, video_cfg  # noqa: F401 (fixture)

EXACT = 1e-6  # the recompute is the same forward: the loss equal to every block checkpointed


def _run(cfg: RunConfig, out) -> dict:
    summary = train(cfg, out, progress=False)
    assert summary["status"] == "completed", summary.get("message")
    return summary


def _within_band(summary: dict) -> None:
    report = summary["memory_report"]
    assert report["predicted_source"] == "predicted"
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    train_error = summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1
    assert LOW <= train_error <= HIGH, (summary["prediction"], summary["train_peak_bytes"])


@pytest.fixture(scope="module")
def every_block(clips_folder, tmp_path_factory):  # noqa: F811
    return _run(video_cfg(clips_folder, gradient_checkpointing=True), tmp_path_factory.mktemp("all") / "run")


@pytest.fixture(scope="module")
def no_block(clips_folder, tmp_path_factory):  # noqa: F811
    return _run(video_cfg(clips_folder), tmp_path_factory.mktemp("none") / "run")


def _loss_and_grads(folder, layers: int, swap: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    cfg = video_cfg(folder, gradient_checkpointing=True, checkpoint_layers=layers, blocks_to_swap=swap)
    model = image_model_for_run(cfg, torch.float32)  # seeded: the same LoRA init each time
    unet = model.unet
    unet.train()
    gen = torch.Generator().manual_seed(0)
    latent = (2, 4, 3, 4, 6)  # 2 clips of 48x32 px x 9 frames: 3 latent frames of 4 x 6
    enc = types.SimpleNamespace(latents=torch.randn(latent, generator=gen), pooled=None, text_mask=None,
                                hidden=torch.randn(2, 8, model.info["text_width"], generator=gen))
    sigmas = torch.tensor([0.3, 0.8])
    loss = model.noise_scheduler.loss_at(unet, enc, torch.randn(latent, generator=gen), sigmas, sigmas * 1000)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in unet.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("swap", [0, 2])
def test_first_blocks_checkpointed_give_the_same_loss_and_lora_gradients(clips_folder, swap):  # noqa: F811
    # swap 2 with 1..3 checkpointed: the swapped blocks unchecked (packed as host references),
    # one checkpointed and one not, both checkpointed (their copies made again in the recompute)
    loss, grads = _loss_and_grads(clips_folder, 0, swap)
    for layers in (1, 2, 3):
        partial_loss, partial = _loss_and_grads(clips_folder, layers, swap)
        assert torch.equal(loss, partial_loss)
        assert grads.keys() == partial.keys() and len(grads) == 4 * 2 * 4 * 2
        for name, grad in grads.items():
            assert torch.equal(grad, partial[name]), (layers, name)


def test_only_the_first_blocks_recompute(clips_folder):  # noqa: F811
    unet = image_model_for_run(video_cfg(clips_folder, gradient_checkpointing=True, checkpoint_layers=1),
                               torch.float32).unet
    assert [block._checkpointed for block in unet.blocks] == [True, False, False, False]
    calls: list[int] = []
    for i, block in enumerate(unet.blocks):
        block.register_forward_pre_hook(lambda _m, _a, i=i: calls.append(i))
    x = torch.randn(1, 4, 3, 4, 6, requires_grad=True)
    hidden = torch.randn(1, 8, unet.config.text_dim)
    unet(x, torch.tensor([500]), hidden, return_dict=False)[0].sum().backward()
    assert calls == [0, 1, 2, 3, 0]  # the forward, then block 0 again in the backward


def test_partial_checkpointing_run_is_planned_within_band_between_all_and_none(
        clips_folder, tmp_path, every_block, no_block):  # noqa: F811
    cfg = video_cfg(clips_folder, gradient_checkpointing=True, checkpoint_layers=2)
    summary = _run(cfg, tmp_path / "run")
    _within_band(summary)
    planned = predict(cfg, None, "cpu")  # `plan` before the run: the same function, the same bytes
    assert planned.peak_bytes == summary["prediction"]["peak_bytes"]
    assert planned.train_peak_bytes == summary["prediction"]["train_peak_bytes"]
    assert abs(summary["final_loss"] - every_block["final_loss"]) <= EXACT
    peaks = every_block["train_peak_bytes"], summary["train_peak_bytes"], no_block["train_peak_bytes"]
    assert peaks[0] < peaks[1] < peaks[2], peaks


def test_partial_checkpointing_with_block_swap_is_planned_within_band(clips_folder, tmp_path,  # noqa: F811
                                                                       every_block):
    # 3 of 4 blocks checkpointed, the last 2 swapped: one swapped block recomputes, one does not
    cfg = video_cfg(clips_folder, gradient_checkpointing=True, checkpoint_layers=3, blocks_to_swap=2)
    summary = _run(cfg, tmp_path / "run")
    _within_band(summary)
    host, planned_host = summary["host_peak_bytes"], summary["prediction"]["host_bytes"]
    assert host > 0 and LOW <= planned_host / host - 1 <= HIGH, (host, planned_host)
    assert predict(cfg, None, "cpu").peak_bytes == summary["prediction"]["peak_bytes"]
    assert abs(summary["final_loss"] - every_block["final_loss"]) <= EXACT


@pytest.mark.parametrize("extra", [{"quantization": "fp8"}, {"video_window": "1,1,1"}],
                         ids=["fp8", "video_window"])
def test_partial_checkpointing_with_fp8_or_a_window_is_planned_within_band(clips_folder, tmp_path,  # noqa: F811
                                                                           extra):
    # fp8: the unchecked blocks keep their layers' upcast weights for the backward, traced as run
    cfg = video_cfg(clips_folder, gradient_checkpointing=True, checkpoint_layers=2, **extra)
    summary = _run(cfg, tmp_path / "run")
    _within_band(summary)
    full = _run(replace(cfg, checkpoint_layers=0), tmp_path / "full")
    assert abs(summary["final_loss"] - full["final_loss"]) <= EXACT
    assert summary["train_peak_bytes"] > full["train_peak_bytes"]


def test_fewest_blocks_keep_the_plan_under_the_budget(clips_folder):  # noqa: F811
    from lora_gui.memory.predict.run import checkpointable_layers, fewest_checkpointed_layers

    cfg = video_cfg(clips_folder, gradient_checkpointing=True)
    assert checkpointable_layers(cfg) == 4
    peaks = {k: predict(replace(cfg, checkpoint_layers=k), None, "cpu").peak_bytes for k in (1, 2, 3)}
    assert peaks[1] > peaks[2] >= peaks[3]
    budget = peaks[2]  # 2 blocks fit exactly, 1 does not
    now = predict(cfg, budget, "cpu")
    n, pred = fewest_checkpointed_layers(cfg, budget, "cpu", now=now)
    assert n == 2 and pred.peak_bytes == budget and pred.bucket_batches == now.bucket_batches
    # a run that checkpoints 2 already: no fewer fit
    assert fewest_checkpointed_layers(replace(cfg, checkpoint_layers=2), budget, "cpu") is None
    assert fewest_checkpointed_layers(replace(cfg, gradient_checkpointing=False), budget, "cpu") is None


def test_plan_prints_the_fewest_blocks_for_a_video_run(clips_folder, capsys):  # noqa: F811
    from lora_gui.cli import main

    cfg = video_cfg(clips_folder, gradient_checkpointing=True)
    budget = predict(replace(cfg, checkpoint_layers=2), None, "cpu").peak_bytes
    sets = {"task": "video", "model": "builtin:video", "data": clips_folder, "resolution": "48x32",
            "video_frames": 9, "text_max_length": 8, "batch_size": 2, "eval_fraction": 0.0,
            "gradient_checkpointing": True}
    args = ["plan", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")], "--device", "cpu",
            "--budget-gb", str((budget + 1000) / 1e9)]  # 1 kB above: no rounding at the edge
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Faster within the budget: checkpoint_layers=2 checkpoints only the first 2 transformer " \
           "blocks" in out, out


def test_a_value_above_the_block_count_is_refused_before_the_run_starts(clips_folder, tmp_path):  # noqa: F811
    cfg = video_cfg(clips_folder, gradient_checkpointing=True, checkpoint_layers=5)
    with pytest.raises(ModelError, match=r"checkpoint_layers: 5 is more than this model's 4 transformer "):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    with pytest.raises(ValueError, match=r"checkpoint_layers: 5 .* 4 transformer blocks"):
        predict(cfg, None, "cpu")


def test_settings_video_allows_it_image_refuses_naming_what_applies():
    apply_overrides(RunConfig(), {"task": "video", "gradient_checkpointing": True, "checkpoint_layers": 2})
    with pytest.raises(ConfigError, match="checkpoint_layers: needs gradient_checkpointing"):
        apply_overrides(RunConfig(), {"task": "video", "checkpoint_layers": 2})
    with pytest.raises(ConfigError, match="checkpoint_layers: applies to text runs .* and video runs"):
        apply_overrides(RunConfig(), {"task": "image", "gradient_checkpointing": True,
                                      "checkpoint_layers": 2})
