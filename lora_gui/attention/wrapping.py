"""Wrappers of transformers' attention functions that compose: each wraps a function once, in
whichever order they are applied (head groups, packed documents)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def already_wraps(fn: Callable[..., Any], marker: str) -> bool:
    """Whether ``fn`` or any function it wraps (its ``__wrapped__`` chain) carries ``marker``."""
    inner: Any = fn
    while inner is not None:
        if getattr(inner, marker, False):
            return True
        inner = getattr(inner, "__wrapped__", None)
    return False


def mark_wrapper(wrapper: Callable[..., Any], fn: Callable[..., Any], marker: str) -> Callable[..., Any]:
    """``wrapper`` marked with ``marker`` and pointing at ``fn`` (``__wrapped__``, its doc)."""
    setattr(wrapper, marker, True)
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper.__doc__ = fn.__doc__
    return wrapper
