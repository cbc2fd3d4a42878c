"""GPU cards as they are sold, with the memory a run can use on each.

One list for every front end: ``plan --card`` on the CLI and the card pickers of the dashboard.
A card's ``total_bytes`` is the device memory PyTorch reports for it
(``torch.cuda.get_device_properties().total_memory``, a little below nvidia-smi's "Total"); the
plan counts the CUDA context and every workspace inside that total, so a run is compared with
what the card really holds rather than with its decimal-GB label.
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
        total_bytes: device memory torch reports (bytes, erring low).
    """

    name: str
    label: str
    total_bytes: int

    @property
    def total_gib(self) -> float:
        """Device memory in GiB (2**30 bytes)."""
        return self.total_bytes / 2**30


def _gib(value: float) -> int:
    """Bytes of a "GiB total capacity" figure printed with two decimals, rounded DOWN (the
    printed figure may be up to 0.005 GiB above the true one: erring low never says "fits" for
    memory the card does not have)."""
    return int((value - 0.005) * 2**30) // MIB * MIB


# What ``torch.cuda.get_device_properties(0).total_memory`` reports (bytes), the figure PyTorch
# prints as "GPU 0 has a total capacity of X GiB" in its out-of-memory message. It is below
# nvidia-smi's "Total" (H100 80GB HBM3: 81,559 MiB in nvidia-smi, 79.11 GiB = 81,009 MiB in
# torch; T4: 15,360 MiB vs 14.56 GiB = 14,909 MiB). Each value is the LOWEST such figure found
# in public out-of-memory reports for that class of card (source beside it); where none was
# found it is nvidia-smi's total less 600 MiB (the largest gap above, rounded up).
_CARDS = (
    # RTX 2070/3070-class 8 GB: "7.79 GiB total capacity" (ryujaehun/pytorch-gpu-benchmark#1)
    ("8gb", "8 GB consumer card (RTX 3070 / 4060)", _gib(7.79)),
    # 12 GB: "total capacity of 11.60 GiB" (index-tts/index-tts#301, a 12 GB RTX 4080 laptop;
    # a desktop RTX 3060 reports 11.76 GiB, TencentARC/PhotoMaker#47)
    ("12gb", "12 GB consumer card (RTX 3060 / 4070)", _gib(11.60)),
    # 16 GB: "total capacity of 15.61 GiB" (RTX A4000, DengKaiCQ/VGGT-Long#6)
    ("16gb", "16 GB consumer card (RTX 4060 Ti / 4080)", _gib(15.61)),
    # 24 GB: "total capacity of 23.61 GiB" (RTX 4090, pinokiofactory/flux-webui#11; others
    # report 23.64-23.68 GiB)
    ("24gb", "24 GB consumer card (RTX 3090 / 4090)", _gib(23.61)),
    # T4: "total capacity of 14.56 GiB" (Zheng-Chong/CatVTON#133, AlphaGPU/leetgpu-challenges#52)
    ("t4", "NVIDIA T4 16 GB", _gib(14.56)),
    # L4: no report found; nvidia-smi's 23,034 MiB less 600 MiB
    ("l4", "NVIDIA L4 24 GB", (23_034 - 600) * MIB),
    # L40S 48GB (ECC on): "total capacity of 44.53 GiB" (Wan-Video/Wan2.1#205)
    ("l40s", "NVIDIA L40S 48 GB", _gib(44.53)),
    # A100 40GB: "total capacity of 39.50 GiB" (TianheWu/CoSeR#10)
    ("a100-40gb", "NVIDIA A100 40 GB", _gib(39.50)),
    # A100 80GB: "79.25 GiB total capacity" (levihsu/OOTDiffusion#235)
    ("a100-80gb", "NVIDIA A100 80 GB", _gib(79.25)),
    # H100 80GB HBM3: "total capacity of 79.11 GiB" (vllm-project/vllm#27508,
    # NVIDIA-NeMo/RL#2814)
    ("h100-80gb", "NVIDIA H100 80 GB", _gib(79.11)),
    # H200: measured on a lent H200 (driver 580, torch 2.11 + CUDA 13.0, bench/gpu/check.py);
    # nvidia-smi shows 143,771 MiB, 615 MiB of which the driver keeps (NVML v2 "reserved")
    ("h200", "NVIDIA H200 141 GB", 150_109_880_320),
)

CARDS: dict[str, Card] = {name: Card(name, label, nbytes) for name, label, nbytes in _CARDS}


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
