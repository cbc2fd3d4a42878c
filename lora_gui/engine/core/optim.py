"""The optimizer of a run, shared by the text and image loops: AdamW or bitsandbytes' 8-bit AdamW.

AdamW keeps two float32 moments per trainable parameter (8 bytes/param). bitsandbytes' 8-bit
AdamW keeps them in 8 bits with a float32 absmax per 256-value block (2 + 8/256 bytes/param)
for tensors of at least 4,096 values; smaller tensors keep float32 moments
(``min_8bit_size``). The paged variant allocates its states in CUDA unified memory so the driver
can move them to CPU RAM under memory pressure; on a CPU it behaves like adamw8bit.
"""

from __future__ import annotations

import logging

import torch

from lora_gui.config import ConfigError, RunConfig, bitsandbytes_present, choices_of

log = logging.getLogger(__name__)
BNB_OPTIMIZERS = tuple(o for o in choices_of("optimizer") if "8bit" in o)  # bitsandbytes' own
INSTALL_HINT = "pip install bitsandbytes==0.50.2"


def make_optimizer(cfg: RunConfig, params: list[torch.nn.Parameter],
                   device: torch.device) -> tuple[torch.optim.Optimizer, str]:
    """Builds the run's optimizer over ``params`` (the trainable LoRA weights).

    Returns:
        (optimizer, the resolved name: adamw, adamw8bit or paged_adamw8bit).

    Raises:
        ConfigError: an 8-bit optimizer without bitsandbytes (says what to install).
    """
    choice = cfg.resolved_optimizer(device.type)
    if choice in BNB_OPTIMIZERS:
        if not bitsandbytes_present():
            raise ConfigError(f"optimizer: {choice} needs bitsandbytes ({INSTALL_HINT}); or use "
                              "optimizer: adamw")
        import bitsandbytes as bnb

        cls = bnb.optim.AdamW8bit if choice == "adamw8bit" else bnb.optim.PagedAdamW8bit
        return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay), choice
    # CPU: the fused kernel (one pass per tensor, no temporaries), about 10x faster than the
    # per-tensor loop torch picks for CPU tensors; the memory trace runs the same (quant.make_optimizer)
    fused = {"fused": True} if device.type == "cpu" else {}
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **fused), choice
