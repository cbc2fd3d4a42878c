"""DiT memory engine: the fake-tensor trace of an SD3 / Flux flow-matching step against the same
step on real CPU tensors (tracker), the calibrated estimate, the planner, the bundled configs."""

import json

import pytest
import torch

from lora_gui.cli import main
from lora_gui.memory.predict.dit_plan import plan_dit, resident_bytes, what_fits_where_dit
from lora_gui.memory.predict.dit_trace import estimate_dit_step, text_encoder_params, trace_dit_step
from lora_gui.memory.predict.model_configs import load_model_config
from lora_gui.memory.predict.planner import accumulated_peak
from lora_gui.models.build_dit import FLUX_TRANSFORMER, SD3_TRANSFORMER

TINY = {
    "sd3": {"_class_name": "SD3Transformer2DModel", **SD3_TRANSFORMER},
    "flux": {"_class_name": "FluxTransformer2DModel", **FLUX_TRANSFORMER},
}
STEP = {"lora_rank": 4, "dtype": torch.float32, "device": "cpu", "text_seq_len": 16}


@pytest.mark.parametrize("kind", ["sd3", "flux"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_trace_is_within_3_percent_of_the_real_step(kind, checkpointing):
    kw = {**STEP, "batch_size": 1, "resolution": 512, "gradient_checkpointing": checkpointing}
    fake = trace_dit_step(TINY[kind], **kw)
    real = trace_dit_step(TINY[kind], fake=False, **kw)
    assert real.info["source"] == "tracker" and fake.info["source"] == "predicted"
    assert abs(fake.traced_peak_bytes / real.traced_peak_bytes - 1) <= 0.03
    assert sum(fake.breakdown.values()) == fake.traced_peak_bytes
    assert fake.info["image_tokens"] == 1024 and fake.info["text_tokens"] == 16


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_eager_attention_keeps_the_score_matrix(kind):
    kw = {**STEP, "batch_size": 1, "resolution": 768}
    sdpa, eager = trace_dit_step(TINY[kind], **kw), trace_dit_step(TINY[kind], attention="eager", **kw)
    tokens = (768 // 16) ** 2 + 16
    heads = TINY[kind]["num_attention_heads"]
    # at least one (heads x S x S) float32 matrix more than SDPA
    assert eager.peak_bytes - sdpa.peak_bytes >= heads * tokens * tokens * 4


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_estimate_matches_the_trace_between_and_beyond_its_calibration(kind):
    for batch, res in ((1, 768), (3, 640), (2, (1536, 768))):
        est = estimate_dit_step(TINY[kind], batch_size=batch, resolution=res, **STEP)
        traced = trace_dit_step(TINY[kind], batch_size=batch, resolution=res, **STEP)
        assert abs(est.peak_bytes / traced.peak_bytes - 1) < 0.02, (batch, res)


def test_plan_picks_the_largest_batch_that_fits_and_suggests_caching():
    step = {**STEP, "device": "cuda"}
    def at_1024(n: int):
        return estimate_dit_step(TINY["flux"], batch_size=n, resolution=1024, **step)

    one = at_1024(1).peak_bytes
    # a step of 8 cut 4 + 4: the second micro-batch runs beside the first one's LoRA gradients
    four = accumulated_peak(at_1024, 4, 8)
    assert four == at_1024(4).peak_bytes + at_1024(4).breakdown["lora_params"]
    plan = plan_dit(TINY["flux"], four + 1, [512, 1024], effective_batch=8, max_batch=8, **step)
    sizes = dict((b.bucket, b.micro_batch) for b in plan.buckets)
    assert sizes[1024] == 4 and sizes[512] > 4 and plan.fits
    assert all(b.peak_bytes <= four + 1 for b in plan.buckets)
    alone = plan_dit(TINY["flux"], at_1024(4).peak_bytes + 1, [1024], effective_batch=8, max_batch=8, **step)
    assert alone.buckets[0].micro_batch == 3  # 4 alone fits, 4 + 4 does not
    resident = 10**9  # text encoders kept on the device
    tight = plan_dit(TINY["flux"], one + resident // 2, [1024], resident=resident, **step)
    assert not tight.fits and tight.suggestions[0].switch.startswith("cache_latents=disk")
    assert tight.suggestions[0].fits


def test_bundled_dit_configs_and_text_encoders():
    flux = load_model_config("flux.1-dev")
    assert flux["guidance_embeds"] is True and flux["num_single_layers"] == 38
    assert load_model_config("sd3.5-large")["num_layers"] == 38
    assert load_model_config("sd3.5-medium")["dual_attention_layers"][-1] == 12
    assert text_encoder_params("t5_xxl") == 4_762_310_656  # T5-XXL encoder: 4.76B
    assert resident_bytes("flux", "ram", torch.bfloat16) == 0
    # T5-XXL + CLIP-L in bf16 plus the float32 VAE: about 10 GB stay resident without a cache
    assert 9.8e9 < resident_bytes("flux", "off", torch.bfloat16) < 10.3e9


def test_what_fits_where_grows_with_the_card():
    rows = what_fits_where_dit(TINY["sd3"], chosen=1024, cards_gb=(8, 24), **{**STEP, "device": "cuda"})
    assert [r.card_gb for r in rows] == [8, 24] and rows[0].longest == 1536
    assert rows[1].batch_at_chosen >= rows[0].batch_at_chosen > 0


@pytest.mark.slow
def test_plan_cli_for_a_dit_pipeline_folder(tmp_path, capsys):
    from lora_gui.models.build_dit import build

    path = build(tmp_path / "flux", "flux")
    code = main(["plan", "--preset", "image-1024", "--set", f"model={path}", "--set", "text_max_length=16",
                 "--budget-gb", "8", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is True
    # the caching pass (transformer + the folder's own VAE and CLIP / T5 encoders + VAE activations)
    assert main(["plan", "--preset", "image-1024", "--set", f"model={path}", "--set", "text_max_length=16",
                 "--budget-gb", "0.05", "--json"]) == 0
    tight = json.loads(capsys.readouterr().out)
    assert tight["fits"] is False and "encoding the pictures" in tight["message"]
    assert tight["peak_bytes"] > tight["traced_peak_bytes"] > 0  # the pass is above the tiny step


def test_a_cached_gpu_run_encodes_without_the_transformer_on_the_card():
    from types import SimpleNamespace

    from lora_gui.config import RunConfig
    from lora_gui.memory.predict.dit_plan import encoding_pass_bytes

    transformer = 23 * 2**30  # Flux.1-dev's 12B in bf16, as a step's breakdown would say
    adam = 4 * 2**20  # the LoRA's optimizer state
    step = SimpleNamespace(breakdown={"frozen_weights": transformer, "lora_params": 2**20,
                                      "optimizer_state": adam},
                           cuda_overheads={"cuda_context": 500 * 2**20}, device="cuda")
    cfg = {mode: RunConfig(task="image", model="flux.1-dev", resolution=256, cache_latents=mode)
           for mode in ("ram", "off")}
    cached, uncached = (encoding_pass_bytes(cfg[m], "flux", step, (256, 256), torch.bfloat16)
                        for m in ("ram", "off"))
    # every step encodes: the transformer is there, and from the second step on its optimizer state
    assert uncached - cached == transformer + 2**20 + adam
    on_cpu = SimpleNamespace(**{**vars(step), "device": "cpu"})  # the host is the device
    # the caching pass comes before the first step: no optimizer state yet
    assert encoding_pass_bytes(cfg["ram"], "flux", on_cpu, (256, 256), torch.bfloat16) == uncached - adam


def test_the_unet_encoding_pass_is_the_vae_trace_plus_what_is_on_the_device():
    """SD 1.x / SDXL runs count their encoding pass from the pipeline's configs, as DiT runs do:
    the VAE term is the tracked peak of a real encode (plus the stacked copy of the picture), a
    cached GPU run leaves the UNet out."""
    from types import SimpleNamespace

    from diffusers import AutoencoderKL

    from lora_gui.config import RunConfig
    from lora_gui.memory.predict import image_run
    from lora_gui.memory.predict.encode_trace import trace_vae_encode
    from lora_gui.memory.runtime.tracker import StorageTracker
    from lora_gui.models.diffusion import BUILTIN_DIFFUSION_DIR

    vae = AutoencoderKL.from_pretrained(BUILTIN_DIFFUSION_DIR / "vae").eval()
    with torch.no_grad(), StorageTracker() as t:
        t.track([*vae.parameters(), *vae.buffers()])
        start = t.live_bytes
        vae.encode(torch.zeros(1, 3, 192, 256)).latent_dist.sample()
    config = {k: v for k, v in AutoencoderKL.load_config(BUILTIN_DIFFUSION_DIR / "vae").items()
              if not k.startswith("_")}
    picture = 3 * 192 * 256 * 4  # the trace holds the picture and its stacked batch copy
    assert trace_vae_encode(config, 192, 256) == t.peak_bytes - start + picture

    unet = 3 * 2**30
    step = SimpleNamespace(breakdown={"frozen_weights": unet, "lora_params": 2**20},
                           cuda_overheads={"cuda_context": 500 * 2**20}, device="cuda")
    cfg = {m: RunConfig(task="image", model="builtin", cache_latents=m) for m in ("ram", "off")}
    cached, uncached = (image_run.unet_encoding_pass(cfg[m], step, str(BUILTIN_DIFFUSION_DIR), 7,
                                                          (256, 192)) for m in ("ram", "off"))
    assert uncached - cached == unet + 2**20
    assert cached == 7 + trace_vae_encode(config, 192, 256) + 500 * 2**20


def test_the_unet_run_takes_the_encoding_pass_when_it_is_higher(monkeypatch):
    from lora_gui.memory.predict import image_run, predict
    from lora_gui.presets import load_config

    cfg = load_config("image-768", {"resolution": 512})
    plain = predict(cfg, device="cpu")
    assert 0 < plain.step.info["encoding_pass_bytes"] < plain.peak_bytes  # the built-in model: the step
    # on a CPU the cached inputs stay beside the step and the encoding pass alike
    held = plain.peak_bytes - plain.step.info["train_peak_bytes"]
    assert held > 0
    monkeypatch.setattr(image_run, "unet_encoding_pass", lambda *a: plain.peak_bytes + 12345)
    higher = predict(cfg, device="cpu")
    # the pass's peak holds what the step does, and a repeated caption's fresh embeddings (77 x
    # 64 floats here: the demo pictures repeat captions) before the cache drops them
    assert higher.peak_bytes == higher.step.info["encoding_pass_bytes"]
    assert higher.peak_bytes - (plain.peak_bytes + 12345 + held) == 77 * 64 * 4
