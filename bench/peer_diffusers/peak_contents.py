"""What lora_gui holds at its peak in the image peer bench's run, by the module and op that made it.

    python -m bench.peer_diffusers.peak_contents --pipeline sdxl            # lora_gui's defaults
    python -m bench.peer_diffusers.peak_contents --pipeline bundled-sd3 --switches

The run is the bench's (`bench.peer_diffusers.bench.lora_settings`: the image-demo preset with the
bench's resolution, batch, rank and steps) through the real engine, under the bench's tracker
(`launch.RealTracker`, real tensors only, source: tracker). Every storage the tracker counts is
recorded with the op that returned it, the module whose forward was running (``backward`` when
none was: the autograd engine's own allocations) and when it was born and freed, so the storages
alive at the run's peak can be listed afterwards. Storages created before the run (none here:
the run loads its own model) and those of the MFU probe (counted apart, see ``launch``) are not
in the table. Blocks that repeat are folded: ``down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k``
counts under ``down_blocks.N.attentions.N.transformer_blocks.N.attn2.to_k``.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import weakref
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.peer_diffusers import launch
from bench.peer_diffusers.bench import PIPELINES, build_pipelines, lora_settings

_DIGITS = re.compile(r"(?<=\.)\d+(?=\.|$)")


@dataclass
class Birth:
    """One counted storage: its bytes, where it was made, and when (tracker events) it lived."""

    nbytes: int
    op: str
    module: str
    born: int
    died: int | None = None


class RecordingTracker(launch.RealTracker):
    """The bench's tracker, keeping a :class:`Birth` for every storage it counts."""

    def __init__(self) -> None:
        super().__init__()
        self.births: list[Birth] = []
        self.events = 0
        self.peak_event = 0
        self.op = ""
        self.modules: list[str] = []  # the forwards running now, innermost last

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201 (dispatch API)
        self.op = func.overloadpacket.__name__  # aten.addmm.default -> addmm
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _count(self, storages: list[tuple[torch.UntypedStorage, int]]) -> None:
        for storage, nbytes in storages:
            self.events += 1
            birth = Birth(nbytes, self.op, self.modules[-1] if self.modules else "backward", self.events)
            self.births.append(birth)
            key = storage._cdata
            ref = weakref.ref(storage, lambda _r, k=key, b=birth: self._die(k, b))
            self._seen[key] = (nbytes, ref)
            self.live_bytes += nbytes
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes, self.peak_event = self.live_bytes, self.events

    def _die(self, key: int, birth: Birth) -> None:
        self._free(key, birth.nbytes)
        self.events += 1
        birth.died = self.events

    def live_at_peak(self) -> list[Birth]:
        p = self.peak_event
        return [b for b in self.births if b.born <= p and (b.died is None or b.died > p)]


def _module_names(tracker: RecordingTracker) -> Any:
    """Global forward hooks that keep ``tracker.modules`` (qualified names of the running forwards)
    for every module of a model as it is first seen; returns the hook handles."""
    names: dict[int, str] = {}

    def pre(module: nn.Module, _args: Any) -> None:
        if id(module) not in names:
            for name, sub in module.named_modules():
                names.setdefault(id(sub), name or type(module).__name__)
        tracker.modules.append(names.get(id(module), type(module).__name__))

    def post(_module: nn.Module, _args: Any, _out: Any) -> None:
        if tracker.modules:
            tracker.modules.pop()

    return (nn.modules.module.register_module_forward_pre_hook(pre),
            nn.modules.module.register_module_forward_hook(post, always_call=True))


def folded(name: str) -> str:
    """A module's name with block indices folded (``blocks.3.attn`` -> ``blocks.N.attn``)."""
    return _DIGITS.sub("N", name)


def table(live: list[Birth], top: int) -> list[str]:
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for b in live:
        groups[(folded(b.module), b.op)].append(b.nbytes)
    total = sum(b.nbytes for b in live)
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    lines = ["| module (blocks folded) | op | storages | bytes | share of the peak's tensors |",
             "|---|---|---|---|---|"]
    for (module, op), sizes in rows[:top]:
        lines.append(f"| `{module}` | `{op}` | {len(sizes)} | {sum(sizes):,} | {sum(sizes) / total:.1%} |")
    rest = sum(sum(s) for _, s in rows[top:])
    if rest:
        lines.append(f"| (the other {len(rows) - top} groups) | | | {rest:,} | {rest / total:.1%} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", choices=tuple(PIPELINES), default="sdxl")
    parser.add_argument("--switches", action="store_true", help="lora_gui with the scripts' memory switches")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (the peak is in a steady step)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--text-len", type=int, default=12)
    parser.add_argument("--top", type=int, default=20, help="groups to list")
    a = parser.parse_args()
    torch.set_num_threads(1)
    from lora_gui.engine.image.train import train_image
    from lora_gui.presets import load_config

    folder = Path(tempfile.mkdtemp(prefix="peak-contents-"))
    model = build_pipelines(folder / "models")[a.pipeline]
    settings = argparse.Namespace(resolution=a.resolution, batch=a.batch, steps=a.steps, lr=1e-3,
                                  rank=a.rank, text_len=a.text_len)
    cfg = load_config("image-demo", lora_settings(a.pipeline, model, settings, a.switches))
    tracker = RecordingTracker()
    launch._probe_apart(tracker)
    hooks = _module_names(tracker)
    try:
        with tracker:
            summary = train_image(cfg, folder / "run", overwrite=True, progress=False)
    finally:
        for hook in hooks:
            hook.remove()
    live = tracker.live_at_peak()
    weights = sum(b.nbytes for b in live if b.op == "set_")  # loaded from the safetensors files
    print(f"{a.pipeline}, lora_gui {'with the switches' if a.switches else 'defaults'}: peak "
          f"{tracker.peak_bytes:,} bytes (tracker, whole run; the engine's own step peak "
          f"{summary.get('peak_bytes'):,}); weights loaded from files {weights:,}, the rest "
          f"{tracker.peak_bytes - weights:,}")
    print("\n".join(table([b for b in live if b.op != "set_"], a.top)))


if __name__ == "__main__":
    main()
