"""Predicted vs measured peak of real runs, per mode: the demo preset as the dashboard starts it
(simulated 2 GB budget) and the test grid of modes (tests/memory/test_run_prediction.py).

Usage: OMP_NUM_THREADS=1 python -m bench.memory.prediction_grid [--demo-steps 20] [--no-image]

Measured: run.json memory_report.peak_bytes (source: tracker, live tensor storage on this CPU);
predicted: the run's own predict_run figure (source: predicted, device cpu). Target: every
error within -1% .. +3%.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.presets import load_config
from tests.memory.test_run_prediction import BASE, GRID, HIGH, LOW

WORDS = "to be or not that is the question whether tis nobler in mind suffer".split()


def _corpus(folder: Path) -> Path:
    docs = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(5 + (i * 37) % 260)) for i in range(60)]
    path = folder / "varied.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def _row(name: str, summary: dict) -> str:
    m, p = summary["memory_report"], summary.get("prediction") or {}
    err = m["predicted_vs_measured"]
    shape = f"{p.get('batch_size')}x{p.get('seq_len', p.get('bucket'))} {p.get('mask', '')}".strip()
    ok = "yes" if LOW <= err <= HIGH else "NO"
    return (f"| {name} | {m['peak_bytes'] / 1e6:,.1f} | {m['predicted_peak_bytes'] / 1e6:,.1f} | "
            f"{err * 100:+.2f}% | {m['predicted_kernel']} | {shape} | {ok} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-steps", type=int, default=20)
    parser.add_argument("--no-image", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from lora_gui.engine.text.train import train_text

    print("| run | measured MB (tracker) | predicted MB | error | kernel (cpu) | peak micro-batch | "
          "within -1%..+3% |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        demo = load_config("text-demo", {"budget_gb": 2.0, "max_steps": args.demo_steps})
        print(_row(f"text-demo, budget 2 GB, {args.demo_steps} steps", train_text(
            demo, tmp / "demo", progress=False)), flush=True)
        data = _corpus(tmp)
        for name, extra in GRID.items():
            cfg = apply_overrides(RunConfig(), {**BASE, **extra, "data": str(data)})
            print(_row(name, train_text(cfg, tmp / name, progress=False)), flush=True)
        if not args.no_image:
            from lora_gui.data.build_images import build
            from lora_gui.engine.image.train import train_image

            build(tmp / "pictures", count=5)
            for cache in ("ram", "off"):
                cfg = load_config("image-512", {"data": str(tmp / "pictures"), "max_steps": 2,
                                                "batch_size": 2, "monitor_hz": 0, "eval_fraction": 0.2,
                                                "sample_images": 0, "cache_latents": cache,
                                                "precision": "fp32"})
                print(_row(f"image 512 px, cache_latents={cache}", train_image(
                    cfg, tmp / f"img-{cache}", progress=False)), flush=True)


if __name__ == "__main__":
    main()
