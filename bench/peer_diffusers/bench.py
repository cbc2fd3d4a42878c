"""The driver of ``python -m bench.peer_diffusers`` (the module doc of __main__.py says what it measures)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.docs.meta import with_stamp

ROOT = Path(__file__).resolve().parents[2]
DEPS = ROOT / "bench" / ".peer_deps"
STARS = ROOT / "assets" / "drawing-stars"
DRAWING = ROOT / "assets" / "drawing-model"
MiB = 2**20
TARGET_PEAK, TARGET_SPEED = 0.7, 1.3  # lora_gui at most 0.7x the script's peak, at least 1.3x its images/s

# pipeline -> (script, its AdamW weight decay, DiT?)
PIPELINES: dict[str, tuple[str, float, bool]] = {
    "sdxl": ("train_text_to_image_lora_sdxl", 1e-2, False),
    "flux": ("train_dreambooth_lora_flux", 1e-4, True),
    "bundled-sd3": ("train_dreambooth_lora_sd3", 1e-4, True),
}
CONFIGS = ("script", "script-switches", "lora_gui", "lora_gui-switches")
# --diagnose: lora_gui's defaults without its built-in CPU memory tracker (no step peaks): not how
# users run it, a row that says what that tracker costs a CPU run; untracked rounds only
BARE = "lora_gui-no-cpu-tracker"


def build_sdxl(out: Path) -> Path:
    """The tiny SDXL pipeline the tests use (lora_gui.models.build_diffusion), saved in ``out``."""
    from lora_gui.models.build_diffusion import build_sdxl_pipeline

    build_sdxl_pipeline(seed=0).save_pretrained(out)
    return out


def build_pipelines(folder: Path) -> dict[str, Path]:
    from lora_gui.models.build_dit import build as build_dit

    return {"sdxl": build_sdxl(folder / "sdxl"), "flux": build_dit(folder / "flux", "flux"),
            "bundled-sd3": DRAWING}


def image_folder(folder: Path) -> Path:
    """The bundled star pictures as a datasets imagefolder: the same files and captions."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metadata.jsonl", "w", encoding="utf-8") as meta:
        for png in sorted(STARS.glob("*.png")):
            shutil.copy(png, folder / png.name)
            caption = png.with_suffix(".txt").read_text(encoding="utf-8").strip()
            meta.write(json.dumps({"file_name": png.name, "text": caption}) + "\n")
    return folder


def script_args(pipeline: str, model: Path, data: Path, out: Path, a: argparse.Namespace,
                switches: bool) -> list[str]:
    script, decay, dit = PIPELINES[pipeline]
    args = ["--pretrained_model_name_or_path", str(model), "--output_dir", str(out),
            "--resolution", str(a.resolution), "--train_batch_size", str(a.batch),
            "--max_train_steps", str(a.steps), "--learning_rate", str(a.lr), "--lr_scheduler", "constant",
            "--lr_warmup_steps", "0", "--seed", "0", "--rank", str(a.rank), "--mixed_precision", "no",
            "--dataloader_num_workers", "0", "--checkpointing_steps", "1000000",
            "--adam_weight_decay", str(decay), "--caption_column", "text"]
    if dit:
        args += ["--dataset_name", str(data), "--image_column", "image", "--instance_prompt", "a star",
                 "--max_sequence_length", str(a.text_len)]
        if pipeline == "flux":
            args += ["--lora_alpha", str(a.rank)]
    else:
        args += ["--train_data_dir", str(data)]
    if switches:
        args += ["--gradient_checkpointing", "--use_8bit_adam"] + (["--cache_latents"] if dit else [])
    return args


def lora_settings(pipeline: str, model: Path, a: argparse.Namespace, switches: bool) -> dict[str, Any]:
    _, decay, dit = PIPELINES[pipeline]
    cfg: dict[str, Any] = {"model": str(model), "data": str(STARS), "resolution": a.resolution,
                           "batch_size": a.batch, "max_steps": a.steps, "lr": a.lr, "warmup_steps": 0,
                           "weight_decay": decay, "lora_rank": a.rank, "lora_alpha": float(a.rank),
                           "lora_dropout": 0.0, "precision": "fp32", "seed": 0, "eval_fraction": 0.0,
                           "sample_images": 0, "monitor_hz": 0.0, "checkpoint_every": 1_000_000}
    cfg["text_max_length"] = a.text_len if dit else 0
    if switches:
        cfg |= {"gradient_checkpointing": True, "optimizer": "adamw8bit", "cache_latents": "ram"}
    return cfg


def run_one(pipeline: str, config: str, model: Path, data: Path, folder: Path, a: argparse.Namespace,
            tag: str, tracked: bool = True) -> dict[str, Any]:
    """One configuration in a fresh subprocess (pinned with taskset when --cpu is given).
    ``tracked``: the bench's tracker around the training call (peaks); without it, each side runs
    as its users run it (the script with no tracker; lora_gui with its own, built in on a CPU)."""
    out, result = folder / f"{pipeline}-{config}-{tag}", folder / f"{pipeline}-{config}-{tag}.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(folder / "hf-datasets"),
           "TOKENIZERS_PARALLELISM": "false"}
    switches = config.endswith("switches")
    cmd = [sys.executable, "-m", "bench.peer_diffusers.launch", "--threads", str(a.threads),
           "--result", str(result)]
    if not tracked:
        cmd.append("--no-tracker")
    if config == BARE:
        cmd.append("--no-builtin-tracker")
    if config.startswith("script"):
        env["PYTHONPATH"] = os.pathsep.join([str(DEPS), str(ROOT)])  # bench-only torchvision
        cmd += ["--script", PIPELINES[pipeline][0], "--",
                *script_args(pipeline, model, data, out, a, switches)]
    else:
        env["PYTHONPATH"] = str(ROOT)
        settings = folder / f"{pipeline}-{config}-{tag}.settings.json"
        settings.write_text(json.dumps(lora_settings(pipeline, model, a, switches)), encoding="utf-8")
        cmd += ["--lora", str(settings), "--out", str(out)]
    if a.cpu is not None:
        cmd = ["taskset", "-c", str(a.cpu), *cmd]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{pipeline} {config} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    row = json.loads(result.read_text(encoding="utf-8"))
    stamps = row.pop("stamps")[-a.steps:]  # the training loop's steps (lora_gui's planner traces one more)
    cpu = row.pop("cpu_stamps", [])[-a.steps:]  # the same steps in process CPU seconds
    gaps = [b - a_ for a_, b in zip(stamps, stamps[1:], strict=False)]
    if not tracked:  # speed only: no peak was measured on either side
        row |= {"peak_bytes": 0, "peak_bytes_without_probe": 0}
    row |= {"pipeline": pipeline, "config": config, "optimizer_steps": len(stamps), "tracked": tracked,
            "images_per_s": a.batch * (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "steady_images_per_s": a.batch / statistics.median(gaps),
            "cpu_images_per_s": a.batch * (len(cpu) - 1) / (cpu[-1] - cpu[0]) if len(cpu) > 1 else None}
    return row


def _noise_ok(a: list[float], b: list[float]) -> tuple[float, float, bool]:
    """Mean loss difference and twice its standard error (per-step losses as samples)."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    se = (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5
    return diff, 2 * se, abs(diff) <= 2 * se


def _speed_rounds(rows: list[dict[str, Any]]) -> set[int]:
    """Rounds whose speeds count: all, or with untracked rounds (--untracked-peer) only those."""
    untracked = {r.get("round", 0) for r in rows if r.get("tracked") is False}
    return untracked or {r.get("round", 0) for r in rows}


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _cpu_verdict(med: dict[str, dict[str, Any]]) -> str:
    """lora_gui's default images/s over the script's fastest, both in process CPU seconds."""
    fastest = max((med[c]["cpu"] or 0.0) for c in ("script", "script-switches"))
    if med["lora_gui"]["cpu"] is None or not fastest:
        return "-"
    ratio = med["lora_gui"]["cpu"] / fastest
    return f"{ratio:.2f}x {'met' if ratio >= TARGET_SPEED else 'MISSED'}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table: per pipeline, each configuration's medians and the target ratios
    (peaks from the tracked rounds, speeds from the untracked ones when there are any)."""
    timed_rounds = _speed_rounds(rows)
    lines = ["| pipeline | configuration | steps | peak MiB (tracker, whole run) | peak MiB without "
             "the MFU probe | images/s (loop) | images/s per round | images/s (median step) | "
             "whole run s | mean loss | images/s (loop, CPU seconds) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = ["", "| pipeline | lora_gui default peak / script's lowest (<= 0.7); without the probe "
                "| "
                "lora_gui default images/s / script's fastest (>= 1.3); median step | same switches: "
                "peak, images/s | loss, lora_gui - script: mean difference (2 s.e.) | images/s by "
                "CPU seconds / script's fastest (>= 1.3) |",
                "|---|---|---|---|---|---|"]
    for pipeline in PIPELINES:
        med: dict[str, dict[str, Any]] = {}
        for config in (*CONFIGS, BARE):
            runs = [r for r in rows if r["pipeline"] == pipeline and r["config"] == config]
            if not runs:
                continue
            losses = runs[0]["losses"]  # seeded: every round logs the same curve, one is the sample
            measured = [r for r in runs if r.get("tracked", True)] or runs  # peaks: 0 untracked
            timed = [r for r in runs if r.get("round", 0) in timed_rounds]
            med[config] = {"peak": statistics.median(r["peak_bytes"] for r in measured),
                           "bare": statistics.median(r["peak_bytes_without_probe"] for r in measured),
                           "speed": statistics.median(r["images_per_s"] for r in timed),
                           "steady": statistics.median(r["steady_images_per_s"] for r in timed),
                           "total": statistics.median(r["total_s"] for r in timed),
                           "cpu": _median_or_none([r.get("cpu_images_per_s") for r in timed]),
                           "speeds": [round(r["images_per_s"], 2) for r in timed], "losses": losses,
                           "steps": runs[0]["optimizer_steps"]}
            m = med[config]
            lines.append(f"| {pipeline} | {config} | {m['steps']} | {m['peak'] / MiB:.1f} | "
                         f"{m['bare'] / MiB:.1f} | {m['speed']:.2f} | {m['speeds']} | {m['steady']:.2f} | "
                         f"{m['total']:.1f} | {statistics.fmean(losses):.4f} | {_fmt(m['cpu'])} |")
        if any(c not in med for c in CONFIGS):
            continue
        scripts = [med["script"], med["script-switches"]]
        peak = med["lora_gui"]["peak"] / max(1, min(s["peak"] for s in scripts))  # 0: not measured
        speed = med["lora_gui"]["speed"] / max(s["speed"] for s in scripts)
        bare = med["lora_gui"]["bare"] / max(1, min(s["bare"] for s in scripts))
        steady = med["lora_gui"]["steady"] / max(s["steady"] for s in scripts)
        same_peak = med["lora_gui-switches"]["peak"] / max(1, med["script-switches"]["peak"])
        same_speed = med["lora_gui-switches"]["speed"] / med["script-switches"]["speed"]
        diff, two_se, ok = _noise_ok(med["lora_gui"]["losses"], med["script"]["losses"])
        verdicts.append(f"| {pipeline} | {peak:.2f}x {'met' if peak <= TARGET_PEAK else 'MISSED'}; "
                        f"{bare:.2f}x | {speed:.2f}x {'met' if speed >= TARGET_SPEED else 'MISSED'}; "
                        f"{steady:.2f}x | "
                        f"{same_peak:.2f}x, {same_speed:.2f}x | {diff:+.4f} ({two_se:.4f}) "
                        f"{'within noise' if ok else 'OUTSIDE noise'} | {_cpu_verdict(med)} |")
    return lines + verdicts


def loss_chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Both sides' per-step training loss on one Plotly chart (round 0 of every configuration)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in rows:
        if r["round"] == 0:
            fig.add_trace(go.Scatter(y=r["losses"], x=list(range(1, len(r["losses"]) + 1)),
                                     mode="lines+markers", name=f"{r['pipeline']} {r['config']}"))
    fig.update_layout(title="Training loss per step: diffusers' LoRA scripts vs lora_gui (round 0)",
                      xaxis_title="optimizer step", yaxis_title="loss (as each side logs it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs="cdn")


def main() -> None:
    parser = argparse.ArgumentParser(description="diffusers' LoRA scripts vs lora_gui on images")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--text-len", type=int, default=12,
                        help="T5 (and the bundled CLIP) tokens per caption")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu", type=int, default=None, help="pin every run to this core (taskset)")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--no-tracker", action="store_true",
                        help="speed only: no tracker around either side (peaks print as 0); lora_gui "
                             "keeps its own built-in per-step tracker")
    parser.add_argument("--untracked-peer", action="store_true",
                        help="the first round runs both sides under the tracker (peaks); later rounds "
                             "run each side as its users run it (no tracker around either; lora_gui "
                             "keeps its built-in one) and give the speeds")
    parser.add_argument("--diagnose", action="store_true",
                        help=f"untracked rounds also run {BARE}: lora_gui's defaults without its "
                             "built-in CPU step-peak tracker (what that tracker costs)")
    parser.add_argument("--json", type=Path, default=None, help="also write every row here")
    parser.add_argument("--chart", type=Path, default=ROOT / "bench" / "results" / "peer_diffusers_loss.html")
    a = parser.parse_args()
    if not (DEPS / "torchvision").is_dir():
        sys.exit(f"torchvision for the scripts is missing in {DEPS}: run\n  pip install --no-deps "
                 f"--target {DEPS.relative_to(ROOT)} -r bench/peer_diffusers/requirements.txt")
    folder = Path(tempfile.mkdtemp(prefix="peer-diffusers-"))
    models = build_pipelines(folder / "models")
    data = image_folder(folder / "stars")
    names = [p for p in a.pipelines.split(",") if p]
    print(f"{a.steps} steps x batch {a.batch} at {a.resolution} px, rank {a.rank}, {a.threads} thread(s), "
          f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}", flush=True)
    rows: list[dict[str, Any]] = []
    pairs = [("script", "lora_gui"), ("script-switches", "lora_gui-switches")]
    if a.diagnose:
        pairs[0] = ("script", "lora_gui", BARE)
    for rnd in range(a.rounds):
        for pipeline in names if rnd % 2 == 0 else names[::-1]:
            for pair in pairs if rnd % 2 == 0 else pairs[::-1]:
                for config in pair if rnd % 2 == 0 else pair[::-1]:  # script / lora_gui, reversed
                    tracked = not a.no_tracker and not (a.untracked_peer and rnd > 0)
                    if config == BARE and tracked:
                        continue
                    row = run_one(pipeline, config, models[pipeline], data, folder, a, f"r{rnd}", tracked)
                    rows.append({**row, "round": rnd})
                    print(json.dumps({k: v for k, v in rows[-1].items() if k != "losses"}), flush=True)
    print("\n" + "\n".join(table(rows)))
    loss_chart(rows, a.chart)
    print(f"\nloss chart: {a.chart}")
    if a.json:
        a.json.write_text(json.dumps(with_stamp(rows), indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
