"""Windowed (sliding-window + global-token) attention.

``windowed`` (pure torch) is imported eagerly; the transformers backend in ``hf`` is imported
on first use of one of its names, so code that only needs the kernels does not pay for
importing transformers.
"""

from __future__ import annotations

from typing import Any

from lora_gui.attention.windowed import IMPLS, WindowSpec, windowed_attention

_HF_NAMES = {
    "ATTENTION_NAME",
    "check_windowed_support",
    "configure_windowed",
    "enable_windowed_attention",
    "register_windowed_attention",
    "spec_from_config",
}

__all__ = ["IMPLS", "WindowSpec", "windowed_attention", *sorted(_HF_NAMES)]


def __getattr__(name: str) -> Any:
    if name in _HF_NAMES:
        from lora_gui.attention import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
