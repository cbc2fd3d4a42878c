"""Frozen layers that keep only what their backward reads: the same gradients, bit for bit, and
fewer bytes alive between the forward and the backward; a trainable layer keeps torch's path."""

import copy

import pytest
import torch
from peft import LoraConfig
from torch import nn

from lora_gui.engine.image.train import train_image
from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models.build_diffusion import build_sdxl_pipeline
from lora_gui.models.lean_backward import LeanConv2d, lean_frozen_layers
from lora_gui.presets import load_config


def _unet(targets: list[str]) -> nn.Module:
    unet = build_sdxl_pipeline(seed=0).unet
    unet.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    return unet


def _step(unet: nn.Module) -> tuple[int, dict[str, torch.Tensor]]:
    """Bytes alive between the forward and the backward (what the graph keeps, the output too),
    counted by the CPU storage tracker, and the adapter's gradients."""
    torch.manual_seed(1)
    inputs = (torch.randn(2, 4, 8, 8), torch.tensor([10.0, 700.0]))
    kwargs = {"encoder_hidden_states": torch.randn(2, 77, 64),
              "added_cond_kwargs": {"text_embeds": torch.randn(2, 32), "time_ids": torch.randn(2, 6)}}
    tracker = StorageTracker()
    with tracker:
        out = unet(*inputs, **kwargs).sample
        kept = tracker.live_bytes
        out.square().sum().backward()
    return kept, {n: p.grad for n, p in unet.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(("targets", "most"), [
    (["to_q", "to_k", "to_v", "to_out.0"], 0.9),  # diffusers' default: measured 0.84
    (["to_q", "conv1", "ff.net.0.proj"], 0.92)])  # a trainable conv and GEGLU projection: 0.86
def test_same_gradients_bit_for_bit_and_fewer_bytes_kept(targets, most):
    plain = _unet(targets)
    lean = copy.deepcopy(plain)
    swapped = lean_frozen_layers(lean)
    kinds = {type(m).__name__ for m in lean.modules()}
    assert swapped > 0 and {"LeanConv2d", "LeanGroupNorm", "LeanSiLU", "LeanGEGLU"} <= kinds
    assert list(lean.state_dict()) == list(plain.state_dict())  # what a checkpoint holds is unchanged
    plain_kept, plain_grads = _step(plain)
    lean_kept, lean_grads = _step(lean)
    assert plain_grads.keys() == lean_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        assert torch.equal(grad, lean_grads[name]), name
    # the frozen convolutions' inputs (SiLU outputs, the upsampler's input), the norms' outputs
    # the SiLUs read, and gelu(gate)
    assert lean_kept < most * plain_kept, (lean_kept, plain_kept)


def test_trainable_convolution_keeps_torchs_path():
    conv = nn.Conv2d(3, 4, 3, padding=1)
    lean = copy.deepcopy(conv)
    lean_frozen_layers(lean)
    assert type(lean) is LeanConv2d
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    conv(x).sum().backward()
    expected = (x.grad.clone(), conv.weight.grad.clone(), conv.bias.grad.clone())
    x.grad = None
    lean(x).sum().backward()
    assert torch.equal(x.grad, expected[0]) and torch.equal(lean.weight.grad, expected[1])
    assert torch.equal(lean.bias.grad, expected[2])


def test_sdxl_run_holds_less_and_its_plan_follows(tmp_path):
    """A CPU run of the tiny SDXL (optimized mode: lean layers on by default) against the same run
    with them off: the measured step peak drops and each run's plan stays within its band."""
    from lora_gui.data.build_images import build

    pipe = tmp_path / "sdxl"
    build_sdxl_pipeline().save_pretrained(pipe)
    data = tmp_path / "pics"
    build(data, count=4)
    peaks = {}
    for lean in ("on", "off"):
        cfg = load_config("image-512", {"model": str(pipe), "data": str(data), "max_steps": 1,
                                        "batch_size": 4, "eval_fraction": 0.0, "monitor_hz": 0,
                                        "sample_images": 0, "precision": "fp32", "resolution": 64,
                                        "lora_rank": 4, "lean_backward": lean})
        summary = train_image(cfg, tmp_path / f"run-{lean}", progress=False)
        report = summary["memory_report"]
        assert summary["switches"]["lean_backward"] is (lean == "on")
        assert report["source"] == "tracker" and -0.01 <= report["predicted_vs_measured"] <= 0.03, report
        peaks[lean] = summary["train_peak_bytes"]
    assert peaks["on"] < 0.95 * peaks["off"], peaks


def test_checkpointed_blocks_keep_no_more():
    """Inside a checkpointed block the checkpoint decides what is kept: the lean layers step
    aside there, so nothing they would hold (a norm's input, a projection) outlives the block."""
    plain = _unet(["to_q", "to_k", "to_v", "to_out.0"])
    plain.enable_gradient_checkpointing()
    lean = copy.deepcopy(plain)
    lean_frozen_layers(lean)
    plain_kept, plain_grads = _step(plain)
    lean_kept, lean_grads = _step(lean)
    assert all(torch.equal(g, lean_grads[n]) for n, g in plain_grads.items())
    # the layers outside the blocks (the last norm, SiLU and convolution) still keep less
    assert lean_kept < plain_kept, (lean_kept, plain_kept)
