"""What made a results file: the commit and the planner fingerprint, read from git.

The planner fingerprint is :func:`bench.gpu.plans.planner_fingerprint`'s hash (the source of
``lora_gui/memory/predict`` and ``lora_gui/models``, whose layers the traces run), here computed
for any commit from git's objects, so a results file's recorded fingerprint can be checked against
the commit it names: a fingerprint that no commit has is a plan made from uncommitted code.
"""

from __future__ import annotations

import hashlib
import subprocess
from functools import cache
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
PLANNED_BY = ("lora_gui/memory/predict", "lora_gui/models")  # as bench.gpu.plans._PLANNED_BY


def _git(*args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], input=data, capture_output=True,
                          check=True).stdout


def has_git() -> bool:
    """Whether this checkout has its history (a tarball or a shallow copy may not)."""
    try:
        _git("rev-parse", "--verify", "HEAD")
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


def head_commit() -> str:
    """The checked-out commit, with ``+dirty`` when the planner's files differ from it."""
    commit = _git("rev-parse", "HEAD").decode().strip()
    dirty = _git("status", "--porcelain", "--", *PLANNED_BY).strip()
    return commit + ("+dirty" if dirty else "")


def _digest(files: list[tuple[str, bytes]]) -> str:
    digest = hashlib.sha256()
    # bench.gpu.plans sorts Path objects, which compare by their parts: sort the same way
    for rel, body in sorted(files, key=lambda f: PurePosixPath(f[0]).parts):
        digest.update(rel.encode() + b"\0" + body)
    return digest.hexdigest()[:16]


@cache
def fingerprint_at(commit: str) -> str:
    """The planner fingerprint of the code at ``commit`` (the same hash as the working tree's
    :func:`bench.gpu.plans.planner_fingerprint` when the tree is that commit)."""
    listing = _git("ls-tree", "-r", "--format=%(objectname) %(path)", commit, "--", *PLANNED_BY)
    entries = [line.split(" ", 1) for line in listing.decode().splitlines() if line.endswith(".py")]
    if not entries:
        return ""
    batch = _git("cat-file", "--batch", data="".join(f"{sha}\n" for sha, _ in entries).encode())
    files, at = [], 0
    for _, path in entries:
        header_end = batch.index(b"\n", at)
        size = int(batch[at:header_end].split()[2])
        body = batch[header_end + 1:header_end + 1 + size]
        at = header_end + 1 + size + 1
        files.append((path.removeprefix("lora_gui/"), body))
    return _digest(files)


def working_fingerprint() -> str:
    """The planner fingerprint of the files on disk (bench.gpu.plans.planner_fingerprint's hash,
    without importing torch)."""
    package = ROOT / "lora_gui"
    files = [(path.relative_to(package).as_posix(), path.read_bytes())
             for folder in PLANNED_BY for path in (ROOT / folder).rglob("*.py")]
    return _digest(files)


def stamp() -> dict[str, str]:
    """``{"commit", "planner"}`` for a results file written now from this working tree: the
    commit checked out (``+dirty`` when the planner's files differ from it) and the planner
    fingerprint of the files on disk."""
    return {"commit": head_commit() if has_git() else "unknown", "planner": working_fingerprint()}


def with_stamp(rows: object) -> dict[str, object]:
    """A results file's body: ``{"meta": stamp(), "rows": rows}``."""
    return {"meta": stamp(), "rows": rows}
