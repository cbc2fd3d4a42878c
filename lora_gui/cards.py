"""GPU cards as they are sold, with the memory a run can use on each.

One list for every front end: ``plan --card`` on the CLI and the card pickers of the dashboard.
A card's ``total_bytes`` is the whole device memory the driver reports for it (nvidia-smi's
"Total", MiB); the plan then counts the CUDA context and every workspace inside that total, so a
card is compared with what the card really holds rather than with its decimal-GB label.
"""

from __future__ import annotations

from dataclasses import dataclass

from lora_gui.units import MIB


@dataclass(frozen=True)
class Card:
    """One GPU model.

    Attributes:
        name: the key users type (``--card rtx-4090``), lowercase.
        label: what the picker shows.
        total_bytes: device memory the driver reports (bytes).
    """

    name: str
    label: str
    total_bytes: int

    @property
    def total_gib(self) -> float:
        """Device memory in GiB (2**30 bytes)."""
        return self.total_bytes / 2**30


# nvidia-smi "Total" of each card, MiB (1 MiB = 2**20 bytes), as the driver reports it.
_CARDS_MIB = (
    ("8gb", "8 GB consumer card (RTX 3070 / 4060)", 8_188),
    ("12gb", "12 GB consumer card (RTX 3060 / 4070)", 12_282),
    ("16gb", "16 GB consumer card (RTX 4060 Ti / 4080)", 16_376),
    ("24gb", "24 GB consumer card (RTX 3090 / 4090)", 24_564),
    ("t4", "NVIDIA T4 16 GB", 15_360),
    ("l4", "NVIDIA L4 24 GB", 23_034),
    ("a100-40gb", "NVIDIA A100 40 GB", 40_960),
    ("a100-80gb", "NVIDIA A100 80 GB", 81_920),
    ("h100-80gb", "NVIDIA H100 80 GB", 81_559),
    ("h200", "NVIDIA H200 141 GB", 143_771),
)

CARDS: dict[str, Card] = {name: Card(name, label, mib * MIB) for name, label, mib in _CARDS_MIB}


def card_names() -> list[str]:
    """Every known card's key, in the order the pickers show them."""
    return list(CARDS)


def card_by_name(name: str) -> Card:
    """The card called ``name`` (case and surrounding spaces ignored).

    Raises:
        ValueError: an unknown name; the message lists the known cards.
    """
    key = name.strip().lower()
    if key not in CARDS:
        raise ValueError(f"unknown card {name!r}; known cards: {', '.join(CARDS)}")
    return CARDS[key]
