"""A DiT run's own memory prediction against the peak it measures: tiny SD3 and Flux pipelines,
2 steps on the demo pictures, float32 on the CPU (source: tracker), latents cached in RAM or not.

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/memory/dit_run_prediction.py`` (about a
minute). The run's peak is the larger of its steps and its caching pass (run.json
``memory_report``); target: predicted / measured - 1 within -1%..+3%.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.memory.image_run_prediction import measured_run
from lora_gui.data.build_images import build as build_pictures
from lora_gui.models.build_dit import build as build_dit
from lora_gui.presets import load_config

MIB = 2**20


def bundled_caching_pass() -> None:
    """The caching pass of the bundled SD3.5 / Flux.1 configs (predicted; bf16 weights, VAE in
    float32, VAE activations traced at 1024 px, CUDA context and cuBLAS workspace included): on
    a GPU with latents cached the transformer joins the card after this pass; with
    ``cache_latents=off`` it sits beside the encoders while they encode every step."""
    import torch
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    from lora_gui.memory.predict.dit_plan import VAE_CONFIG, vae_params
    from lora_gui.memory.predict.dit_trace import text_encoder_bytes
    from lora_gui.memory.predict.encode_trace import trace_vae_encode
    from lora_gui.memory.predict.model_configs import load_model_config
    from lora_gui.memory.predict.trace import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES

    gib = 2**30
    print("\n| model | transformer GiB | VAE + text encoders GiB | VAE encode at 1024 px GiB | "
          "caching pass, latents cached GiB | encoding with cache off GiB |")
    print("|---|---|---|---|---|---|")
    for name in ("sd3.5-medium", "sd3.5-large", "flux.1-dev"):
        conf = dict(load_model_config(name))
        flux = conf["_class_name"] == "FluxTransformer2DModel"
        cls = FluxTransformer2DModel if flux else SD3Transformer2DModel
        labels = ("architectures", "model_type")
        kwargs = {k: v for k, v in conf.items() if not k.startswith("_") and k not in labels}
        with torch.device("meta"):
            transformer = sum(p.numel() for p in cls.from_config(kwargs).parameters()) * 2
        kind = "flux" if name.startswith("flux") else "sd3"
        encoders = vae_params() * 4 + text_encoder_bytes(kind, torch.bfloat16)
        vae = trace_vae_encode(VAE_CONFIG, 1024, 1024)
        cached = encoders + vae + CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES  # transformer waits
        beside = cached + transformer
        print(f"| {name} | {transformer / gib:.1f} | {encoders / gib:.1f} | {vae / gib:.2f} | "
              f"{cached / gib:.1f} | {beside / gib:.1f} |", flush=True)


def main() -> int:
    print("| model | cache_latents | step peak MiB | caching pass MiB | run peak MiB (tracker) | "
          "predicted MiB | predicted vs measured | within -1%..+3% |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_pictures(root / "pictures", count=5)
        for kind in ("sd3", "flux"):
            model = build_dit(root / kind, kind)
            for cache in ("ram", "off"):
                cfg = load_config("image-512", {"model": str(model), "data": str(root / "pictures"),
                                                "max_steps": 2, "batch_size": 2, "monitor_hz": 0,
                                                "eval_fraction": 0.2, "sample_images": 0,
                                                "text_max_length": 16, "precision": "fp32",
                                                "cache_latents": cache})
                r = measured_run(cfg, root / f"run-{kind}-{cache}")
                print(f"| tiny {kind} | {cache} | {r['step'] / MIB:.2f} | {r['caching'] / MIB:.2f} | "
                      f"{r['peak'] / MIB:.2f} | {r['predicted'] / MIB:.2f} | {r['error']:+.2%} | "
                      f"{r['within']} |", flush=True)
    bundled_caching_pass()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
