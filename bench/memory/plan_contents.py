"""What a planned image step holds at its peak, by the module and op that made each tensor.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.memory.plan_contents flux.1-dev --resolution 1024
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.memory.plan_contents sdxl-unet --resolution 1024 \
        --targets to_q,to_k,to_v,to_out.0,ff.net.2

The planner's own trace (source: predicted; one LoRA step on fake tensors, CUDA, bf16 weights under
CUDA's autocast, SDPA, float32 adapters; the scripts' default targets unless ``--targets``), with
its tracker recording the running module and the op for every storage it counts; the storages
alive at the trace's peak, other than weights, adapters and optimizer state, are grouped by
module (blocks folded: ``transformer_blocks.N.ff.net.N.proj``) and op. The same read as
``bench.peer_diffusers.peak_contents`` gives of a real run, for a model too large to run here.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from bench.peer_diffusers.peak_contents import folded
from lora_gui.memory.predict import trace as trace_module
from lora_gui.memory.predict import trace_result
from lora_gui.memory.predict import trace_step as step_module  # where a traced step makes its tracker
from lora_gui.memory.predict.dit_trace import trace_dit_step
from lora_gui.memory.predict.model_configs import is_unet_config, load_model_config

MiB = 2**20
KEPT_APART = ("frozen_weights", "lora_params", "optimizer_state")  # listed as totals only


class _Where:
    """The module whose forward runs now and the op being dispatched, for the recording tracker."""

    modules: list[str] = []
    op = ""
    names: dict[int, str] = {}


def _recording_tracker(made: dict[int, tuple[str, str]], found: list[Any]) -> type:
    base = trace_module._PhaseTracker

    class Recording(base):
        def __init__(self) -> None:
            super().__init__()
            found.append(self)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201 (dispatch API)
            _Where.op = func.overloadpacket.__name__
            return trace_result.track_op(self, func, types, args, kwargs)

        def _count(self, storages: list[Any]) -> None:
            first = len(self.records)
            super()._count(storages)
            where = _Where.modules[-1] if _Where.modules else self.phase
            for rec in self.records[first:]:
                made[id(rec)] = (where, _Where.op)

    return Recording


def _pre(module: nn.Module, _args: Any) -> None:
    if id(module) not in _Where.names:
        for name, sub in module.named_modules():
            _Where.names.setdefault(id(sub), name or type(module).__name__)
    _Where.modules.append(_Where.names.get(id(module), type(module).__name__))


def _post(_module: nn.Module, _args: Any, _out: Any) -> None:
    if _Where.modules:
        _Where.modules.pop()


def contents(model: str, resolution: int, batch: int, targets: list[str] | None) -> tuple[Any, dict]:
    """The trace's result and {(folded module, op): [bytes of each storage alive at the peak]}."""
    made: dict[int, tuple[str, str]] = {}
    found: list[Any] = []
    _Where.modules, _Where.names = [], {}  # a model of this call only (ids are reused)
    shipped = step_module._PhaseTracker
    step_module._PhaseTracker = _recording_tracker(made, found)
    hooks = (nn.modules.module.register_module_forward_pre_hook(_pre),
             nn.modules.module.register_module_forward_hook(_post, always_call=True))
    try:
        kwargs: dict[str, Any] = {"resolution": resolution, "batch_size": batch, "dtype": torch.bfloat16,
                                  "device": "cuda"}
        if targets:
            kwargs["target_modules"] = targets
        trace = trace_module.trace_unet_step if is_unet_config(load_model_config(model)) else trace_dit_step
        result = trace(model, **kwargs)
    finally:
        step_module._PhaseTracker = shipped
        for hook in hooks:
            hook.remove()
    tracker = found[-1]  # the measured step's (a trace builds one)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for rec in tracker.live_at_peak():
        if rec.category not in KEPT_APART:
            module, op = made.get(id(rec), ("?", "?"))
            groups[(folded(module.removeprefix("base_model.model.")), op)].append(rec.nbytes)
    return result, groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a bundled config (flux.1-dev, sd3.5-medium, sdxl-unet, sd15-unet) "
                                      "or a path")
    parser.add_argument("--resolution", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--targets", default="", help="LoRA targets, comma-separated (default: the scripts')")
    parser.add_argument("--top", type=int, default=25)
    a = parser.parse_args()
    torch.set_num_threads(1)
    targets = [t for t in a.targets.split(",") if t] or None
    result, groups = contents(a.model, a.resolution, a.batch, targets)
    total = sum(sum(v) for v in groups.values())
    print(f"{a.model}, {a.resolution} px x {a.batch}: planned peak {result.peak_bytes / MiB:,.0f} MiB; "
          + ", ".join(f"{k} {v / MiB:,.0f}" for k, v in result.breakdown.items()) + " MiB")
    print("\n| module (blocks folded) | op | storages | MiB | share |")
    print("|---|---|---|---|---|")
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    for (module, op), sizes in rows[:a.top]:
        print(f"| `{module}` | `{op}` | {len(sizes)} | {sum(sizes) / MiB:,.1f} | {sum(sizes) / total:.1%} |")
    rest = sum(sum(s) for _, s in rows[a.top:])
    print(f"| (the other {max(0, len(rows) - a.top)} groups) | | | {rest / MiB:,.1f} | {rest / total:.1%} |")


if __name__ == "__main__":
    main()
