"""Frozen layers that keep only what their backward reads: the same gradients, bit for bit, and
fewer bytes alive between the forward and the backward; a trainable layer keeps torch's path."""

import copy

import pytest
import torch
from peft import LoraConfig
from torch import nn

from lora_gui.engine.image.train import train_image
from lora_gui.models.build_diffusion import build_sdxl_pipeline
from lora_gui.models.lean_backward import LeanConv2d, lean_frozen_layers
from lora_gui.presets import load_config


def _saved_bytes(out: torch.Tensor, module: nn.Module) -> int:
    """Bytes of the distinct storages autograd keeps for the backward, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen_nodes, seen, total, stack = set(), set(), 0, [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen_nodes:
            continue
        seen_nodes.add(node)
        kept = [getattr(node, a) for a in dir(node) if a.startswith("_saved_")]
        if hasattr(node, "saved_tensors"):  # a custom autograd Function's
            kept.append(node.saved_tensors)
        for value in kept:
            for t in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(t, torch.Tensor):
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in params and ptr not in seen:
                        seen.add(ptr)
                        total += t.untyped_storage().nbytes()
        stack += [f for f, _ in node.next_functions]
    return total


def _unet(targets: list[str]) -> nn.Module:
    unet = build_sdxl_pipeline(seed=0).unet
    unet.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"))
    return unet


def _step(unet: nn.Module) -> tuple[int, dict[str, torch.Tensor]]:
    torch.manual_seed(1)
    out = unet(torch.randn(2, 4, 8, 8), torch.tensor([10.0, 700.0]),
               encoder_hidden_states=torch.randn(2, 77, 64),
               added_cond_kwargs={"text_embeds": torch.randn(2, 32), "time_ids": torch.randn(2, 6)}).sample
    saved = _saved_bytes(out, unet)
    out.square().sum().backward()
    return saved, {n: p.grad for n, p in unet.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(("targets", "most"), [
    (["to_q", "to_k", "to_v", "to_out.0"], 0.85),  # diffusers' default: measured 0.80
    (["to_q", "conv1", "ff.net.0.proj"], 0.9)])  # a trainable conv and GEGLU projection: 0.85
def test_same_gradients_bit_for_bit_and_fewer_saved_bytes(targets, most):
    plain = _unet(targets)
    lean = copy.deepcopy(plain)
    swapped = lean_frozen_layers(lean)
    kinds = {type(m).__name__ for m in lean.modules()}
    assert swapped > 0 and {"LeanConv2d", "LeanGEGLU"} <= kinds
    assert list(lean.state_dict()) == list(plain.state_dict())  # what a checkpoint holds is unchanged
    plain_saved, plain_grads = _step(plain)
    lean_saved, lean_grads = _step(lean)
    assert plain_grads.keys() == lean_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        assert torch.equal(grad, lean_grads[name]), name
    # the frozen convolutions' inputs (SiLU outputs, the upsampler's input) and gelu(gate)
    assert lean_saved < most * plain_saved, (lean_saved, plain_saved)


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
