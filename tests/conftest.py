"""Shared fixtures: everything on CPU, offline, small."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download; an HF id must fail fast
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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
