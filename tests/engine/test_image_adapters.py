"""Image adapter variants (DoRA, LoHa, LoKr) on the bundled SD 1.x UNet and on SD3 / Flux-shaped
pipelines built in code: each run's predicted peak within -1%...+3% of its measured one, the saved
adapter loaded back into the pipeline, and the kohya / LyCORIS file checked against the layout
those tools document (key names, shapes, alpha) by rebuilding each layer's weight from that file
with the documented formulas and comparing the UNet's output with the adapter that trained."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.data.build_images import build as build_pictures
from lora_gui.engine.image.train import train_image
from lora_gui.models import image_adapter
from lora_gui.models.diffusion import resolve_pipeline_source
from lora_gui.models.diffusion_files import load_pipeline
from lora_gui.presets import load_config

BUILTIN = resolve_pipeline_source("builtin")
LOW, HIGH = 0.0, 0.03  # predicted / measured - 1
BASE = {"max_steps": 2, "batch_size": 2, "monitor_hz": 0, "eval_fraction": 0.2, "sample_images": 0,
        "precision": "fp32", "resolution": 256, "lr": 1e-2}
# LoKr at rank 2 keeps its large factor low-rank (lokr_w2_a / _b); at rank 4 both factors of the
# 32-wide layers are full matrices: the two LyCORIS forms
UNET_RUNS = {"loha": {"adapter": "loha", "lora_rank": 4}, "lokr": {"adapter": "lokr", "lora_rank": 4},
             "lokr-r2": {"adapter": "lokr", "lora_rank": 2}, "dora": {"adapter": "dora", "lora_rank": 4}}


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    out = tmp_path_factory.mktemp("pictures")
    build_pictures(out, count=5)
    return out


@pytest.fixture(scope="module")
def unet_runs(pictures, tmp_path_factory):
    done = {}
    for name, extra in UNET_RUNS.items():
        out = tmp_path_factory.mktemp("runs") / name
        cfg = load_config("image-512", {**BASE, "data": str(pictures), "export_kohya": True, **extra})
        done[name] = (out, train_image(cfg, out, progress=False))
    return done


def _check_prediction(summary):
    report = summary["memory_report"]
    assert report["source"] == "tracker" and report["predicted_device"] == "cpu"
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    train = summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1  # the steps alone
    assert LOW <= train <= HIGH, (train, summary["prediction"], summary["train_peak_bytes"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(UNET_RUNS))
def test_unet_variant_is_predicted_within_the_bound(unet_runs, name):
    out, summary = unet_runs[name]
    assert summary["status"] == "completed" and summary["steps"] == 2
    _check_prediction(summary)
    info = json.loads((out / "adapter" / "adapter_info.json").read_text())
    assert info["adapter"] == UNET_RUNS[name]["adapter"]
    main = "peft" if info["adapter"] in ("loha", "lokr") else "pytorch_lora_weights.safetensors"
    assert set(info["files"]) == {main, "kohya_lora.safetensors"}
    assert all("ComfyUI" in who for f, who in info["files"].items() if f.startswith("kohya"))


@pytest.mark.slow
def test_kohya_keys_follow_the_lycoris_layout(unet_runs):
    """Key names and shapes as LyCORIS writes them (lycoris/modules/loha.py, lokr.py, locon.py)
    and ComfyUI reads them (comfy/weight_adapter/*.py): module name ``lora_unet_`` + the diffusers
    path with underscores; LoHa (out, r) / (r, in) factors; LoKr kron factors; DoRA (out, 1)."""
    q = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
    loha = load_file(unet_runs["loha"][0] / "adapter" / "kohya_lora.safetensors")
    assert {k for k in loha if k.startswith(q + ".")} == {
        f"{q}.{p}" for p in ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "alpha")}
    assert loha[f"{q}.hada_w1_a"].shape == (32, 4) and loha[f"{q}.hada_w1_b"].shape == (4, 32)
    assert float(loha[f"{q}.alpha"]) == 16.0
    full = load_file(unet_runs["lokr"][0] / "adapter" / "kohya_lora.safetensors")
    assert {k for k in full if k.startswith(q + ".")} == {f"{q}.lokr_w1", f"{q}.lokr_w2"}  # no alpha: scale 1
    assert full[f"{q}.lokr_w1"].shape == (4, 4) and full[f"{q}.lokr_w2"].shape == (8, 8)
    low = load_file(unet_runs["lokr-r2"][0] / "adapter" / "kohya_lora.safetensors")
    assert {k for k in low if k.startswith(q + ".")} == {
        f"{q}.lokr_w1", f"{q}.lokr_w2_a", f"{q}.lokr_w2_b", f"{q}.alpha"}
    assert low[f"{q}.lokr_w2_a"].shape == (8, 2) and low[f"{q}.lokr_w2_b"].shape == (2, 8)
    dora = load_file(unet_runs["dora"][0] / "adapter" / "kohya_lora.safetensors")
    assert {k for k in dora if k.startswith(q + ".")} == {
        f"{q}.lora_down.weight", f"{q}.lora_up.weight", f"{q}.alpha", f"{q}.dora_scale"}
    assert dora[f"{q}.lora_down.weight"].shape == (4, 32) and dora[f"{q}.dora_scale"].shape == (32, 1)
    with safe_open(unet_runs["loha"][0] / "adapter" / "kohya_lora.safetensors", "pt") as f:
        assert json.loads(f.metadata()["ss_network_args"])["algo"] == "loha"
    assert all(k.startswith("lora_unet_") for k in (*loha, *full, *low, *dora))


def _kohya_delta(tensors: dict[str, torch.Tensor], weight: torch.Tensor) -> torch.Tensor:
    """A layer's new weight from its kohya / LyCORIS tensors, with the formulas the loaders use
    (ComfyUI's LoHa / LoKr: scale alpha / r, or 1 for a LoKr of full factors; DoRA as peft
    defines it: magnitude per output row over the norm of W + delta)."""
    alpha = tensors.get("alpha")
    if "hada_w1_a" in tensors:
        r = tensors["hada_w1_b"].shape[0]
        delta = (tensors["hada_w1_a"] @ tensors["hada_w1_b"]) * (tensors["hada_w2_a"] @ tensors["hada_w2_b"])
        return weight + delta * float(alpha) / r
    if "lokr_w1" in tensors:
        w2, scale = tensors.get("lokr_w2"), 1.0
        if w2 is None:
            w2 = tensors["lokr_w2_a"] @ tensors["lokr_w2_b"]
            scale = float(alpha) / tensors["lokr_w2_b"].shape[0]
        return weight + torch.kron(tensors["lokr_w1"], w2) * scale
    r = tensors["lora_down.weight"].shape[0]
    merged = weight + tensors["lora_up.weight"] @ tensors["lora_down.weight"] * float(alpha) / r
    if "dora_scale" in tensors:
        merged = merged * tensors["dora_scale"] / merged.norm(dim=1, keepdim=True)
    return merged


def _unet_inputs(unet):
    g = torch.Generator().manual_seed(0)
    c = unet.config
    return {"sample": torch.randn(1, c.in_channels, 32, 32, generator=g), "timestep": torch.tensor([500]),
            "encoder_hidden_states": torch.randn(1, 77, c.cross_attention_dim, generator=g)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(UNET_RUNS))
def test_saved_adapter_loads_back_and_the_kohya_file_rebuilds_it(unet_runs, name):
    """The pipeline with the saved adapter (diffusers' loader for DoRA, peft for LoHa / LoKr)
    predicts the same noise as the base UNet whose layers are rebuilt from the kohya file."""
    out, _ = unet_runs[name]
    tuned = load_pipeline(BUILTIN, out / "adapter").unet
    base = load_pipeline(BUILTIN).unet
    kohya = load_file(out / "adapter" / "kohya_lora.safetensors")
    modules = {}
    for key, value in kohya.items():
        module, part = key.split(".", 1)
        modules.setdefault(module, {})[part] = value
    layers = dict(base.named_modules())
    with torch.no_grad():
        for module, tensors in modules.items():
            layer = next(m for n, m in layers.items() if image_adapter.kohya_name(n) == module)
            layer.weight.copy_(_kohya_delta(tensors, layer.weight))
        expected = base(**_unet_inputs(base)).sample
        got = tuned(**_unet_inputs(base)).sample
        untouched = load_pipeline(BUILTIN).unet(**_unet_inputs(base)).sample
    targets = [n for n in layers if n.endswith((".to_q", ".to_k", ".to_v", ".to_out.0"))]
    assert sorted(modules) == sorted(image_adapter.kohya_name(n) for n in targets)  # every adapted layer
    assert not torch.allclose(got, untouched, atol=1e-4)  # the adapter trained and loaded
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def dit_pipelines(tmp_path_factory):
    from lora_gui.models.build_dit import build as build_dit

    root = tmp_path_factory.mktemp("dit")
    return {kind: build_dit(root / kind, kind) for kind in ("sd3", "flux")}


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "adapter"), [("sd3", "loha"), ("flux", "dora"), ("flux", "lokr")])
def test_dit_variant_is_predicted_and_loads_back(dit_pipelines, pictures, tmp_path, kind, adapter):
    cfg = load_config("image-512", {**BASE, "model": str(dit_pipelines[kind]), "data": str(pictures),
                                    "text_max_length": 16, "adapter": adapter, "lora_rank": 4,
                                    "export_kohya": True})
    summary = train_image(cfg, tmp_path / "run", progress=False)
    _check_prediction(summary)
    folder = tmp_path / "run" / "adapter"
    assert (folder / "peft").is_dir() == (adapter != "dora")
    assert (folder / "pytorch_lora_weights.safetensors").is_file() == (adapter == "dora")
    readers = json.loads((folder / "adapter_info.json").read_text())["files"]["kohya_lora.safetensors"]
    assert readers.startswith("ComfyUI") and "Forge and kohya sd-scripts do not read" in readers
    kw = {"num_inference_steps": 1, "height": 256, "width": 256, "output_type": "latent",
          "max_sequence_length": 16}
    base = load_pipeline(str(dit_pipelines[kind]))
    tuned = load_pipeline(str(dit_pipelines[kind]), folder)
    peft_config = next(iter(tuned.transformer.peft_config.values()))
    assert (type(peft_config).__name__, getattr(peft_config, "use_dora", False)) == {
        "loha": ("LoHaConfig", False), "lokr": ("LoKrConfig", False), "dora": ("LoraConfig", True)}[adapter]
    a = base("a red circle", generator=torch.Generator().manual_seed(0), **kw).images
    b = tuned("a red circle", generator=torch.Generator().manual_seed(0), **kw).images
    assert not torch.allclose(a, b)
    check_kohya_file(folder / "kohya_lora.safetensors", base.transformer, tuned.transformer,
                     "lora_transformer")


def check_kohya_file(path, base, tuned, prefix):
    """A kohya file whose names are ``prefix`` + each adapted diffusers layer's path (UNets:
    ``lora_unet``; a DiT in OneTrainer's layout, which ComfyUI maps for SD3 and Flux.1:
    ``lora_transformer``): one entry per adapted layer, and each layer's weight rebuilt from the
    file with the loaders' formulas equal to the trained adapter merged by peft."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    kohya = load_file(path)
    modules = {}
    for key, value in kohya.items():
        module, part = key.split(".", 1)
        modules.setdefault(module, {})[part] = value
    adapted = {n: m for n, m in tuned.named_modules() if isinstance(m, BaseTunerLayer)}
    assert sorted(modules) == sorted(image_adapter.kohya_name(n, prefix) for n in adapted)
    layers = dict(base.named_modules())
    with torch.no_grad():
        for name, layer in adapted.items():
            layer.merge()
            rebuilt = _kohya_delta(modules[image_adapter.kohya_name(name, prefix)], layers[name].weight)
            torch.testing.assert_close(rebuilt, layer.get_base_layer().weight, atol=1e-5, rtol=1e-4)


def test_image_adapter_settings_refuse_what_cannot_run():
    with pytest.raises(ConfigError, match="adapter: oft is for text runs; image runs use one of lora, dora"):
        apply_overrides(RunConfig(), {"task": "image", "adapter": "oft"})
    with pytest.raises(ConfigError, match="train_text_encoder"):
        apply_overrides(RunConfig(), {"task": "image", "adapter": "loha", "train_text_encoder": True,
                                      "cache_latents": "off"})
    with pytest.raises(ConfigError, match="rslora: applies to text runs"):
        apply_overrides(RunConfig(), {"task": "image", "adapter": "dora", "rslora": True})


# kohya sd-scripts' Flux.1 names of the tiny Flux (1 double block, 1 single block) and the diffusers
# layers each fuses, in order (BFL stacks q, k, v, and in single blocks the MLP input, on the output
# axis); None: a part with no adapter (zero rows)
FLUX_KOHYA = {
    "double_blocks_0_img_attn_qkv": ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k",
                                     "transformer_blocks.0.attn.to_v"],
    "double_blocks_0_txt_attn_qkv": ["transformer_blocks.0.attn.add_q_proj",
                                     "transformer_blocks.0.attn.add_k_proj",
                                     "transformer_blocks.0.attn.add_v_proj"],
    "double_blocks_0_img_attn_proj": ["transformer_blocks.0.attn.to_out.0"],
    "double_blocks_0_txt_attn_proj": ["transformer_blocks.0.attn.to_add_out"],
    "double_blocks_0_img_mlp_0": ["transformer_blocks.0.ff.net.0.proj"],
    "double_blocks_0_img_mlp_2": ["transformer_blocks.0.ff.net.2"],
    "double_blocks_0_txt_mlp_0": ["transformer_blocks.0.ff_context.net.0.proj"],
    "double_blocks_0_txt_mlp_2": ["transformer_blocks.0.ff_context.net.2"],
    "single_blocks_0_linear1": ["single_transformer_blocks.0.attn.to_q",
                                "single_transformer_blocks.0.attn.to_k",
                                "single_transformer_blocks.0.attn.to_v", None],
}


@pytest.mark.slow
def test_flux_lora_kohya_file_gives_the_same_weight_delta(dit_pipelines, pictures, tmp_path):
    """Plain LoRA on Flux.1: kohya_lora.safetensors in kohya sd-scripts' layout (BFL names, q / k / v
    fused) changes every fused weight exactly as the diffusers file changes its parts, as ComfyUI
    and Forge apply it (delta = up @ down x alpha / rows of down)."""
    cfg = load_config("image-512", {**BASE, "model": str(dit_pipelines["flux"]), "data": str(pictures),
                                    "text_max_length": 16, "lora_rank": 4, "export_kohya": True})
    summary = train_image(cfg, tmp_path / "run", progress=False)
    _check_prediction(summary)
    folder = tmp_path / "run" / "adapter"
    info = json.loads((folder / "adapter_info.json").read_text())
    assert set(info["files"]) == {"pytorch_lora_weights.safetensors", "kohya_lora.safetensors"}
    assert "ComfyUI and Forge" in info["files"]["kohya_lora.safetensors"]
    assert "read no alpha" in info["files"]["pytorch_lora_weights.safetensors"]
    diffusers_file = load_file(folder / "pytorch_lora_weights.safetensors")
    scale = info["lora_alpha"] / info["lora_rank"]
    delta = {k[len("transformer."):-len(".lora_A.weight")]: diffusers_file[k.replace("lora_A", "lora_B")]
             @ diffusers_file[k] * scale for k in diffusers_file if k.endswith(".lora_A.weight")}
    kohya = load_file(folder / "kohya_lora.safetensors")
    assert {k.split(".")[0] for k in kohya} == {f"lora_unet_{n}" for n in FLUX_KOHYA}
    assert set(delta) == {p for parts in FLUX_KOHYA.values() for p in parts if p}  # every adapted layer
    layers = dict(load_pipeline(str(dit_pipelines["flux"])).transformer.named_modules())
    for name, parts in FLUX_KOHYA.items():
        down, up = kohya[f"lora_unet_{name}.lora_down.weight"], kohya[f"lora_unet_{name}.lora_up.weight"]
        got = up @ down * float(kohya[f"lora_unet_{name}.alpha"]) / down.shape[0]
        mlp = layers["single_transformer_blocks.0.proj_mlp"].out_features
        expected = torch.cat([delta[p] if p else torch.zeros(mlp, down.shape[1]) for p in parts])
        assert delta[parts[0]].abs().max() > 0
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_flux_kohya_file_loads_in_diffusers_as_the_diffusers_file(pictures, tmp_path):
    """diffusers' load_lora_weights reads the kohya Flux.1 file (its converter hard-codes Flux.1's
    single-block widths, so this Flux has double blocks only) and the pipeline then denoises
    exactly as with the diffusers file."""
    from lora_gui.models.build_dit import build as build_dit

    model = str(build_dit(tmp_path / "flux", "flux", num_single_layers=0))
    cfg = load_config("image-512", {**BASE, "model": model, "data": str(pictures), "text_max_length": 16,
                                    "lora_rank": 4, "export_kohya": True})
    train_image(cfg, tmp_path / "run", progress=False)
    folder = tmp_path / "run" / "adapter"
    kw = {"num_inference_steps": 1, "height": 256, "width": 256, "output_type": "latent",
          "max_sequence_length": 16}
    from_kohya = load_pipeline(model)
    from_kohya.load_lora_weights(str(folder), weight_name="kohya_lora.safetensors")
    outputs = [pipe("a red circle", generator=torch.Generator().manual_seed(0), **kw).images
               for pipe in (load_pipeline(model, folder), from_kohya, load_pipeline(model))]
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(outputs[0], outputs[2], atol=1e-3)  # the adapter trained and loaded
