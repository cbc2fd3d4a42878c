"""Shared fixtures: everything on CPU, offline, small."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download; an HF id must fail fast
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the planner's step-time calibrations go to a folder of this test process (and the processes its
# tests start), never the user's ~/.cache: a plan must not depend on what an earlier run measured
_CACHE = tempfile.mkdtemp(prefix="lora-gui-test-cache-")
atexit.register(shutil.rmtree, _CACHE, True)
os.environ.setdefault("LORA_GUI_CACHE_DIR", _CACHE)


def _share_cores_between_test_processes() -> None:
    """Under pytest-xdist (`make test` runs one test process per core): each process runs torch,
    and the processes it starts, on its share of the cores. torch's default of one thread per
    core in every test process would put N x N busy threads on N cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = str(max(1, cores // workers))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = threads
    import torch

    torch.set_num_threads(int(threads))


_share_cores_between_test_processes()

from lora_gui.config import BUILTIN_MODEL_DIR  # noqa: E402


@pytest.fixture(scope="session")
def builtin_model_dir() -> Path:
    assert (BUILTIN_MODEL_DIR / "model.safetensors").is_file(), "run python -m lora_gui.models.build_base"
    return BUILTIN_MODEL_DIR


@pytest.fixture()
def small_corpus(tmp_path: Path) -> Path:
    """40 variable-length documents in the .txt format (blank-line separated)."""
    words = "to be or not that is the question whether tis nobler in mind suffer".split()
    docs = []
    for i in range(40):
        n = 3 + (i * 7) % 60
        docs.append(" ".join(words[(i + j) % len(words)] for j in range(n)))
    path = tmp_path / "small.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path



def cmp_row(question, data, mode, n, peak, speed=None, status="ok"):
    return {"question": question, "data": data, "mode": mode, "seq_len": n, "peak_bytes": peak,
            "memory_source": "tracker", "real_tokens_per_s": speed, "status": status,
            "eval_loss": 3.0, "batch_size": 8}


# rows of a compare.json for the chart and Compare-tab tests
COMPARE_ROWS = [cmp_row("memory", "full", "traditional", 512, 400 * 10**6),
                cmp_row("memory", "full", "strong_baseline", 512, 300 * 10**6),
                cmp_row("memory", "full", "optimized", 512, 100 * 10**6),
                cmp_row("memory", "full", "ablation:sdpa", 512, 300 * 10**6),
                cmp_row("memory", "full", "ablation:loss_chunk", 512, 250 * 10**6),
                cmp_row("memory", "full", "traditional", 1024, None, status="oom"),
                cmp_row("memory", "full", "optimized", 1024, 150 * 10**6),
                cmp_row("speed", "full", "traditional", 512, 400 * 10**6, speed=100.0),
                cmp_row("speed", "full", "optimized", 512, 390 * 10**6, speed=250.0)]


@pytest.fixture()
def compare_rows() -> list[dict]:
    return [dict(r) for r in COMPARE_ROWS]
