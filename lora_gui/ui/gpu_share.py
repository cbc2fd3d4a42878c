"""How several GPUs share a run, as the Train and Plan tabs ask it: a GPU count and one choice
(replicated, FSDP, FSDP with its shards in host memory), read into the planner's
:class:`~lora_gui.memory.predict.parallel.Parallel`, the same settings ``plan --world-size N
--fsdp [--offload]`` reads. No gradio here: the tabs build the widgets."""

from __future__ import annotations

from typing import Any

from lora_gui.config import ConfigError
from lora_gui.memory.predict.parallel import Parallel
from lora_gui.units import gb

REPLICATED = "Replicated (DDP)"
FSDP = "FSDP (frozen weights sharded)"
FSDP_OFFLOAD = "FSDP, shards in host memory (offload)"
CHOICES = (REPLICATED, FSDP, FSDP_OFFLOAD)
HELP = ("With several GPUs: every GPU holds the whole model (DDP), or FSDP splits the frozen "
        "weights over the GPUs (a 4-bit base too), optionally keeping them in host memory. "
        "Figures are per GPU.")


def parallel_from_form(gpus: Any, sharing: Any, field: str = "GPUs") -> Parallel:
    """The planner's Parallel for a GPU count and a sharing choice from a page.

    Raises:
        ConfigError: a count that is not a whole number >= 1, or a choice not in CHOICES (named).
    """
    count = 1 if gpus is None or gpus == "" else gpus  # an empty field: one GPU
    try:
        n = int(count)
        if n != float(count) or n < 1:
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{field}: {gpus!r} is not a whole number of GPUs (1 or more)") from None
    choice = sharing or REPLICATED
    if choice not in CHOICES:
        raise ConfigError(f"sharing over GPUs: {choice!r} is not one of {', '.join(CHOICES)}")
    fsdp = n > 1 and choice in (FSDP, FSDP_OFFLOAD)
    return Parallel(n, fsdp, fsdp and choice == FSDP_OFFLOAD)


def check_for_run(parallel: Parallel, task: str, quantization: str) -> None:
    """Refuses a sharing the run cannot use, before anything is planned or started.

    Raises:
        ConfigError: FSDP for a picture run, or over an int8 base (what to pick instead).
    """
    if not parallel.fsdp:
        return
    if task != "text":
        raise ConfigError(f"sharing over GPUs: FSDP shards text runs; a {task} run on "
                          f"{parallel.world_size} GPUs runs replicated (pick {REPLICATED})")
    if quantization == "int8":
        raise ConfigError("sharing over GPUs: FSDP cannot shard an int8 base (its row scales live "
                          f"outside the weights); use quantization nf4, or pick {REPLICATED}")


def predict_kwargs(parallel: Parallel) -> dict[str, Any]:
    """The keyword arguments of ``memory.predict.predict`` for ``parallel`` (as the CLI passes)."""
    return {"processes": parallel.world_size, "fsdp": parallel.fsdp, "offload": parallel.offload}


def parallel_note(parallel: Parallel, step: Any) -> str:
    """One line under a plan for several GPUs: what the figures are, and the host memory the
    offloaded shards take per machine (source: predicted). Empty for one GPU."""
    if parallel.world_size == 1:
        return ""
    text = f"Per GPU: {parallel.label()}."
    if parallel.offload:
        host = int(step.info.get("fsdp_offload_host_bytes", 0) or 0)
        text += (f" Host memory for the offloaded shards: **{gb(host)}** per machine, all "
                 f"{parallel.world_size} processes on one (source: predicted; not counted: loading, "
                 "each process's own memory).")
    return text
