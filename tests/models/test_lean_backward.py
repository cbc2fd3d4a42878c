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


@pytest.fixture(autouse=True)
def _rebuild_every_size(monkeypatch):
    """These tiny models are narrower than where a run rebuilds (a recompute costs more than it
    saves there, tested apart): here every width is rebuilt, to check each one."""
    from lora_gui.models import stand_ins

    monkeypatch.setattr(stand_ins, "MIN_REBUILD_WIDTH", 0)


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


def _tiny_llama_lora(adapter: str = "lora") -> nn.Module:
    """A bf16 Llama with float32 LoRA on every linear layer, as peft keeps adapters (the copies
    lean_backward drops exist only when the adapter's dtype is not the input's)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=500, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights="gaussian",
                                             use_dora=adapter == "dora"))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return model


def _text_step(model: nn.Module) -> tuple[int, float, dict[str, torch.Tensor]]:
    ids = torch.randint(0, 500, (2, 64), generator=torch.Generator().manual_seed(3))
    tracker = StorageTracker()
    with tracker:
        out = model(input_ids=ids, labels=ids)
        kept = tracker.live_bytes
        out.loss.backward()
    return kept, out.loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_rms_norms_keep_their_16_bit_input_not_its_float32_copy():
    """transformers' RMSNorm casts its bf16 input to float32 and keeps the copy; the lean norm
    keeps the input and recomputes the copy: the same loss and gradients, bit for bit."""
    from lora_gui.models.lean_backward import _lean_rms_norms

    plain = _tiny_llama_lora()
    lean = copy.deepcopy(plain)
    assert _lean_rms_norms(lean) == 5 and _lean_rms_norms(lean) == 0  # once
    plain_kept, plain_loss, plain_grads = _text_step(plain)
    lean_kept, lean_loss, lean_grads = _text_step(lean)
    assert lean_loss == plain_loss and all(torch.equal(g, lean_grads[n]) for n, g in plain_grads.items())
    # 2 bytes a value less (the bf16 input kept, not its float32 copy) in 4 of the 5 norms (the
    # first reads the embeddings, which need no gradient: nothing is saved there), 2 x 64 tokens
    assert plain_kept - lean_kept == 4 * 2 * 64 * 64 * 2, (plain_kept, lean_kept)


@pytest.mark.parametrize("fused", [False, True])
def test_lora_keeps_its_16_bit_input_not_a_float32_copy_per_adapter(fused):
    """q, k, v (and gate, up) read one bf16 tensor; each adapter kept its own float32 copy of it."""
    from lora_gui.models.lora_fused import fuse_lora

    plain = _tiny_llama_lora()
    lean = copy.deepcopy(plain)
    if fused:  # the engine's fused forward (its fallback path here: bf16 input, float32 adapter)
        fuse_lora(plain), fuse_lora(lean)
    assert lean_frozen_layers(lean) == 14 + 5 + 2  # 2 layers x 7 adapted linears, 2 x 2 + 1 RMSNorms, 2 MLPs
    plain_kept, plain_loss, plain_grads = _text_step(plain)
    lean_kept, lean_loss, lean_grads = _text_step(lean)
    assert lean_loss == plain_loss and plain_grads.keys() == lean_grads.keys()
    for name, grad in plain_grads.items():
        assert torch.equal(grad, lean_grads[name]), name
    assert lean_kept < 0.8 * plain_kept, (lean_kept, plain_kept)  # measured 0.76


def test_lora_layers_after_a_norm_keep_its_input_and_recompute_its_output_once(monkeypatch):
    """float32: q, k, v (and gate, up) read an RMSNorm's output and kept it, although the norm
    keeps its input; they keep the input and the output is recomputed, once per norm."""
    from lora_gui.models import stand_ins

    recomputes, reads = [], []
    read = stand_ins.ReadOnce.__call__

    def counted(self, x):
        reads.append(1)
        recomputes.extend([1] if self.out is None else [])
        return read(self, x)

    monkeypatch.setattr(stand_ins.ReadOnce, "__call__", counted)
    plain = _tiny_llama_lora().float()
    lean = copy.deepcopy(plain)
    lean_frozen_layers(lean)
    plain_kept, plain_loss, plain_grads = _text_step(plain)
    lean_kept, lean_loss, lean_grads = _text_step(lean)
    assert lean_loss == plain_loss and all(torch.equal(g, lean_grads[n]) for n, g in plain_grads.items())
    tokens, hidden, inter = 2 * 64, 64, 160
    # the gated MLPs: act(gate) and the product (2 layers x 2 tensors of the intermediate width);
    # the norm outputs: 3 of the 4 (the first norm reads the embeddings, which keep no gradient)
    assert plain_kept - lean_kept == 2 * 2 * tokens * inter * 4 + 3 * tokens * hidden * 4
    assert len(recomputes) == 3 and len(reads) == 3 + 2 + 2  # q, k, v of the second layer; gate, up of both


def test_dora_keeps_peft_s_path():
    """DoRA (an adapter variant) runs peft's forward as is: the same loss and gradients, and the
    same bytes as with the lean RMSNorms and MLPs alone (the MLP recomputes act(gate) whatever
    its adapters; the product stays, kept by DoRA's own path)."""
    from lora_gui.models.lean_backward import _lean_rms_norms
    from lora_gui.models.lean_mlp import lean_gated_mlps

    dora = _tiny_llama_lora("dora")
    lean, outside = copy.deepcopy(dora), copy.deepcopy(dora)
    lean_frozen_layers(lean)
    assert _lean_rms_norms(outside) == 5 and lean_gated_mlps(outside) == 2
    (kept, loss, grads), (lean_kept, lean_loss, lean_grads) = _text_step(dora), _text_step(lean)
    assert lean_kept == _text_step(outside)[0] < kept and lean_loss == loss
    assert all(torch.equal(g, lean_grads[n]) for n, g in grads.items())


def test_text_plan_and_estimate_follow_the_setting():
    """The trace of a bf16 CUDA step keeps less with the setting on; the closed-form estimate
    moves with it and stays within the band it keeps against the trace (15%, as
    tests/memory/test_estimate.py); with checkpointing (the layers step aside inside
    checkpointed blocks) only the final norm, outside them, keeps less."""
    from lora_gui.memory.predict.estimate import estimate_text_step
    from lora_gui.memory.predict.trace import trace_text_step
    from tests.memory.conftest import tiny_llama

    for gc in (False, True):
        kw = {"batch_size": 2, "seq_len": 512, "dtype": "bfloat16", "device": "cuda",
              "gradient_checkpointing": gc}
        off, on = (trace_text_step(tiny_llama(), lean_backward=lean, **kw) for lean in (False, True))
        e_off, e_on = (estimate_text_step(tiny_llama(), lean_backward=lean, **kw) for lean in (False, True))
        if gc:
            final_norm = kw["batch_size"] * kw["seq_len"] * tiny_llama().hidden_size * 2
            assert off.traced_peak_bytes - on.traced_peak_bytes <= final_norm
            assert e_off.traced_peak_bytes - e_on.traced_peak_bytes == final_norm
        else:
            assert on.breakdown["activations"] < 0.85 * off.breakdown["activations"]
            assert e_on.peak_bytes < e_off.peak_bytes
        assert abs(e_on.traced_peak_bytes / on.traced_peak_bytes - 1) < 0.15


def _step_peak(model: nn.Module, autocast: bool) -> tuple[int, dict[str, torch.Tensor]]:
    ids = torch.randint(0, 500, (2, 64), generator=torch.Generator().manual_seed(3))
    model.zero_grad(set_to_none=True)
    tracker = StorageTracker()
    with tracker:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return tracker.peak_bytes, {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_under_autocast_lora_reads_its_input_and_the_plan_stays_above():
    """A GPU run trains under autocast, which casts peft's float32 copy straight back to bf16 and
    keeps that per adapter; the lean layers skip peft's cast (the same gradients, bit for bit).
    The step without autocast (how a plan for a CPU traces a float32 run; plans for CUDA trace
    under CUDA's own casts, tests/models/test_cuda_autocast.py) stays above the CPU autocast
    step's peak, with the engine's fused forward (the default) or without."""
    from lora_gui.models.lora_fused import fuse_lora

    base = _tiny_llama_lora()
    peft_plain, peft_lean, fused_lean = (copy.deepcopy(base) for _ in range(3))
    lean_frozen_layers(peft_lean)
    fuse_lora(fused_lean)
    lean_frozen_layers(fused_lean)
    plain_peak, plain_grads = _step_peak(peft_plain, autocast=True)
    lean_peak, lean_grads = _step_peak(peft_lean, autocast=True)
    fused_peak, _ = _step_peak(fused_lean, autocast=True)
    planned, _ = _step_peak(copy.deepcopy(peft_lean), autocast=False)  # what the trace runs
    assert all(torch.equal(g, lean_grads[n]) for n, g in plain_grads.items())
    assert lean_peak < plain_peak  # measured 1,795,592 against 1,926,664 bytes
    assert planned >= max(lean_peak, fused_peak), (planned, lean_peak, fused_peak)


def test_unet_under_autocast_same_gradients_less_memory_plan_above():
    """A GPU image run: bf16 UNet, float32 LoRA, under autocast (which runs some norms in float32:
    their recompute runs under the same autocast). The same gradients bit for bit; a lower
    peak; and the step without autocast (a CPU plan's) stays above the CPU autocast step's peak."""
    plain = build_sdxl_pipeline(seed=0).unet.to(torch.bfloat16)
    plain.requires_grad_(False)
    plain.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                 init_lora_weights="gaussian"))
    for p in plain.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    lean = copy.deepcopy(plain)
    lean_frozen_layers(lean)
    torch.manual_seed(1)
    bf16 = {"dtype": torch.bfloat16}
    inputs = (torch.randn(4, 4, 8, 8, **bf16), torch.rand(4) * 1000)
    kwargs = {"encoder_hidden_states": torch.randn(4, 77, 64, **bf16),
              "added_cond_kwargs": {"text_embeds": torch.randn(4, 32, **bf16),
                                    "time_ids": torch.randn(4, 6, **bf16)}}

    def peak(unet: nn.Module, autocast: bool) -> tuple[int, dict[str, torch.Tensor]]:
        unet.zero_grad(set_to_none=True)
        tracker = StorageTracker()
        with tracker:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = unet(*inputs, **kwargs).sample
            out.float().square().sum().backward()
        return tracker.peak_bytes, {n: p.grad.clone() for n, p in unet.named_parameters() if p.requires_grad}

    plain_peak, plain_grads = peak(plain, True)
    lean_peak, lean_grads = peak(lean, True)
    planned, _ = peak(lean, False)
    assert all(torch.equal(g, lean_grads[n]) for n, g in plain_grads.items())
    assert lean_peak < 0.8 * plain_peak, (lean_peak, plain_peak)  # measured 2,319,296 / 3,314,624
    assert planned >= lean_peak, (planned, lean_peak)  # 2,384,064


def _no_rebuilds(monkeypatch) -> None:
    """Every lean layer but the rebuilds of what LoRA layers read (what the lean layers did before
    them): norm and feed-forward activation outputs, a DiT's float32 attention output."""
    from lora_gui.models import stand_ins

    monkeypatch.setattr(stand_ins, "rebuilt_from", lambda *args: None)


def test_unet_lora_after_a_layer_norm_keeps_its_input(monkeypatch):
    """A UNet transformer block's q, k and v read norm1's output, the cross-attention's q
    norm2's; they keep the norm's input (kept by the norm anyway) and the output is rebuilt."""
    from lora_gui.models.lean_backward import LeanLayerNorm

    plain = _unet(["to_q", "to_k", "to_v", "to_out.0"])
    lean, before = copy.deepcopy(plain), copy.deepcopy(plain)
    lean_frozen_layers(lean)
    lean_kept, lean_grads = _step(lean)
    with monkeypatch.context() as m:
        _no_rebuilds(m)
        lean_frozen_layers(before)
        before_kept, before_grads = _step(before)
    plain_grads = _step(plain)[1]
    for name, grad in plain_grads.items():
        assert torch.equal(grad, lean_grads[name]) and torch.equal(grad, before_grads[name]), name
    # which norms' outputs a LoRA layer reads, with an input that keeps a gradient: a block's
    # norm1 (unless its input comes from frozen layers alone: the first block) and norm2
    read, seen = [], set()

    def note(module, args, out):
        if args[0].requires_grad and module.name.endswith(("norm1", "norm2")):
            read.append(out.numel() * out.element_size())
            seen.add(module.name)

    for name, module in before.named_modules():
        if isinstance(module, LeanLayerNorm):
            module.name = name
            module.register_forward_hook(note)
    _step(before)
    assert len(seen) >= 3 and before_kept - lean_kept == sum(read), (before_kept, lean_kept, read)


def _dit_step(transformer: nn.Module, kind: str) -> tuple[int, dict[str, torch.Tensor]]:
    """Bytes kept between the forward and the backward and the LoRA gradients of one fp32 step
    of a tiny DiT (batch 2, 8 x 8 latents, 6 text tokens)."""
    gen = torch.Generator().manual_seed(2)
    cfg = transformer.config
    text = torch.randn(2, 6, cfg.joint_attention_dim, generator=gen)
    pooled = torch.randn(2, cfg.pooled_projection_dim, generator=gen)
    if kind == "sd3":
        kwargs = {"hidden_states": torch.randn(2, cfg.in_channels, 8, 8, generator=gen)}
    else:
        ids = torch.stack(torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij"), -1).reshape(64, 2)
        kwargs = {"hidden_states": torch.randn(2, 64, cfg.in_channels, generator=gen),
                  "img_ids": torch.cat([torch.zeros(64, 1), ids.float()], 1), "txt_ids": torch.zeros(6, 3),
                  "guidance": torch.full((2,), 3.5)}
    transformer.zero_grad(set_to_none=True)
    tracker = StorageTracker()
    with tracker:
        out = transformer(encoder_hidden_states=text, pooled_projections=pooled,
                          timestep=torch.tensor([100.0, 700.0]), **kwargs).sample
        kept = tracker.live_bytes
        out.square().mean().backward()
    return kept, {n: p.grad for n, p in transformer.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_dit_lora_after_an_adaptive_norm_keeps_its_input(kind, monkeypatch):
    """A DiT block's q, k and v read ``norm(x) * (1 + scale) + shift`` from its adaptive norm;
    they keep x (the norm keeps it) and the output is rebuilt: the same gradients, bit for bit,
    and exactly those outputs' bytes less."""
    from lora_gui.models import dit
    from lora_gui.models.build_dit import build_flux_pipeline, build_sd3_pipeline

    pipe = build_sd3_pipeline(seed=0) if kind == "sd3" else build_flux_pipeline(seed=0)
    plain = pipe.transformer
    plain.requires_grad_(False)
    plain.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=dit.lora_targets(kind, "all-linear"),
                                 init_lora_weights="gaussian"))
    lean, before = copy.deepcopy(plain), copy.deepcopy(plain)
    lean_frozen_layers(lean)
    with monkeypatch.context() as m:
        _no_rebuilds(m)
        lean_frozen_layers(before)
        before_kept, before_grads = _dit_step(before, kind)
    lean_kept, lean_grads = _dit_step(lean, kind)
    plain_grads = _dit_step(plain, kind)[1]
    assert plain_grads and plain_grads.keys() == lean_grads.keys()
    for name, grad in plain_grads.items():
        assert torch.equal(grad, lean_grads[name]) and torch.equal(grad, before_grads[name]), name
    width, text = plain.config.num_attention_heads * plain.config.attention_head_dim, 6
    # SD3, 2 blocks: the first reads the frozen embedders' outputs (no gradient: nothing to
    # rebuild from); the last block's norm1 (16 image tokens: 8 x 8 latents in 2 x 2 patches) and
    # norm1_context. Flux, 1 double block (frozen inputs) and 1 single block, whose norm q, k and v
    # read (64 image tokens: Flux's latents come packed, one token each, then the text)
    image = 16 if kind == "sd3" else 64
    rebuilt = 2 * (image + text) * width * 4
    if kind == "flux":  # and its feed-forwards' activations, read by ff.net.2 / ff_context.net.2
        rebuilt += 2 * (image + text) * 4 * width * 4  # 4 x width wide
        # and the contiguous copies of the attention output's parts to_out / to_add_out read
        rebuilt += 2 * (image + text) * width * 4
    # the rebuild holds the timestep's conditioning (batch x width, once for every norm), which
    # nothing else keeps: the embedders are frozen
    conditioning = 2 * width * 4
    assert before_kept - lean_kept == rebuilt - conditioning, (before_kept, lean_kept, rebuilt)


def test_dit_under_cuda_autocast_keeps_no_copy_of_the_adaptive_norm_output(monkeypatch):
    """A GPU run (bf16 DiT, float32 LoRA, CUDA's autocast, emulated here): the adaptive norm's
    output is float32 and q, k and v kept one bf16 copy of it (and ff.net.2 its bf16 input, to_out
    a bf16 copy of the attention output); now none (rebuilt in the backward
    under the same autocast): the same gradients, bit for bit."""
    from lora_gui.models import dit
    from lora_gui.models.build_dit import build_flux_pipeline
    from lora_gui.models.cuda_autocast import forward_under

    plain = build_flux_pipeline(seed=0).transformer.to(torch.bfloat16)
    plain.requires_grad_(False)
    plain.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=dit.lora_targets("flux", "all-linear"),
                                 init_lora_weights="gaussian"))
    for p in plain.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # peft's float32 adapters over 16-bit weights
    lean, before = copy.deepcopy(plain), copy.deepcopy(plain)
    lean_frozen_layers(lean)
    with monkeypatch.context() as m:
        _no_rebuilds(m)
        lean_frozen_layers(before)

    def step(model: nn.Module) -> tuple[int, dict[str, torch.Tensor]]:
        with forward_under(model, torch.bfloat16), monkeypatch.context() as m:
            if model is before:
                _no_rebuilds(m)
            return _dit_step(model, "flux")

    (plain_kept, plain_grads), (before_kept, before_grads), (lean_kept, lean_grads) = map(
        step, (plain, before, lean))
    for name, grad in plain_grads.items():
        assert torch.equal(grad, lean_grads[name]) and torch.equal(grad, before_grads[name]), name
    width = plain.config.num_attention_heads * plain.config.attention_head_dim
    # the single block's norm output, 64 + 6 tokens, as one bf16 copy, the double block's
    # feed-forward activations (64 image, 6 text tokens, 4 x width wide, bf16) and to_out /
    # to_add_out's bf16 copies of its attention output; less the conditioning (bf16 under
    # autocast) the rebuild holds
    rebuilt = 2 * (64 + 6) * width * 2 + 2 * (64 + 6) * 4 * width * 2 + 2 * (64 + 6) * width * 2
    assert before_kept - lean_kept == rebuilt - 2 * width * 2, (before_kept, lean_kept)
    assert lean_kept < before_kept < plain_kept


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "cuda-autocast"])
@pytest.mark.parametrize("activation", ["gelu-approximate", "geglu"])
def test_lora_on_a_feed_forwards_output_layer_keeps_the_projection_not_the_activation(
        activation, autocast, monkeypatch):
    """A LoRA on a feed-forward's output layer (Flux's ``ff.net.2``) kept what it reads,
    ``gelu(proj)`` (``h * gelu(g)`` for GEGLU), beside the projection the activation's backward
    keeps anyway; now it keeps the projection and the activation is rebuilt from it: the same
    gradients, bit for bit, and exactly the activation's bytes less."""
    from diffusers.models.attention import FeedForward
    from peft import inject_adapter_in_model

    from lora_gui.models.cuda_autocast import forward_under

    torch.manual_seed(0)
    dtype = torch.bfloat16 if autocast else torch.float32  # a GPU run: 16-bit weights, fp32 adapters
    plain = FeedForward(32, mult=4, activation_fn=activation).to(dtype).requires_grad_(False)
    plain = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=["net.0.proj", "net.2"],
                                               init_lora_weights="gaussian"), plain)
    for p in plain.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    lean, before = copy.deepcopy(plain), copy.deepcopy(plain)
    lean_frozen_layers(lean)
    lean_frozen_layers(before)

    def step(model: nn.Module) -> tuple[int, dict[str, torch.Tensor]]:
        x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(3)).to(dtype).requires_grad_()
        tracker = StorageTracker()
        with monkeypatch.context() as m, forward_under(model, torch.bfloat16 if autocast else None):
            if model is before:
                _no_rebuilds(m)
            with tracker:
                out = model(x)
                kept = tracker.live_bytes
                out.float().square().sum().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        return kept, {**grads, "input": x.grad}

    (plain_kept, plain_grads), (before_kept, before_grads), (lean_kept, lean_grads) = map(
        step, (plain, before, lean))
    assert {type(m).__name__ for m in lean.modules()} & {"LeanGELU", "LeanGEGLU"}
    for name, grad in plain_grads.items():
        assert torch.equal(grad, lean_grads[name]) and torch.equal(grad, before_grads[name]), name
    activation_bytes = 2 * 24 * 128 * (2 if autocast else 4)  # batch x tokens x inner width
    assert before_kept - lean_kept == activation_bytes, (before_kept, lean_kept)
    assert lean_kept < before_kept <= plain_kept
