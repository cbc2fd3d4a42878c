"""The CPU each group of processes uses and the cores they run on, for the dashboard benches
(bench/ui/many_pages.py): CPU seconds read from /proc, a process's descendants, and the
dashboard and its run pinned to one CPU (sched_setaffinity), the browsers to the others. Linux."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

CLOCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (its children not included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK


def descendants(root: int) -> set[int]:
    """Every process below ``root`` (this bench's Playwright driver and its Chromium)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def cpu_use(groups: dict[str, set[int]], window: float) -> Callable[[], dict[str, float]]:
    """Starts timing the CPU of each group of processes; the returned call gives the cores each
    used on average since (processes alive at both ends)."""
    before = {name: {pid: cpu_seconds(pid) for pid in pids} for name, pids in groups.items()}

    def done() -> dict[str, float]:
        return {f"cpu_{name}": sum(cpu_seconds(pid) - t for pid, t in seen.items()) / window
                for name, seen in before.items()}
    return done


def pin(server_pid: int) -> None:
    """The dashboard (every thread it has, and those they start) on the last CPU, its run too
    once started (:func:`pin_run`); this process, Playwright's driver and Chromium (started after
    this) on the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    pin_threads(server_pid, {cpus[-1]})
    os.sched_setaffinity(0, set(cpus[:-1]))
    print(f"pinned: dashboard and run on CPU {cpus[-1]}, browsers on CPU {cpus[:-1]}", file=sys.stderr,
          flush=True)


def pin_run(run: Path, server_pid: int) -> str:
    """Every thread of the run's processes on the dashboard's CPUs (a run started detached does
    not keep the dashboard's affinity); returns the CPUs the run's main process may use."""
    from lora_gui.engine.core.lock import read_lock

    cpus = os.sched_getaffinity(server_pid)
    info = read_lock(run)
    if info is None:
        raise SystemExit(f"{run}: no run lock to pin")
    for pid in {info.pid} | descendants(info.pid):
        pin_threads(pid, cpus)
    return allowed_cpus(info.pid)


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (sched_setaffinity of a pid moves its main thread only)."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except OSError:
            continue


def allowed_cpus(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
