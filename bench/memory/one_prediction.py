"""The run's own prediction against its tracked peaks, and the same bytes from every entry point,
on SD 1.x-, SD3- and Flux-shaped pipelines saved with save_pretrained (tiny, built in code).

Run: ``PYTHONPATH=. .venv/bin/python -m bench.memory.one_prediction`` (about 2 minutes on 2 cores).
Prints one row per pipeline: the run's tracked peak and training-step peak (source: tracker),
the prediction (source: predicted) from the run, ``plan --json`` and the form's call, and the
errors predicted / measured - 1 (bound: -1%...+3%).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

from lora_gui.cli import main
from lora_gui.config import parse_set_args
from lora_gui.data.build_images import build as build_pictures
from lora_gui.memory.predict import predict
from lora_gui.presets import load_config


def _pipeline(kind: str, out: Path) -> Path:
    if kind == "sd":
        from lora_gui.models.build_diffusion import build

        return build(out)
    from lora_gui.models.build_dit import build

    return build(out, kind)


def row(kind: str, root: Path) -> dict:
    pictures = root / "pictures"
    if not pictures.exists():
        build_pictures(pictures, count=5)
    sets = {"model": _pipeline(kind, root / kind), "data": pictures, "max_steps": 2, "batch_size": 2,
            "monitor_hz": 0, "eval_fraction": 0.2, "sample_images": 0, "text_max_length": 16,
            "resolution": 512, "budget_gb": 2.0}
    pairs = [f"{k}={v}" for k, v in sets.items()]
    args = [x for pair in pairs for x in ("--set", pair)]
    out = root / f"run-{kind}"
    with contextlib.redirect_stdout(io.StringIO()):  # train prints its closing summary
        assert main(["train", "--preset", "image-512", "--quiet", "--out", str(out), *args]) == 0
    run = json.loads((out / "run.json").read_text())
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["plan", "--preset", "image-512", "--device", "cpu", "--json", *args]) == 0
    cli = json.loads(text.getvalue())
    form = predict(load_config("image-512", parse_set_args(pairs)), device="cpu")
    return {"kind": kind, "peak": run["peak_bytes"], "train_peak": run["train_peak_bytes"],
            "run_predicted": run["predicted_peak_bytes"], "cli": cli["peak_bytes"], "form": form.peak_bytes,
            "predicted_train": form.train_peak_bytes}


def main_bench() -> None:
    mib = 2**20
    print("pipeline  tracked peak MiB  tracked train-step MiB  predicted (run / plan / form) MiB  "
          "predicted train MiB  whole run  train steps  same bytes")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("sd", "sd3", "flux"):
            r = row(kind, Path(tmp))
            same = r["run_predicted"] == r["cli"] == r["form"]
            print(f"{r['kind']:<8}  {r['peak'] / mib:>16,.2f}  {r['train_peak'] / mib:>22,.2f}  "
                  f"{r['run_predicted'] / mib:>10,.2f} / {r['cli'] / mib:,.2f} / {r['form'] / mib:,.2f}  "
                  f"{r['predicted_train'] / mib:>19,.2f}  {r['form'] / r['peak'] - 1:>+9.2%}  "
                  f"{r['predicted_train'] / r['train_peak'] - 1:>+11.2%}  {same}")


if __name__ == "__main__":
    main_bench()
