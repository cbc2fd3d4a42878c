"""Model FLOPs utilisation: the FLOP count against a hand count from the config, against torch's
own counter on a real pass, the measured matmul peak, and `mfu` in run.json of a text and an
image run."""

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from lora_gui.config import apply_overrides
from lora_gui.data.build_images import build
from lora_gui.engine.image.train import train_image
from lora_gui.engine.text.train import train_text
from lora_gui.models import flops
from lora_gui.presets import load_config

H, I, LAYERS, HEADS, KV, VOCAB, R = 64, 160, 2, 4, 2, 128, 4  # noqa: E741 (the MLP width)


def _tiny(attn: str = "sdpa", targets: str | list[str] = "all-linear"):
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=H, intermediate_size=I, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV, tie_word_embeddings=True,
                         attn_implementation=attn)
    torch.manual_seed(0)
    return get_peft_model(Qwen2ForCausalLM(config), LoraConfig(r=R, target_modules=targets))


def _hand_count(length: int, targets: tuple[str, ...]) -> int:
    """Multiply-adds of one sequence, by hand from the config (2 FLOPs each)."""
    d = H // HEADS  # head dim
    shapes = {"q_proj": (H, H), "k_proj": (H, KV * d), "v_proj": (H, KV * d), "o_proj": (H, H),
              "gate_proj": (H, I), "up_proj": (H, I), "down_proj": (I, H)}
    per_token = 0
    for name, (n_in, n_out) in shapes.items():
        per_token += LAYERS * 2 * 2 * n_in * n_out  # forward + input gradient
        if name in targets:  # A (in x r) and B (r x out): forward, input gradient, weight gradient
            per_token += LAYERS * 3 * 2 * R * (n_in + n_out)
    per_token += 2 * 2 * H * VOCAB  # output head: forward + input gradient (tied: frozen, no weight grad)
    pairs = length * (length + 1) // 2  # causal: query i sees keys 0..i
    attention = LAYERS * 6 * 2 * HEADS * d * pairs  # QK^T and PV forward, 4 matmuls backward
    return per_token * length + attention


def test_text_count_matches_a_hand_count_from_the_config():
    assert flops.text_flops(_tiny()).step([32, 17]) == sum(
        _hand_count(n, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
        for n in (32, 17))
    only = ("q_proj", "v_proj")
    assert flops.text_flops(_tiny(targets=list(only))).step([40]) == _hand_count(40, only)


def test_text_count_against_torch_flop_counter_on_a_real_pass():
    """torch counts what autograd runs: full (non-causal) eager score rows, and no input gradient
    for the first layer's q/k/v (their input, the embeddings, needs none); the rest agrees."""
    model = _tiny("eager")
    length = 24
    ids = torch.randint(0, VOCAB, (1, length))
    counted = flops.counted_step_flops(model, lambda x: model(input_ids=x, labels=x).loss, ids)
    d = H // HEADS
    causal_vs_full = LAYERS * 12 * HEADS * d * (length * (length + 1) // 2 - length * length)
    first_qkv = length * (2 * H * (H + 2 * KV * d) + 3 * 2 * R * H)  # base and A input gradients
    assert counted == flops.text_flops(model).step([length]) - causal_vs_full - first_qkv


def test_windowed_pairs():
    assert flops.causal_pairs(5) == 15
    assert flops.causal_pairs(5, window=2) == sum(min(i + 1, 2) for i in range(5))
    # window 2, 1 global token: query i also sees token 0 once it is out of the window
    assert flops.causal_pairs(6, window=2, global_tokens=1) == sum(min(i + 1, 2) + (i >= 2) for i in range(6))


def test_gemm_peak_is_measured_once_per_device_and_dtype():
    first = flops.machine_peak("cpu", torch.float32)
    assert first.flops_per_s > 1e8 and first.source == "measured gemm" and first.dtype == "float32"
    assert flops.machine_peak("cpu", torch.float32) == first  # cached for the process
    assert flops.mfu(2e9, 1.0, 1e10) == pytest.approx(0.2) and flops.mfu(1, 1, None) is None
    assert flops.mfu(2e9, 1.0, 1e10, processes=2) == pytest.approx(0.1)


def test_text_run_reports_mfu(tmp_path, small_corpus):
    cfg = apply_overrides(load_config("text-demo"), {"data": str(small_corpus), "max_seq_len": 64,
                                                     "batch_size": 4, "max_steps": 2, "monitor_hz": 0})
    summary = train_text(cfg, tmp_path / "run", progress=False)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run == summary and 0 < run["mfu"] < 1.5
    assert run["useful_flops"] > 0 and run["peak_source"].startswith("measured gemm")  # capped: see below
    assert run["mfu"] == pytest.approx(run["useful_flops"] / run["train_seconds"] / run["peak_flops_per_s"])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["flops"] > 0 and r["mfu"] > 0 for r in records)


def test_image_run_reports_mfu(tmp_path, monkeypatch):
    from lora_gui.engine.core.control import TrainControl
    from lora_gui.engine.image import speed

    build(tmp_path / "pics", count=3)
    cfg = apply_overrides(load_config("image-512"), {
        "data": str(tmp_path / "pics"), "max_steps": 2, "batch_size": 1, "monitor_hz": 0,
        "eval_fraction": 0.34, "sample_images": 0, "resolution": 128})
    phases, counted_in = [], []  # the run's phases so far; the phase each FLOP count ran in
    control = TrainControl(on_event=lambda e: phases.append(e.get("phase")))
    count = speed.step_flops
    monkeypatch.setattr(speed, "step_flops",
                        lambda *a: counted_in.append(phases[-1]) or count(*a))
    summary = train_image(cfg, tmp_path / "run", progress=False, control=control)
    assert counted_in and "training" not in counted_in  # every bucket counted before the loop
    assert summary["mfu"] is not None and 0 < summary["mfu"] < 1.5
    # the plan's speed of the same UNet run, timed on its denoiser before the run: beside the measured
    report = summary["speed_report"]
    assert report["predicted_images_per_s"] > 0 and report["measured_mfu"] == summary["mfu"]
    assert report["predicted_source"].startswith(("calibrated on", "cached calibrated on"))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["flops"] > 0 for r in records)
    # one image's count is the same in every step of one bucket: linear in the images
    per_image = {r["bucket"]: r["flops"] / r["images"] for r in records}
    assert all(v > 1e6 for v in per_image.values())


def test_a_preference_steps_useful_work_counts_both_rows_of_each_pair():
    from lora_gui.data.pairs import PairSample
    from lora_gui.data.text import TokenizedSample
    from lora_gui.engine.text.train import _row_lengths

    def row(n):
        return TokenizedSample(list(range(n)), list(range(n)))

    pairs = [PairSample(row(5), row(3)), PairSample(row(2), row(7))]
    assert _row_lengths(pairs, [1, 0]) == [2, 7, 5, 3]  # chosen and rejected, each its own length
    assert _row_lengths([row(4), row(6)], [1]) == [6]  # a plain sample is one row


@pytest.mark.parametrize("adapter", ["lora", "loha"])
def test_an_sdxl_step_is_counted_with_eulers_scheduler_and_lycoris_adapters(adapter):
    """SDXL's Euler scheduler looks its step up by value and peft's LoHa draws a module dropout
    in training mode: neither can run on fake tensors, and both once left the run without MFU."""
    from peft import LoHaConfig

    from lora_gui.engine.image.speed import BucketFlops
    from lora_gui.models.build_diffusion import build_sdxl_pipeline
    from lora_gui.models.diffusion import Encoded

    pipe = build_sdxl_pipeline()
    unet = pipe.unet.requires_grad_(False)
    kind = LoHaConfig if adapter == "loha" else LoraConfig
    unet = get_peft_model(unet, kind(r=4, target_modules=["to_q", "to_k"]))
    unet.train()
    unet.base_model.model.conv_in.eval()  # one module left in eval: its mode must come back
    latents = torch.randn(1, pipe.unet.config.in_channels, 16, 16)
    enc = Encoded(latents, torch.randn(1, 4, pipe.unet.config.cross_attention_dim),
                  torch.randn(1, pipe.text_encoder_2.config.projection_dim), torch.randn(1, 6))
    counts = BucketFlops()
    counts.offer(enc, torch.randn_like(latents), torch.tensor([10]))
    counts.count_pending(unet, pipe.scheduler)
    per_image = counts.per_image[(4, 16, 16)]
    assert per_image is not None and per_image > 0
    assert counts.step(3) == 3 * per_image
    assert unet.training and not unet.base_model.model.conv_in.training


def test_the_machine_probe_stays_inside_the_memory_the_plan_leaves():
    """The matmul probe runs after the weights are in place: it may only use what the run's plan
    leaves above them, so measuring the machine never lifts the run's peak above its plan."""
    from lora_gui.memory.runtime.tracker import StorageTracker

    cap = flops.gemm_bytes(512, 512, 512, torch.float32)
    assert flops.largest_shape(torch.float32, cap) == (512, 512, 512)
    with StorageTracker() as tracker:
        assert flops.measure_gemm_peak("cpu", torch.float32, budget_s=5.0, max_bytes=cap) > 0
    assert 0 < tracker.peak_bytes <= cap
    assert flops.machine_peak("cpu", torch.float32, max_bytes=1000) is None  # not even 256^3 fits
    capped = flops.machine_peak("cpu", torch.float32, max_bytes=cap)
    assert capped.source == "measured gemm up to 512x512x512"
