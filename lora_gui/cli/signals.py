"""Ctrl-C and SIGTERM for the commands that run for a while (train, compare, queue run)."""

from __future__ import annotations

import logging
import signal
import threading


def stop_on_signals(stop: threading.Event) -> None:
    """First Ctrl-C / SIGTERM asks the loop to checkpoint and stop; a second one kills. Under a
    launcher (several processes) every rank gets the terminal's Ctrl-C and the launcher's forwarded
    signal at once, so the handler stays: the launcher's own kill timeout is the hard stop."""
    from lora_gui.engine.core.distributed import launched_world_size

    launched = launched_world_size() > 1

    def handler(signum, _frame):
        if stop.is_set() and launched:
            return
        logging.getLogger("lora_gui").warning("signal %d: saving a checkpoint and stopping "
                                              "(press Ctrl-C again to abort at once)", signum)
        stop.set()
        if not launched:
            signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
