"""Byte units, one definition for every module.

Every memory figure a user reads is in decimal GB (10^9 bytes): budgets are typed in GB (the
``budget_gb`` setting, ``--budget-gb``) and cards are sold in GB, so the budget field, the card
picker, the verdict, the charts and the CLI all speak the same unit. ``--budget-gib`` stays as an
input for people who read ``torch.cuda.mem_get_info`` in GiB; what is printed back is GB.
"""

from __future__ import annotations

import math

GB = 1e9  # bytes in a decimal gigabyte (budget_gb, --budget-gb, every figure shown)
MIB = 2**20  # bytes in a mebibyte (the allocator's own sizes, kept in code comments)
GIB = 2**30  # bytes in a gibibyte (--budget-gib)


def gb_decimals(value_gb: float) -> int:
    """Decimals that keep three significant digits below 1 GB (0.118, 0.0419) and two from 1 GB
    up (11.10, 25.35), so a demo run of 117 MiB and an 80 GB card read on one scale."""
    if value_gb <= 0 or not math.isfinite(value_gb) or value_gb >= 1:
        return 2
    return min(9, 2 - math.floor(math.log10(value_gb)))


def gb_value(nbytes: float) -> float:
    """``nbytes`` in GB, rounded as :func:`gb` prints it (a table's number column)."""
    value = nbytes / GB
    return round(value, gb_decimals(abs(value)))


def gb(nbytes: float | None, unit: bool = True) -> str:
    """A memory figure as people read it here: '0.118 GB', '11.10 GB', '—' when unknown."""
    if nbytes is None:
        return "—"
    value = nbytes / GB
    text = f"{value:,.{gb_decimals(abs(value))}f}"
    return f"{text} GB" if unit else text
