"""Images on a lent card: lora_gui against diffusers' own DreamBooth LoRA scripts
(``python -m bench.gpu.check --sections image_peers``; bench/peer_diffusers is the same contest on
a CPU, and its unmodified copies of the scripts run here).

Two pipelines at 1,024 px, random weights built from configs on the device and saved to a
temporary folder (nothing is downloaded): SDXL (the UNet of presets/models/sdxl-unet.json, CLIP-L-
and OpenCLIP-bigG-shaped text encoders, SDXL's VAE) against ``train_dreambooth_lora_sdxl.py``,
and Flux.1-dev (presets/models/flux.1-dev.json, a CLIP-L- and a T5-XXL-shaped encoder, Flux's
16-channel VAE) against ``train_dreambooth_lora_flux.py``. The tokenizers are the bundled demo
models' small ones (so the embedding tables are small; every other shape is the real one).

Same work on both sides: the same pictures (smooth random colour fields at the resolution) with
one caption ("a star": the scripts' ``--instance_prompt``, lora_gui's caption files), the same
batch and optimizer steps, LoRA rank 4 / alpha 4 (the scripts' defaults) on the scripts' default
targets, learning rate 1e-4 constant, seed 0.

- the scripts in their fast configurations: bf16 mixed precision, 8-bit Adam, latents cached
  where the script offers it (Flux's ``--cache_latents``; the SDXL script has no such switch),
  once without and once with gradient checkpointing; the faster of those that fit is the one
  lora_gui is judged against;
- lora_gui as users run it on a card: the optimized mode, precision auto (bf16), its own plan
  under the card's memory (``budget_gb``), its defaults for caching and the optimizer.

Each side is a process of its own (bench/gpu/image_peer_run.py): images/s = batch / the median
optimizer-step time after ``warmup`` steps; peaks from the CUDA caching allocator over the whole
process and over the steady steps; MFU = useful FLOPs per image x images/s / this card's measured
bf16 matmul peak, the FLOPs per image being lora_gui's own count of the same denoiser and LoRA at
the same shape (lora_gui/engine/image/speed.py), used for both sides when their trainable
parameter counts agree (else the peer's MFU is left out). The verdict (target: at least 1.3x the
scripts' fastest images/s at no more peak allocated memory) is computed from these rows.

Defaults: batch 1, 10 optimizer steps, 3 of them warm-up, 512 T5 tokens (Flux). Each contest
builds and saves its pipeline (about 5 GB for SDXL, 34 GB for Flux in bf16) and runs three
processes that each load it; where a lent machine's command is limited in time, run the two
contests as two commands: ``python -m bench.gpu.image_peers --pipelines flux --out "$OUT"``.

Smoke mode (a CPU): the bundled tiny SDXL and Flux pipelines at 64 px, fp32, plain AdamW, a few
steps: the same code paths, figures meaningless. The scripts import torchvision (on a CPU
machine it is installed into bench/.peer_deps, bench/peer_diffusers/requirements.txt; on a lent
machine it is in .devsite, bench/gpu/device_kit.sh); without it the script rows carry the error.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lora_gui.units import GB

ROOT = Path(__file__).resolve().parents[2]
PEER_DEPS = ROOT / "bench" / ".peer_deps"  # the CPU peer bench's torchvision (bench-only)
TARGET_SPEED = 1.3  # lora_gui's images/s over the scripts' fastest configuration that fits
CAPTION = "a star"


@dataclass(frozen=True)
class Contest:
    """One side-by-side: the pipeline, the shapes and the steps both sides train."""

    pipeline: str  # "sdxl" or "flux"
    resolution: int = 1024
    batch: int = 1
    steps: int = 10
    warmup: int = 3  # optimizer steps left out of the median (first kernels, allocator growth)
    rank: int = 4
    text_len: int = 512  # T5 tokens per caption (Flux; the script's default)
    images: int = 4
    full: bool = True  # real shapes, bf16, 8-bit Adam; False: the tiny smoke pipelines, fp32

    @property
    def script(self) -> str:
        return {"sdxl": "train_dreambooth_lora_sdxl", "flux": "train_dreambooth_lora_flux"}[self.pipeline]


# real-shape text encoders and VAEs (the published models' configs; vocabularies are the tokenizers')
CLIP_L = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
          "max_position_embeddings": 77, "hidden_act": "quick_gelu", "projection_dim": 768}
CLIP_BIGG = {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
             "num_attention_heads": 20, "max_position_embeddings": 77, "hidden_act": "gelu",
             "projection_dim": 1280}
T5_XXL = {"d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24,
          "feed_forward_proj": "gated-gelu", "relative_attention_num_buckets": 32}
VAE_BASE = {"in_channels": 3, "out_channels": 3, "down_block_types": ["DownEncoderBlock2D"] * 4,
            "up_block_types": ["UpDecoderBlock2D"] * 4, "block_out_channels": [128, 256, 512, 512],
            "layers_per_block": 2, "sample_size": 1024}
VAE_SDXL = {**VAE_BASE, "latent_channels": 4, "scaling_factor": 0.13025}
VAE_FLUX = {**VAE_BASE, "latent_channels": 16, "scaling_factor": 0.3611, "shift_factor": 0.1159,
            "use_quant_conv": False, "use_post_quant_conv": False}


def _real_shapes(pipe: Any, kind: str, device: str) -> Any:
    """``pipe`` (a tiny pipeline: its tokenizers and scheduler) with every model at real shapes,
    random bf16 weights made on ``device``."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel, UNet2DConditionModel
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
        T5Config,
        T5EncoderModel,
    )

    from lora_gui.memory.predict.model_configs import load_model_config

    def clip(shape: dict[str, Any], tok: Any, cls: type) -> Any:
        return cls(CLIPTextConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **shape))

    def config(name: str) -> dict[str, Any]:
        return {k: v for k, v in load_model_config(name).items() if k not in ("architectures", "model_type")}

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # made in bf16 directly: half the memory and the bytes saved
    try:
        with torch.device(device):
            torch.manual_seed(0)
            if kind == "sdxl":
                models = {"unet": UNet2DConditionModel.from_config(config("sdxl-unet")),
                          "text_encoder": clip(CLIP_L, pipe.tokenizer, CLIPTextModel),
                          "text_encoder_2": clip(CLIP_BIGG, pipe.tokenizer_2, CLIPTextModelWithProjection),
                          "vae": AutoencoderKL(**VAE_SDXL)}
            else:
                t5 = pipe.tokenizer_2
                models = {"transformer": FluxTransformer2DModel.from_config(config("flux.1-dev")),
                          "text_encoder": clip(CLIP_L, pipe.tokenizer, CLIPTextModel),
                          "text_encoder_2": T5EncoderModel(T5Config(
                              vocab_size=len(t5), pad_token_id=t5.pad_token_id, eos_token_id=t5.eos_token_id,
                              decoder_start_token_id=t5.pad_token_id, **T5_XXL)),
                          "vae": AutoencoderKL(**VAE_FLUX)}
    finally:
        torch.set_default_dtype(default)
    return type(pipe)(**{**pipe.components, **models})


def build_pipeline(contest: Contest, folder: Path, device: str) -> Path:
    """The contest's pipeline saved under ``folder``: the bundled tiny one (smoke) or real shapes."""
    from lora_gui.models.build_diffusion import build_sdxl_pipeline
    from lora_gui.models.build_dit import build_flux_pipeline

    pipe = build_sdxl_pipeline(seed=0) if contest.pipeline == "sdxl" else build_flux_pipeline(seed=0)
    if contest.full:
        pipe = _real_shapes(pipe, contest.pipeline, device)
    pipe.save_pretrained(folder)
    del pipe
    return folder


def image_folders(folder: Path, count: int, size: int) -> tuple[Path, Path]:
    """The same pictures twice: images only (the scripts' ``--instance_data_dir`` opens every
    file in it) and with a caption file each (lora_gui's folder)."""
    import numpy as np
    from PIL import Image

    images, captioned = folder / "images", folder / "captioned"
    images.mkdir(parents=True)
    captioned.mkdir(parents=True)
    rng = np.random.default_rng(0)
    ramp = np.linspace(0.0, 1.0, size, dtype=np.float32)
    for index in range(count):  # a smooth colour field: two random colours blended along x and y
        a, b = rng.random(3, dtype=np.float32), rng.random(3, dtype=np.float32)
        pixels = a * ramp[:, None, None] + b * ramp[None, :, None]
        picture = Image.fromarray((255 * pixels / pixels.max()).astype(np.uint8))
        picture.save(images / f"{index:03d}.png")
        picture.save(captioned / f"{index:03d}.png")
        (captioned / f"{index:03d}.txt").write_text(CAPTION, encoding="utf-8")
    return images, captioned


def script_args(contest: Contest, model: Path, images: Path, out: Path, checkpointing: bool) -> list[str]:
    """The script's command line: its fast switches on the card (bf16, 8-bit Adam, cached latents
    where it has them), plain fp32 AdamW in smoke mode (bitsandbytes' 8-bit Adam needs a GPU)."""
    args = ["--pretrained_model_name_or_path", str(model), "--instance_data_dir", str(images),
            "--instance_prompt", CAPTION, "--output_dir", str(out), "--resolution", str(contest.resolution),
            "--train_batch_size", str(contest.batch), "--max_train_steps", str(contest.steps),
            "--learning_rate", "1e-4", "--lr_scheduler", "constant", "--lr_warmup_steps", "0", "--seed", "0",
            "--rank", str(contest.rank), "--dataloader_num_workers", "0", "--checkpointing_steps", "1000000",
            "--mixed_precision", "bf16" if contest.full else "no"]
    if contest.pipeline == "flux":
        args += ["--lora_alpha", str(contest.rank), "--max_sequence_length", str(contest.text_len),
                 "--cache_latents"]
    if contest.full:
        args.append("--use_8bit_adam")
    if checkpointing:
        args.append("--gradient_checkpointing")
    return args


def lora_settings(contest: Contest, model: Path, captioned: Path, device: str) -> dict[str, Any]:
    """lora_gui's run: optimized defaults, its own plan under the card's memory (GB, as budget_gb
    reads it), the same pictures, steps, batch and LoRA."""
    settings: dict[str, Any] = {
        "model": str(model), "data": str(captioned), "resolution": contest.resolution,
        "batch_size": contest.batch, "max_steps": contest.steps, "lr": 1e-4, "warmup_steps": 0,
        "weight_decay": 1e-4, "lora_rank": contest.rank, "lora_alpha": float(contest.rank),
        "lora_dropout": 0.0, "precision": "auto" if contest.full else "fp32", "seed": 0,
        "eval_fraction": 0.0, "sample_images": 0, "monitor_hz": 0.0, "checkpoint_every": 1_000_000,
        "text_max_length": contest.text_len if contest.pipeline == "flux" else 0}
    if device == "cuda":
        settings["budget_gb"] = round(torch.cuda.get_device_properties(0).total_memory / GB, 1)
    return settings


def run_side(cmd: list[str], result: Path, timeout_s: float, script: bool) -> dict[str, Any]:
    """One side in a process of its own (ended if it outlives ``timeout_s``).
    A script's process alone has the bench's torchvision on its path: its CUDA build may not load
    its C++ ops, which bench/peer_diffusers/launch.py makes harmless for the scripts only."""
    from lora_gui.memory.runtime.alloc_conf import ENV, EXPANDABLE

    deps = str(PEER_DEPS) if script and PEER_DEPS.is_dir() else ""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), deps, os.environ.get("PYTHONPATH", "")) if p)}
    if script and env.get(ENV) == EXPANDABLE:  # lora_gui's own setting (the check sets it): a script
        env.pop(ENV)  # runs with PyTorch's default allocator, as its users run it
    # in this process's group, so whoever ends the check (a test, a timeout) ends it too
    proc = subprocess.Popen([sys.executable, "-m", "bench.gpu.image_peer_run", "--result", str(result), *cmd],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except BaseException:  # a timeout or an interrupt: the side goes with it
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0 or not result.exists():
        return {"error": f"exit {proc.returncode}: {output[-3000:]}"}
    return json.loads(result.read_text(encoding="utf-8"))


def speed(row: dict[str, Any], contest: Contest) -> dict[str, Any]:
    """images/s from the median step after the warm-up, and the steps it is taken over."""
    stamps = row.get("stamps") or []
    gaps = [b - a for a, b in zip(stamps[contest.warmup - 1:], stamps[contest.warmup:], strict=False)]
    if row.get("out_of_memory") or row.get("error") or not gaps:
        return {"images_per_s": None, "median_step_s": None, "timed_steps": len(gaps)}
    step = statistics.median(gaps)
    return {"images_per_s": contest.batch / step, "median_step_s": step, "timed_steps": len(gaps)}


def contest_rows(contest: Contest, folder: Path, device: str, timeout_s: float = 540) -> list[dict[str, Any]]:
    """The scripts' configurations and lora_gui's run of one contest, with speed and MFU."""
    from lora_gui.models import flops

    model = build_pipeline(contest, folder / f"{contest.pipeline}-model", device)
    images, captioned = image_folders(folder / f"{contest.pipeline}-data", contest.images, contest.resolution)
    gc.collect()  # the built models, held in reference cycles until collected
    held = 0
    if device == "cuda":
        torch.cuda.empty_cache()  # the builder's blocks: this process holds nothing during the runs
        held = torch.cuda.memory_reserved()  # bytes; 0 expected, a row field so a reader can check
    common = ["--warmup", str(contest.warmup), "--steps", str(contest.steps)]
    rows = []
    precision = "bf16" if contest.full else "fp32"
    for checkpointing in (False, True):
        tag = f"{contest.pipeline}-script-gc{int(checkpointing)}"
        cmd = [*common, "--script", contest.script, "--",
               *script_args(contest, model, images, folder / tag, checkpointing)]
        rows.append({"side": "diffusers script", "config": f"{contest.script} ({precision}, "
                     f"{'8-bit Adam' if contest.full else 'AdamW'}"
                     f"{', cached latents' if contest.pipeline == 'flux' else ''}"
                     f", checkpointing {'on' if checkpointing else 'off'})",
                     "gradient_checkpointing": checkpointing,
                     **run_side(cmd, folder / f"{tag}.json", timeout_s, script=True)})
    settings = folder / f"{contest.pipeline}-lora.json"
    settings.write_text(json.dumps(lora_settings(contest, model, captioned, device)), encoding="utf-8")
    rows.append({"side": "lora_gui", "config": "optimized, its own plan under the card's memory",
                 **run_side([*common, "--lora", str(settings), "--out", str(folder / "lora-run")],
                            folder / f"{contest.pipeline}-lora-result.json", timeout_s, script=False)})
    shutil.rmtree(model, ignore_errors=True)  # tens of GB at real shapes
    dtype = torch.bfloat16 if contest.full and device == "cuda" else torch.float32
    peak = flops.machine_peak(device, dtype)
    lora = rows[-1]
    pairs = zip(lora.get("step_flops") or [], lora.get("step_images") or [], strict=False)
    counted = [f / n for f, n in pairs if f and n]
    per_image = statistics.median(counted) if counted else None
    for row in rows:
        row |= {"pipeline": contest.pipeline, "resolution": contest.resolution, "batch": contest.batch,
                "steps": contest.steps, "rank": contest.rank, "check_process_reserved_bytes": held,
                **speed(row, contest)}
        same_lora = row.get("trainable_params") == lora.get("trainable_params")
        useful = per_image if same_lora else None
        rate = row["images_per_s"]  # MFU: one second's useful FLOPs over the card's peak
        row |= {"useful_flops_per_image": useful, "peak_flops_per_s": peak.flops_per_s,
                "peak_source": peak.source,
                "mfu": flops.mfu(useful * rate, 1.0, peak.flops_per_s) if useful and rate else None}
        row.pop("stamps", None)
        print(json.dumps({k: v for k, v in row.items() if k not in ("step_flops", "step_images")}),
              flush=True)
    return rows


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """lora_gui against the scripts' fastest configuration that ran (no out-of-memory, no
    error): its images/s ratio and peaks, and whether the target holds (at least
    :data:`TARGET_SPEED` x the images/s at no more peak allocated bytes). Computed from the rows."""
    scripts = [r for r in rows if r["side"] == "diffusers script" and r.get("images_per_s")]
    lora = next((r for r in rows if r["side"] == "lora_gui"), {})
    if not scripts or not lora.get("images_per_s"):
        why = "no script configuration ran" if not scripts else "lora_gui did not run"
        return {"pipeline": rows[0]["pipeline"], "met": None, "why": f"not measured: {why}"}
    fastest = max(scripts, key=lambda r: r["images_per_s"])
    ratio = lora["images_per_s"] / fastest["images_per_s"]
    peak_ratio = lora["peak_allocated_bytes"] / fastest["peak_allocated_bytes"]
    return {"pipeline": lora["pipeline"], "fastest_script_config": fastest["config"],
            "speed_ratio": ratio, "peak_allocated_ratio": peak_ratio,
            "peak_reserved_ratio": (lora["peak_reserved_bytes"] / fastest["peak_reserved_bytes"]
                                    if lora.get("peak_reserved_bytes") and fastest.get("peak_reserved_bytes")
                                    else None),
            "same_lora": lora.get("trainable_params") == fastest.get("trainable_params"),
            "target": f">= {TARGET_SPEED}x images/s at no more peak allocated",
            "met": ratio >= TARGET_SPEED and peak_ratio <= 1.0, "memory_source": lora["memory_source"]}


def check_image_peers(smoke: bool = False, pipelines: tuple[str, ...] = ("sdxl", "flux")) -> dict[str, Any]:
    """The gpu_check section: every contest's rows and its verdict (smoke: tiny, on a CPU)."""
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    folder = Path(tempfile.mkdtemp(prefix="gpu-image-peers-"))
    out: dict[str, Any] = {"rows": [], "verdicts": []}
    try:
        for name in pipelines:
            contest = (Contest(name, resolution=64, steps=4, warmup=2, text_len=16, images=2, full=False)
                       if smoke else Contest(name))
            rows = contest_rows(contest, folder, device)
            out["rows"] += rows
            out["verdicts"].append(verdict(rows))
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def markdown(result: dict[str, Any]) -> list[str]:
    """The section's tables for gpu_check.md (MiB; peaks' source in the heading)."""
    mib = 2**20

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    def mib_of(row: dict[str, Any], key: str) -> str:
        return num(row[key] / mib if row.get(key) else None, ",.0f")

    rows = result.get("rows", [])
    source = rows[0].get("memory_source", "-") if rows else "-"
    out = [f"## Images: diffusers' LoRA scripts vs lora_gui (peaks: {source}; images/s from the median "
           "step after the warm-up; MFU against this device's measured matmul peak)", "",
           "| pipeline | side | configuration | px | batch | images/s | s / step | MFU | peak allocated MiB "
           "| peak reserved MiB | steady allocated MiB | trainable params | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        note = "out of memory" if r.get("out_of_memory") else (r.get("error") or "")[-120:].replace("\n", " ")
        switches = (r.get("engine") or {}).get("switches") or {}
        if switches and not note:  # what lora_gui's own plan and defaults chose
            note = (f"checkpointing {'on' if switches.get('gradient_checkpointing') else 'off'}, latents "
                    f"cached: {switches.get('cache_latents')}, micro-batches a step: "
                    f"{r.get('micro_batches_per_step')}")
        out.append(f"| {r['pipeline']} | {r['side']} | {r['config']} | {r['resolution']} | {r['batch']} | "
                   f"{num(r.get('images_per_s'), '.3f')} | {num(r.get('median_step_s'), '.3f')} | "
                   f"{num(r.get('mfu'), '.1%')} | {mib_of(r, 'peak_allocated_bytes')} | "
                   f"{mib_of(r, 'peak_reserved_bytes')} | {mib_of(r, 'steady_peak_allocated_bytes')} | "
                   f"{num(r.get('trainable_params'), ',')} | {note} |")
    out += ["", "| pipeline | against | images/s ratio | peak allocated ratio | peak reserved ratio | "
            f"same LoRA | target (>= {TARGET_SPEED}x at no more peak) |", "|---|---|---|---|---|---|---|"]
    for v in result.get("verdicts", []):
        if v["met"] is None:
            out.append(f"| {v['pipeline']} | - | - | - | - | - | {v['why']} |")
            continue
        out.append(f"| {v['pipeline']} | {v['fastest_script_config']} | {v['speed_ratio']:.2f}x | "
                   f"{v['peak_allocated_ratio']:.2f}x | {num(v['peak_reserved_ratio'], '.2f')} | "
                   f"{'yes' if v['same_lora'] else 'NO'} | {'met' if v['met'] else 'MISSED'} |")
    return out + [""]


def main() -> None:
    """One or both contests alone (a lent machine's command is limited in time):
    ``python -m bench.gpu.image_peers --pipelines flux --out "$OUT"`` writes image_peers.json/.md."""
    import argparse

    from bench.docs.meta import stamp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pipelines", default="sdxl,flux", help="comma-separated: sdxl, flux")
    parser.add_argument("--smoke", action="store_true", help="tiny pipelines on a CPU (code-path check)")
    args = parser.parse_args()
    names = tuple(name.strip() for name in args.pipelines.split(",") if name.strip())
    unknown = [name for name in names if name not in ("sdxl", "flux")]
    if unknown or not names:
        parser.error(f"--pipelines: unknown {', '.join(unknown) or '(none given)'}; choose from sdxl, flux")
    result = check_image_peers(args.smoke, names)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "image_peers.json").write_text(json.dumps({"meta": stamp(), **result}, indent=1, default=str),
                                               encoding="utf-8")
    (args.out / "image_peers.md").write_text("\n".join(markdown(result)), encoding="utf-8")
    print("\n".join(markdown(result)))


if __name__ == "__main__":
    main()
