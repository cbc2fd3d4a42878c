"""Background memory sampler (default 2 Hz), every sample labelled with its source.

- ``nvml``: whole-device used/total bytes from NVIDIA's management library (nvidia-ml-py,
  imported as pynvml): what other processes and the CUDA context use too;
- ``cuda_allocator``: torch.cuda allocated / reserved / peak bytes of this process;
- ``tracker``: live tensor-storage bytes counted by our StorageTracker (the CPU stand-in);
- ``rss``: this process's resident set (``/proc/self/statm``), which includes Python and libraries.

The sampler only reads counters (no synchronisation with the GPU, no allocation in torch), so
it does not slow training measurably; ``bench/speed/monitor_overhead.py`` measures it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process in bytes (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


def _nvml_reader() -> Callable[[], dict[str, int]] | None:
    """A function that reads device 0's memory through NVML, or None where NVML is absent."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as err:  # no driver / no GPU: NVML raises its own error types
        log.debug("NVML unavailable: %s", err)
        return None

    def read() -> dict[str, int]:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {"nvml_used_bytes": int(info.used), "nvml_total_bytes": int(info.total)}

    return read


class MemoryMonitor:
    """Samples memory every ``interval_s`` seconds in a daemon thread and hands each sample on."""

    def __init__(self, sink: Callable[[dict[str, Any]], None], interval_s: float = 0.5,
                 live_bytes: Callable[[], int | None] | None = None) -> None:
        """Args:
            sink: called with each sample dict (e.g. RecordLog.append).
            interval_s: seconds between samples (0.25-0.5 = 2-4 Hz).
            live_bytes: the tracker's live-bytes reader on CPU runs (None while a step runs
                without the tracker: no tracker figure in that sample).
        """
        self.sink = sink
        self.interval_s = interval_s
        self.live_bytes = live_bytes
        self.nvml = _nvml_reader() if torch.cuda.is_available() else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0

    def sample(self) -> dict[str, Any]:
        """One sample: every source this machine has, each key naming its source."""
        out: dict[str, Any] = {"time": time.time(), "rss_bytes": rss_bytes()}
        if self.live_bytes is not None and (live := self.live_bytes()) is not None:
            out["tracker_live_bytes"] = live
        if torch.cuda.is_available():
            out["cuda_allocator_allocated_bytes"] = torch.cuda.memory_allocated()
            out["cuda_allocator_reserved_bytes"] = torch.cuda.memory_reserved()
            out["cuda_allocator_peak_bytes"] = torch.cuda.max_memory_allocated()
        if self.nvml is not None:
            out.update(self.nvml())
        return out

    def _take(self) -> None:
        try:
            self.sink(self.sample())
            self.samples += 1
        except Exception as err:  # a monitor must never take the run down
            log.warning("memory sample failed: %s", err)

    def _run(self) -> None:
        self._take()  # one at the start, then every interval, then one at the end (__exit__)
        while not self._stop.wait(self.interval_s):
            self._take()

    def __enter__(self) -> MemoryMonitor:
        self._thread = threading.Thread(target=self._run, daemon=True, name="memory-monitor")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._take()
