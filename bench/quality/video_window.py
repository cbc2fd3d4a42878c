"""What windowed space-time attention costs in quality and saves in memory on a video run.

    OMP_NUM_THREADS=2 .venv/bin/python -m bench.quality.video_window [--steps 300] [--windows 1,1,1 0,1,1]
    .venv/bin/python -m bench.quality.video_window --plan-only   # the Wan 2.1 1.3B plans alone
    (--train-only: the demo runs alone; --out: the results file)

1. Quality: trains the video demo (presets/video-demo.yaml: the built-in tiny Wan pipeline, 32 clips
   of 32 x 32 px, 9 frames: 3 latent frames x 2 x 2 tokens) through the engine with full attention
   and with each window, at the same seed, data split and steps, and reports each run's held-out
   flow-matching loss (the engine's own, with seeded noise and timesteps, so the arms see the same
   held-out draws), its ratio to the full-attention run's, and each run's tracked peak beside its
   own prediction (source: tracker / predicted, CPU).
2. Memory at a real shape: the plan (``predict``, fake-tensor trace of one step, no weights read)
   of Wan 2.1 1.3B at 832 x 480 x 81 frames (21 x 30 x 52 = 32,760 tokens), batch 1, gradient
   checkpointing, for a card: SDPA, eager attention and each window; the peaks and the differences.
   The plan traces the blocked kernel, which keeps what FlexAttention (the GPU run's kernel) keeps,
   q, k, v, the output and a float32 logsumexp; its transient is one chunk of scores.

Writes bench/results/video_window.json, or ``--out`` (stamped with the commit). The committed
results: bench/results/video_window_demo.json (``--train-only``) and video_window_plans.json
(``--plan-only``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, write_results

PLAN_SHAPE = {"task": "video", "model": "wan2.1-t2v-1.3b", "resolution": "832x480", "video_frames": 81,
              "gradient_checkpointing": True, "batch_size": 1}


def train_arm(window: str, steps: int, out: Path) -> dict[str, Any]:
    """One demo run with ``video_window`` = ``window`` ('' = full attention)."""
    from lora_gui.engine import train
    from lora_gui.presets import load_config

    cfg = load_config("video-demo", {"max_steps": steps, "video_window": window, "sample_images": 0,
                                     "measure_every_step": False})
    t0 = time.time()
    summary = train(cfg, out, progress=False)
    report = summary["memory_report"]
    return {"video_window": window or "full", "status": summary["status"], "steps": summary["steps"],
            "seconds": round(time.time() - t0, 1), "base_eval_loss": summary["base_eval_loss"],
            "eval_loss": summary["eval_loss"], "final_loss": summary["final_loss"],
            "tracked_peak_bytes": summary["peak_bytes"],
            "tracked_train_peak_bytes": summary["train_peak_bytes"],
            "predicted_peak_bytes": summary["prediction"]["peak_bytes"],
            "predicted_vs_measured": report["predicted_vs_measured"], "measured_source": report.get("source")}


def plan_arm(window: str, backend: str) -> dict[str, Any]:
    """The plan of Wan 2.1 1.3B at 832x480x81 with one attention setting (device cuda, no budget)."""
    from lora_gui.config import RunConfig, apply_overrides
    from lora_gui.memory.predict import predict

    cfg = apply_overrides(RunConfig(), {**PLAN_SHAPE, "attn_backend": backend, "video_window": window})
    t0 = time.time()
    pred = predict(cfg, None, "cuda")
    return {"video_window": window or "full", "attn_backend": backend, "peak_bytes": pred.peak_bytes,
            "video_tokens": pred.step.info["video_tokens"], "breakdown": pred.step.breakdown,
            "seconds": round(time.time() - t0, 1), "source": "predicted"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps of each demo run")
    parser.add_argument("--windows", nargs="+", default=["1,1,1", "0,1,1"],
                        help="video_window values to compare with full attention")
    parser.add_argument("--plan-windows", nargs="+", default=["2,4,4", "1,8,8"],
                        help="video_window values planned at Wan 2.1 1.3B 832x480x81")
    parser.add_argument("--plan-only", action="store_true", help="the plans alone, no training")
    parser.add_argument("--train-only", action="store_true", help="the demo runs alone, no plans")
    parser.add_argument("--out", default=str(RESULTS / "video_window.json"))
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    body: dict[str, Any] = {"command": " ".join(["python -m bench.quality.video_window", *given]),
                            "preset": "video-demo"}
    if not args.plan_only:
        with tempfile.TemporaryDirectory() as tmp:
            runs = [train_arm(w, args.steps, Path(tmp) / f"run{i}")
                    for i, w in enumerate(["", *args.windows])]
        full = runs[0]["eval_loss"]
        for run in runs:
            run["eval_loss_vs_full"] = run["eval_loss"] / full
        body["runs"], body["steps"] = runs, args.steps
    if not args.train_only:
        plans = [plan_arm("", "sdpa"), plan_arm("", "eager"),
                 *(plan_arm(w, "sdpa") for w in args.plan_windows)]
        base = plans[0]["peak_bytes"]
        for plan in plans:
            plan["vs_sdpa_bytes"] = plan["peak_bytes"] - base
            plan["vs_eager_bytes"] = plan["peak_bytes"] - plans[1]["peak_bytes"]
        body["plans"] = {"shape": PLAN_SHAPE, "device": "cuda", "rows": plans}
    path = write_results(args.out, body)
    print(json.dumps(body, indent=1, default=str))
    print(f"written: {path}")
    return body


if __name__ == "__main__":
    main()
