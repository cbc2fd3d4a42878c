"""One side of the GPU check's ``image_peers`` section in a process of its own: one of diffusers'
LoRA scripts (the unmodified copies in bench/peer_diffusers/scripts) or one lora_gui image run,
measured the same way (bench/gpu/image_peers.py starts it and reads its result file):

    python -m bench.gpu.image_peer_run --result R.json --warmup 3 --script NAME -- SCRIPT ARGS...
    python -m bench.gpu.image_peer_run --result R.json --warmup 3 --lora SETTINGS.json --out RUN

- step times: a global optimizer-step hook (any torch.optim optimizer, 8-bit Adam included)
  synchronizes the device and stamps each step, so a step's time is the gap between two stamps;
- peaks (CUDA): ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the whole
  process (loading, caching, training) and over the steps after the warm-up ones; source
  ``cuda_allocator``. lora_gui's step meter resets the peak statistics every step, so every
  reset (its and this module's) first folds the peaks so far into both maxima: no peak is lost.
  On a CPU (smoke mode): the whole run's live tensor bytes from lora_gui's tracker (source
  ``tracker``);
- trainable parameters: the first step's optimizer parameters, so both sides' LoRA can be compared.

A script stops right after its last optimizer step is measured (its saving and its final
pipeline reload spend device time, not training); a lora_gui run ends as it always does.
A script that runs out of device memory returns ``out_of_memory: true`` rather than failing.
Allocator settings: a lora_gui run gets expandable segments as its CLI gives them; a script runs
with PyTorch's default unless the user set ``PYTORCH_CUDA_ALLOC_CONF`` (the row says which).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch


class StepsDone(Exception):
    """Raised by the step hook after a script's last measured step."""


class StepMeter:
    """Stamps every optimizer step (seconds, after a device synchronize) and keeps the peaks
    (bytes): the whole process's and the steady steps' (after ``warmup`` steps)."""

    def __init__(self, warmup: int, stop_after: int | None) -> None:
        self.warmup, self.stop_after = warmup, stop_after
        self.stamps: list[float] = []
        self.trainable_params: int | None = None
        self.whole = [0, 0]  # allocated, reserved
        self.steady: list[int] | None = None  # from the last warm-up step on
        self.cuda = torch.cuda.is_available()
        self._reset = torch.cuda.reset_peak_memory_stats

    def install(self) -> Any:
        """Hooks every optimizer's steps (and, on CUDA, the peak resets); returns the hook's handle."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(self._on_step)
        if self.cuda:
            def folded_reset(*args: Any, **kwargs: Any) -> None:
                self.fold()
                self._reset(*args, **kwargs)

            torch.cuda.reset_peak_memory_stats = folded_reset
            torch.cuda.memory.reset_peak_memory_stats = folded_reset
        return handle

    def fold(self) -> None:
        """The peaks since the last reset, into the whole run's and (once started) the steady ones."""
        if not self.cuda:
            return
        now = [torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]
        self.whole = [max(a, b) for a, b in zip(self.whole, now, strict=True)]
        if self.steady is not None:
            self.steady = [max(a, b) for a, b in zip(self.steady, now, strict=True)]

    def _on_step(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        from torch._subclasses.fake_tensor import FakeTensor

        params = [p for g in optimizer.param_groups for p in g["params"]]
        if any(isinstance(p, FakeTensor) or p.device.type == "meta" for p in params):
            return  # lora_gui's planner tracing a step on fake tensors: not a training step
        if self.cuda:
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())
        if self.trainable_params is None:
            self.trainable_params = sum(p.numel() for p in params)
        if self.cuda and len(self.stamps) == self.warmup:  # the steady steps' peaks start here
            self.fold()
            self.steady = [0, 0]
            self._reset()
        if self.stop_after is not None and len(self.stamps) >= self.stop_after:
            raise StepsDone

    def result(self) -> dict[str, Any]:
        self.fold()
        steady = self.steady or [None, None]
        return {"stamps": self.stamps, "trainable_params": self.trainable_params,
                "steady_peak_allocated_bytes": steady[0], "steady_peak_reserved_bytes": steady[1]}


def run_script(name: str, argv: list[str], meter: StepMeter) -> dict[str, Any]:
    """The script's own parse_args and main (with the module-level ``args`` its __main__ sets)."""
    from bench.peer_diffusers.launch import allow_torchvision_without_ops, load_script

    allow_torchvision_without_ops()
    module = load_script(name)
    args = module.parse_args(argv)
    module.args = args
    try:
        module.main(args)
    except StepsDone:
        pass
    return {}


def run_lora(settings: dict[str, Any], out: Path) -> dict[str, Any]:
    """One lora_gui image run through its engine; its run.json figures and each step's useful
    FLOPs (the engine's own count, metrics.jsonl) come back with the row."""
    from lora_gui.engine.image.train import train_image
    from lora_gui.presets import load_config

    cfg = load_config("image-demo", settings)
    summary = train_image(cfg, out, overwrite=True, progress=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    steps = [r for r in records if "loss" in r]
    return {"step_flops": [r.get("flops") for r in steps], "step_images": [r.get("images") for r in steps],
            "engine": {k: summary.get(k) for k in ("peak_bytes", "memory_source", "predicted_peak_bytes",
                                                   "images_per_s", "mfu", "precision", "switches")},
            "micro_batches_per_step": sorted({r["micro_batches"] for r in steps if r.get("micro_batches")})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--warmup", type=int, default=3, help="optimizer steps before the steady ones")
    parser.add_argument("--steps", type=int, default=None, help="a script stops after this many steps")
    parser.add_argument("--script", default=None, help="a script in bench/peer_diffusers/scripts (no .py)")
    parser.add_argument("--lora", type=Path, default=None, help="instead: lora_gui settings (JSON)")
    parser.add_argument("--out", type=Path, default=None, help="lora_gui's run folder")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    meter = StepMeter(args.warmup, args.steps if args.script else None)
    meter.install()
    if args.lora:  # as lora_gui's CLI starts a run: expandable segments unless the user set the allocator
        from lora_gui.memory.runtime.alloc_conf import use_expandable_segments

        use_expandable_segments()
    row: dict[str, Any] = {"out_of_memory": False, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    tracker = None
    if not torch.cuda.is_available():  # smoke on a CPU: the tracker's whole-run peak
        from bench.peer_diffusers.launch import RealTracker

        tracker = RealTracker()
        tracker.__enter__()
    start = time.perf_counter()
    try:
        if args.lora:
            row |= run_lora(json.loads(args.lora.read_text(encoding="utf-8")), args.out)
        else:
            rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
            row |= run_script(args.script, rest, meter)
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not isinstance(err, torch.OutOfMemoryError) and "out of memory" not in str(err):
            raise  # a failure, not the device's memory: the row gets the traceback from the parent
        row |= {"out_of_memory": True, "error": traceback.format_exc(limit=2)[-2000:]}
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
    row["total_s"] = time.perf_counter() - start
    row |= meter.result()
    if tracker is None:
        row |= {"peak_allocated_bytes": meter.whole[0], "peak_reserved_bytes": meter.whole[1],
                "memory_source": "cuda_allocator"}
    else:
        row |= {"peak_allocated_bytes": tracker.peak_bytes, "peak_reserved_bytes": None,
                "memory_source": "tracker"}
    args.result.write_text(json.dumps(row), encoding="utf-8")
    sys.exit(0)


if __name__ == "__main__":
    main()
