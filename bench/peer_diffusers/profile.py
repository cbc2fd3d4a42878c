"""Where a step's time goes: cProfile of optimizer steps 6-24 of one side of the image peer bench.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python -m bench.peer_diffusers.profile --pipeline flux
    ... --side script        (needs bench/.peer_deps on PYTHONPATH, as the bench's own runs)

lora_gui runs its defaults with its built-in CPU tracker not entered (``--tracker`` keeps it), so
the profile is of the step itself; the script runs as its users run it. Prints the seconds of the
19 profiled steps and the functions with the most cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from bench.peer_diffusers import bench, launch

FIRST, LAST = 6, 25  # the hook counts steps after they finish: steps 6..24 are profiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", choices=list(bench.PIPELINES), default="flux")
    parser.add_argument("--side", choices=("lora_gui", "script"), default="lora_gui")
    parser.add_argument("--tracker", action="store_true", help="lora_gui: keep its built-in CPU tracker")
    parser.add_argument("--rows", type=int, default=40)
    a = parser.parse_args()
    torch.set_num_threads(1)
    opts = argparse.Namespace(resolution=64, batch=4, steps=24, lr=1e-3, rank=4, text_len=12)
    profile, count, times = cProfile.Profile(), [0], {}

    def hook(*_: object) -> None:
        count[0] += 1
        if count[0] == FIRST:
            times["start"] = time.perf_counter()
            profile.enable()
        elif count[0] == LAST:
            profile.disable()
            times["end"] = time.perf_counter()

    folder = Path(tempfile.mkdtemp(prefix="peer-profile-"))
    model = bench.build_pipelines(folder / "models")[a.pipeline] if a.pipeline != "bundled-sd3" \
        else bench.DRAWING
    launch.RealTracker = launch.NoTracker
    register_optimizer_step_post_hook(hook)
    if a.side == "lora_gui":
        if not a.tracker:
            from lora_gui.memory.runtime.meter import PeakMeter

            PeakMeter.__enter__ = lambda self: self
            PeakMeter.__exit__ = lambda self, *exc: None
        launch.run_lora(bench.lora_settings(a.pipeline, model, opts, False), folder / "run")
    else:
        data = bench.image_folder(folder / "stars")
        launch.run(bench.PIPELINES[a.pipeline][0],
                   bench.script_args(a.pipeline, model, data, folder / "run", opts, False))
    print(f"{a.pipeline} {a.side}: steps {FIRST}-{LAST - 1} in {times['end'] - times['start']:.3f} s "
          "(under cProfile)")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(a.rows)


if __name__ == "__main__":
    main()
