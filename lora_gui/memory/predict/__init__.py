"""Memory prediction (source: predicted): one public call per question.

- :func:`predict` (cfg, budget, device) -> :class:`Prediction`: the run's own plan, the one
  function the CLI's ``plan``, the dashboard's Plan, Train and Compare tabs and the run itself
  use (text, UNet and DiT; see :mod:`lora_gui.memory.predict.run`).
- :func:`estimate`: the instant closed-form estimate a form shows while :func:`predict` works.
- :func:`longest`: the longest sequence (text) or largest resolution and batch (image) that
  fits a budget, with the switches it needs.
"""

from lora_gui.memory.predict.run import Prediction, estimate, longest, predict, run_device

__all__ = ["Prediction", "estimate", "longest", "predict", "run_device"]
