"""Runs ``python -m lora_gui`` with one fault injected, for the fault suite's subprocess cases.

Usage: ``python tests/faults/inject.py [lora_gui CLI arguments]`` with environment variables:

- ``FAULT_STEP_DELAY_S``: sleep this long after every optimizer step (so a test can act mid-run).
- ``FAULT_KILL_IN_CHECKPOINT``: SIGKILL this process while it writes the checkpoint of that step
  (after the adapter file is written, before the checkpoint is complete).

Test-only: the product has no fault hooks of its own.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root


def _install() -> None:
    from lora_gui.engine.core import checkpoint
    from lora_gui.engine.text import train

    delay = float(os.environ.get("FAULT_STEP_DELAY_S", "0"))
    if delay:
        real_step = train._one_step

        def slow_step(*args, **kwargs):
            record = real_step(*args, **kwargs)
            time.sleep(delay)
            return record

        train._one_step = slow_step
    kill_at = os.environ.get("FAULT_KILL_IN_CHECKPOINT")
    if kill_at:
        real_save_file = checkpoint.save_file

        def save_then_die(tensors, path, *args, **kwargs):
            real_save_file(tensors, path, *args, **kwargs)
            if f"step-{int(kill_at):08d}" in str(path):
                os.kill(os.getpid(), signal.SIGKILL)

        checkpoint.save_file = save_then_die


if __name__ == "__main__":
    _install()
    from lora_gui.cli import main

    sys.exit(main(sys.argv[1:]))
