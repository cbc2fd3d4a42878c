"""Predicted vs measured peak of each image adapter variant (CPU, tracker): the bundled SD 1.x
UNet and SDXL- / SD3- / Flux-shaped pipelines built in code, 2 steps of batch 2 at 256 px, rank 4,
fp32, every run with ``export_kohya``.

Prints each run's own run.json figures: predicted / measured - 1 for the run (steps and caching
pass) and for the training steps alone (``train_peak_bytes``), and the files its adapter folder
holds.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/memory/image_adapter_variants.py
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lora_gui.data.build_images import build as build_pictures
from lora_gui.engine.image.train import train_image
from lora_gui.models.build_diffusion import build_sdxl_pipeline
from lora_gui.models.build_dit import build as build_dit
from lora_gui.presets import load_config

RUNS = {"builtin": ("lora", "loha", "lokr", "dora"), "sdxl": ("lora", "loha", "lokr", "dora"),
        "sd3": ("loha", "lokr", "dora"), "flux": ("lora", "lokr", "dora")}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="image-variants-"))
    build_pictures(root / "pictures", count=5)
    print(f"{'pipeline':<9}{'variant':<8}{'run':>9}{'steps':>9}  files")
    for pipeline, variants in RUNS.items():
        if pipeline == "sdxl":
            build_sdxl_pipeline().save_pretrained(root / "sdxl")
            model = str(root / "sdxl")
        else:
            model = "builtin" if pipeline == "builtin" else str(build_dit(root / pipeline, pipeline))
        for variant in variants:
            extra = {"text_max_length": 16} if pipeline in ("sd3", "flux") else {}
            cfg = load_config("image-512", {
                "model": model, "data": str(root / "pictures"), "max_steps": 2, "batch_size": 2,
                "monitor_hz": 0, "eval_fraction": 0.2, "sample_images": 0, "lora_rank": 4,
                "precision": "fp32", "resolution": 256, "adapter": variant,
                "export_kohya": True, **extra})
            out = root / f"{pipeline}-{variant}"
            summary = train_image(cfg, out, progress=False)
            steps = summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1
            files = sorted(p.name for p in (out / "adapter").iterdir())
            print(f"{pipeline:<9}{variant:<8}{summary['memory_report']['predicted_vs_measured']:>+9.2%}"
                  f"{steps:>+9.2%}  {', '.join(files)}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
