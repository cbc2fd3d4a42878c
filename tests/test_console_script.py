"""The `lora-gui` command as the set-up installs it (`pip install -e . --no-deps`, the Makefile's
venv step): installed into a fresh environment, it runs from a folder outside the checkout, and
so does `python -m lora_gui`."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120  # each command: a hung one is killed and fails the test


def _run(args: list, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


@pytest.mark.integration
def test_the_installed_command_runs_from_any_folder(tmp_path):
    pytest.importorskip("setuptools")  # the editable install builds with this environment's own
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env).check_returncode()
    python = venv / "bin" / "python"
    # the new environment sees this one's packages (torch, pip, setuptools...) but not the checkout
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     tmp_path, env).stdout.strip())
    (site / "_this_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    before = _run([python, "-m", "lora_gui", "--help"], elsewhere, env)
    assert before.returncode != 0 and "No module named lora_gui" in before.stderr  # not yet installed

    install = _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-e", ROOT], tmp_path, env)
    assert install.returncode == 0, install.stderr

    command = venv / "bin" / "lora-gui"
    shown = _run([command, "settings", "lora_rank"], elsewhere, env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("lora_rank\n") and "default: 8" in shown.stdout
    usage = _run([command, "train", "--help"], elsewhere, env)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: lora-gui train"), usage.stderr
    assert "'lora-gui settings' lists every setting" in " ".join(usage.stdout.split())
    bad = _run([command, "settings", "lora_rnk"], elsewhere, env)
    assert bad.returncode == 2 and "close: lora_rank" in bad.stderr
    module = _run([python, "-m", "lora_gui", "settings", "adapter"], elsewhere, env)
    assert module.returncode == 0 and "accepts: lora | dora | loha | lokr | oft" in module.stdout
    assert not any(elsewhere.iterdir())  # nothing written where it ran
