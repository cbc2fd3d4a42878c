"""Block swap on the built-in tiny Wan pipeline (2 blocks): the same loss and LoRA gradients as
without it, the run's prediction and `plan` within the band of the tracked device peak, the host
figure equal to the planned one, a lower device peak, and a bad value refused before the run."""

from __future__ import annotations

import types

import pytest
import torch

from lora_gui.engine import train
from lora_gui.memory.predict import predict
from lora_gui.memory.runtime.tracker import is_host_tensor
from lora_gui.models.diffusion import image_model_for_run
from lora_gui.models.errors import ModelError
from tests.engine.test_video_run import HIGH, LOW, clips_folder, video_cfg  # noqa: F401 (fixture)


def _loss_and_grads(folder, swap: int, checkpointing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    cfg = video_cfg(folder, blocks_to_swap=swap, gradient_checkpointing=checkpointing)
    model = image_model_for_run(cfg, torch.float32)  # seeded: the same LoRA init each time
    unet = model.unet
    unet.train()
    gen = torch.Generator().manual_seed(0)
    latent = (2, 4, 3, 4, 6)  # 2 clips (4 latent channels) of 48x32 px x 9 frames: 3 latent frames of 4 x 6
    enc = types.SimpleNamespace(latents=torch.randn(latent, generator=gen), pooled=None, text_mask=None,
                                hidden=torch.randn(2, 8, model.info["text_width"], generator=gen))
    sigmas = torch.tensor([0.3, 0.8])
    loss = model.noise_scheduler.loss_at(unet, enc, torch.randn(latent, generator=gen), sigmas, sigmas * 1000)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in unet.named_parameters() if p.requires_grad}
    if swap:
        blocks = list(unet.blocks)
        assert all(is_host_tensor(p) for p in blocks[-1].parameters() if not p.requires_grad)
        assert all(is_host_tensor(p) for p in blocks[-swap].parameters() if not p.requires_grad)
        assert not any(is_host_tensor(p) for p in blocks[-swap - 1].parameters())  # only the last N
    return loss.detach(), grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_swap_gives_the_same_loss_and_lora_gradients(clips_folder, checkpointing):  # noqa: F811
    loss, grads = _loss_and_grads(clips_folder, 0, checkpointing)
    for swap in (1, 2):
        swapped_loss, swapped = _loss_and_grads(clips_folder, swap, checkpointing)
        assert torch.equal(loss, swapped_loss)
        assert grads.keys() == swapped.keys() and len(grads) == 4 * 2 * 4 * 2
        for name, grad in grads.items():
            assert torch.equal(grad, swapped[name]), name


@pytest.mark.parametrize("checkpointing", [False, True])
def test_swap_run_is_planned_within_band_and_lowers_the_device_peak(clips_folder, tmp_path,  # noqa: F811
                                                                    checkpointing):
    cfg = video_cfg(clips_folder, blocks_to_swap=2, gradient_checkpointing=checkpointing)
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    report = summary["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    train_error = summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1
    assert LOW <= train_error <= HIGH, (summary["prediction"], summary["train_peak_bytes"])
    host, planned_host = summary["host_peak_bytes"], summary["prediction"]["host_bytes"]
    assert host > 0 and LOW <= planned_host / host - 1 <= HIGH, (host, planned_host)
    planned = predict(cfg, None, "cpu")  # `plan` before the run: the same bytes
    assert planned.peak_bytes == summary["prediction"]["peak_bytes"]
    assert planned.step.info["host_bytes"] == planned_host
    # without swap the same run's device peak (its plan is within the band of its measured peak:
    # tests/engine/test_video_run.py) is higher by about the swapped blocks' weights
    plain = predict(video_cfg(clips_folder, gradient_checkpointing=checkpointing), None, "cpu")
    assert summary["train_peak_bytes"] * (1 + HIGH) < plain.train_peak_bytes
    assert plain.step.info["host_bytes"] == 0


def test_measured_device_peak_without_swap_is_higher(clips_folder, tmp_path):  # noqa: F811
    # one swapped block's copy is on the device while it runs: 2 of 2 blocks swapped save about one
    swapped = train(video_cfg(clips_folder, blocks_to_swap=2, max_steps=2), tmp_path / "swap", progress=False)
    plain = train(video_cfg(clips_folder, max_steps=2), tmp_path / "plain", progress=False)
    assert swapped["final_loss"] == plain["final_loss"]
    assert swapped["train_peak_bytes"] < plain["train_peak_bytes"]
    assert plain["host_peak_bytes"] == 0 < swapped["host_peak_bytes"]


def test_a_bad_blocks_to_swap_is_refused_before_the_run_starts(clips_folder, tmp_path):  # noqa: F811
    with pytest.raises(ModelError, match=r"blocks_to_swap: 5 .* 4 transformer blocks"):
        train(video_cfg(clips_folder, blocks_to_swap=5), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    with pytest.raises(ValueError, match=r"blocks_to_swap: 5 .* 4 transformer blocks"):
        predict(video_cfg(clips_folder, blocks_to_swap=5), None, "cpu")


def test_swap_of_fp8_weights_is_planned_within_band(clips_folder, tmp_path):  # noqa: F811
    # fp8 storage first, then the swap: the host holds the fp8 bytes, each block's copy is upcast
    # layer by layer while it runs (both switches the run's own code, traced together)
    cfg = video_cfg(clips_folder, blocks_to_swap=2, gradient_checkpointing=True, quantization="fp8")
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed", summary.get("message")
    report = summary["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    train_error = summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1
    assert LOW <= train_error <= HIGH, (summary["prediction"], summary["train_peak_bytes"])
    host, planned_host = summary["host_peak_bytes"], summary["prediction"]["host_bytes"]
    assert host > 0 and LOW <= planned_host / host - 1 <= HIGH, (host, planned_host)
    bf16_host = predict(video_cfg(clips_folder, blocks_to_swap=2, gradient_checkpointing=True), None,
                        "cpu").step.info["host_bytes"]
    assert planned_host < bf16_host  # one byte a swapped weight, not the run's float
