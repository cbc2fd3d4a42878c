"""Host (CPU) memory for tensors kept off the accelerator: how much there is, and whether it is enough.

Offloaded checkpoints and host-side embeddings live in host RAM; a plan that needs more than the
machine has would swap or be killed by the out-of-memory killer, so it is refused with both
figures (source: psutil's ``available``, else ``MemAvailable`` in /proc/meminfo).
"""

from __future__ import annotations

from pathlib import Path

from lora_gui.config import ConfigError
from lora_gui.units import gb


def host_available_bytes() -> int | None:
    """Host memory available to new allocations now (bytes), None when it cannot be read."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file says kB (KiB)
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_host_memory(need_bytes: int, available_bytes: int | None, what: str) -> None:
    """Refuses a plan whose host-side tensors need more host memory than is available.

    Args:
        need_bytes: host bytes the plan keeps (offloaded checkpoints, host embeddings).
        available_bytes: host memory available (None: unknown, nothing is refused).
        what: what needs it, for the message.

    Raises:
        ConfigError: naming both figures.
    """
    if available_bytes is not None and need_bytes > available_bytes:
        raise ConfigError(f"{what} need {gb(need_bytes)} of host memory; "
                          f"{gb(available_bytes)} is available")
