"""Runs one of diffusers' LoRA scripts (the unmodified copies in ``scripts/``) in this process,
measured the same way as lora_gui's run in bench/peer_diffusers:

    python -m bench.peer_diffusers.launch --script NAME --result OUT.json -- SCRIPT ARGS...

- peak: live tensor-storage bytes counted by ``lora_gui.memory.runtime.tracker`` around the
  script's whole ``main(args)`` (model loading, caches, training loop, saving);
- step times: a global optimizer-step hook (``register_optimizer_step_post_hook``)
  stamps every optimizer step (wall and process CPU seconds), so images/s is taken between the
  first and the last step;
- losses: what the script logs with ``accelerator.log`` (its own per-step loss).

torchvision: the scripts import ``torchvision.transforms``. The only torchvision wheel for torch
2.13 on the package index is the CUDA build, whose C++ extension (detection ops: nms, roi_align)
cannot load next to torch's CPU build, and whose ``_meta_registrations`` then fails on
``register_fake("torchvision::nms")``. :func:`allow_torchvision_without_ops` declares the two op
schemas that registration needs, so the pure-Python transforms import; no detection op is used.
torchvision is installed into a bench-only folder put on this subprocess's ``sys.path`` (see
bench/peer_diffusers/requirements.txt), never into the shared environment.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lora_gui.memory.runtime.tracker import MEMORY_SOURCE, StorageTracker

SCRIPTS = Path(__file__).resolve().parent / "scripts"
_KEEP: list[Any] = []  # keeps the torch.library.Library alive for the process


class RealTracker(StorageTracker):
    """The tracker, counting real tensors only: lora_gui's planner traces a step on fake tensors
    (no memory), which the plain tracker would count as live bytes. The scripts make none.
    ``paused``: storages made meanwhile are not counted (see :func:`_probe_apart`)."""

    paused = False
    probe_peak_bytes = 0  # live bytes + the machine-peak probe's own peak, at the probe

    def _new_storages(self, tensors):
        from torch._subclasses.fake_tensor import FakeTensor

        if self.paused:
            return []
        return super()._new_storages(t for t in tensors if isinstance(t, torch.Tensor)
                                     and not isinstance(t, FakeTensor) and t.device.type != "meta")


class NoTracker:
    """Speed-only runs (``--no-tracker``): no outer tracker at all, peaks not measured (0).
    lora_gui still runs its own built-in per-step tracker; the scripts have none."""

    peak_bytes = live_bytes = probe_peak_bytes = 0
    paused = False

    def __enter__(self) -> NoTracker:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


def allow_torchvision_without_ops() -> None:
    """Declares torchvision::nms / qnms (schemas as in torchvision's C++ registration) when its
    extension cannot load, so that ``import torchvision`` reaches the Python transforms."""
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        try:
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:  # already there: the extension did load
            pass
    _KEEP.append(lib)


def load_script(name: str):
    """The script as a module (its ``if __name__ == "__main__"`` block does not run)."""
    path = SCRIPTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"peer_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stamp_steps() -> tuple[list[float], list[float]]:
    """perf_counter() and process_time() of every optimizer step from now on (any torch.optim
    optimizer, 8-bit too). The process's CPU seconds leave out the time other processes of a
    loaded machine take the core away, which wall seconds count."""
    stamps: list[float] = []
    cpu: list[float] = []
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def stamp(*_: object) -> None:
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())

    register_optimizer_step_post_hook(stamp)
    return stamps, cpu


def _probe_apart(tracker: RealTracker) -> None:
    """lora_gui measures the machine's matmul peak (for MFU) with GEMM operands of up to 8192^2
    during its setup. Its bytes are counted apart: the run's peak is given with and without them."""
    from lora_gui.models import flops

    measure = flops.measure_gemm_peak

    def counted_apart(*args, **kwargs):
        tracker.paused = True
        try:
            with StorageTracker() as own:
                return measure(*args, **kwargs)
        finally:
            tracker.paused = False
            tracker.probe_peak_bytes = max(tracker.probe_peak_bytes, tracker.live_bytes + own.peak_bytes)

    flops.measure_gemm_peak = counted_apart


def run_lora(overrides: dict[str, Any], out: Path) -> dict[str, Any]:
    """One lora_gui image run through its real engine, under the same tracker and step stamps;
    also returns the engine's own peak (run.json) beside the outer tracker's."""
    from lora_gui.engine.image.train import train_image
    from lora_gui.presets import load_config

    cfg = load_config("image-demo", overrides)
    stamps, cpu = _stamp_steps()
    tracker = RealTracker()
    _probe_apart(tracker)
    start = time.perf_counter()
    with tracker:
        summary = train_image(cfg, out, overwrite=True, progress=False)
    total = time.perf_counter() - start
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if line.strip() and "loss" in json.loads(line)]
    return {"peak_bytes": max(tracker.peak_bytes, tracker.probe_peak_bytes),
            "peak_bytes_without_probe": tracker.peak_bytes, "memory_source": MEMORY_SOURCE,
            "stamps": stamps, "cpu_stamps": cpu, "losses": losses, "total_s": total,
            "engine_peak_bytes": summary.get("peak_bytes"),
            "steps": summary.get("steps"), "precision": summary.get("precision"),
            "switches": summary.get("switches")}


def run(name: str, argv: list[str]) -> dict[str, Any]:
    """Runs the script's main under the tracker; returns peak, step stamps and logged losses."""
    allow_torchvision_without_ops()
    import accelerate

    stamps, cpu = _stamp_steps()
    losses: list[float] = []
    original_log = accelerate.Accelerator.log

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None):
        for key in ("train_loss", "loss"):
            if key in values:
                losses.append(float(values[key]))
                break
        return original_log(self, values, step=step, log_kwargs=log_kwargs or {})

    accelerate.Accelerator.log = log
    module = load_script(name)
    args = module.parse_args(argv)
    module.args = args  # as the script's own __main__ block leaves it: some helpers read the global
    tracker = RealTracker()
    start = time.perf_counter()
    with tracker:
        module.main(args)
    total = time.perf_counter() - start
    return {"peak_bytes": tracker.peak_bytes, "peak_bytes_without_probe": tracker.peak_bytes,
            "memory_source": MEMORY_SOURCE, "stamps": stamps, "cpu_stamps": cpu, "losses": losses,
            "total_s": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", default=None, help="a script in scripts/ (without .py)")
    parser.add_argument("--lora", type=Path, default=None,
                        help="instead: a JSON file of lora_gui settings (image-demo preset + these)")
    parser.add_argument("--out", type=Path, default=None, help="lora_gui's run folder")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-tracker", action="store_true", help="speed only: no outer tracker")
    parser.add_argument("--no-builtin-tracker", action="store_true",
                        help="lora_gui without its own CPU step-peak tracker (a diagnosis, not how "
                             "users run it: its step peaks are then not measured)")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.no_tracker:
        global RealTracker
        RealTracker = NoTracker  # noqa: F811 (speed-only runs)
    if args.no_builtin_tracker:
        from bench.peers.tracker_cost import without_cpu_tracker

        without_cpu_tracker().__enter__()  # for the whole process: its one run
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    result = run_lora(json.loads(args.lora.read_text()), args.out) if args.lora else run(args.script, rest)
    args.result.write_text(json.dumps(result), encoding="utf-8")
    sys.exit(0)


if __name__ == "__main__":
    main()
