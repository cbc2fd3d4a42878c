"""The adapter and the frozen base it trains on: LoRA and its variants, their initialisation, the
quantized base and the optimizer's state format. Two groups of :class:`lora_gui.config.RunConfig`'s
fields and the checks that refuse a combination peft or bitsandbytes cannot run."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from lora_gui.options import TEXT, ConfigError, option

ADAPTERS = ("lora", "dora", "loha", "lokr", "oft")  # lora_gui.models.adapters
IMAGE_ADAPTERS = ADAPTERS[:4]  # OFT's blocks are not offered for UNet / DiT layers
LORA_INITS = ("default", "gaussian", "pissa", "olora", "loftq", "eva", "corda")
DATA_INITS = ("eva", "corda")  # lora_init that reads a few batches of the run's data first
TEXT_QUANTIZATIONS = ("none", "nf4", "int8")  # bitsandbytes' layers in a text decoder
VIDEO_QUANTIZATIONS = ("none", "fp8")  # diffusers' layerwise casting (lora_gui.models.video_quant)
QUANTIZATION_CHOICES = (*TEXT_QUANTIZATIONS, "fp8")


def bitsandbytes_present() -> bool:
    """True when the bitsandbytes package can be imported (8-bit optimizers, nf4 / int8 weights)."""
    return importlib.util.find_spec("bitsandbytes") is not None


@dataclass
class QuantizationSettings:
    """The frozen base's storage and the optimizer's states (mixed into RunConfig, whose ``task``
    and ``mode`` resolved_optimizer reads)."""

    # -- quantized base and 8-bit optimizer states (bitsandbytes) ------------------------------
    quantization: str = option("none", "Store the frozen base weights in fewer bytes; LoRA trains on "
                               "top in the compute dtype. Text: nf4 (4-bit NormalFloat, QLoRA, about "
                               "0.56 bytes/weight) or int8 (about 1.0), needs bitsandbytes. Video: fp8 "
                               "(1 byte/weight, each layer brought back to the compute dtype while it "
                               "runs; norms and embeddings stay as they are; saves memory with "
                               "gradient_checkpointing on, which it needs).", "quantization",
                               choices=QUANTIZATION_CHOICES, tasks=(*TEXT, "video"))
    double_quant: bool = option(True, "nf4: also quantize the per-block scales (saves about 0.4 "
                                "bits/weight: ~0.37 GB on an 8B model).", "quantization", tasks=TEXT)
    optimizer: str = option("auto", "adamw (fp32 states, 8 bytes/trainable param), adamw8bit or "
                            "paged_adamw8bit (bitsandbytes 8-bit states, ~2 bytes/param; paged "
                            "moves them to CPU RAM under pressure on CUDA). auto: adamw for text; "
                            "image picks adamw8bit in optimized mode on a GPU with bitsandbytes.",
                            "quantization", choices=("auto", "adamw", "adamw8bit", "paged_adamw8bit"))

    def _check_quantization(self) -> None:
        """Refuses a base-weight storage the run's task does not build, naming what it does."""
        q = self.quantization
        if self.task == "text" and q not in TEXT_QUANTIZATIONS:
            raise ConfigError(f"quantization: {q} is for video runs; a text run stores its base in "
                              "nf4 or int8 (or none)")
        if self.task == "image" and q != "none":
            raise ConfigError(f"quantization: {q} is not built for image runs; use quantization: none")
        if self.task == "video" and q not in VIDEO_QUANTIZATIONS:
            raise ConfigError(f"quantization: {q} is for text runs; a video run stores its base in "
                              "fp8 (or none)")
        if self.task == "video" and q == "fp8" and not self.gradient_checkpointing:
            raise ConfigError("quantization: fp8 needs gradient_checkpointing: true on a video run: "
                              "without it every layer keeps its weights brought back to the compute "
                              "dtype for the backward, which takes more memory than no fp8 at all")

    def resolved_optimizer(self, device_type: str) -> str:
        """The optimizer once 'auto' is resolved: adamw for text; for images, adamw8bit in
        optimized mode on a GPU when bitsandbytes is installed.

        Args:
            device_type: where the run trains ('cuda' or 'cpu').
        """
        if self.optimizer != "auto":
            return self.optimizer
        if self.task in ("image", "video") and self.mode == "optimized" and device_type == "cuda" \
                and bitsandbytes_present():
            return "adamw8bit"
        return "adamw"


@dataclass
class LoraSettings:
    """The adapter: kind, rank, targets and initialisation (mixed into RunConfig, whose
    ``task`` and ``train_text_encoder`` the checks below read)."""

    # -- LoRA ----------------------------------------------------------------------------------
    lora_rank: int = option(8, "LoRA rank r.", "lora", low=1, high=1024)
    lora_alpha: float = option(16.0, "LoRA alpha (scale = alpha / r).", "lora", low=0.0,
                               high=1e4)
    lora_dropout: float = option(0.0, "Dropout on the LoRA input.", "lora", low=0.0, high=0.9)
    lora_targets: str = option("all-linear", "Modules that get LoRA: 'all-linear' or a comma list "
                               "such as q_proj,v_proj.", "lora")
    adapter: str = option("lora", "Adapter kind: lora; dora (LoRA plus a learned magnitude per "
                          "output: often closer to full fine-tuning, about 25% slower, more "
                          "activation memory); loha (low-rank Hadamard product); lokr (Kronecker "
                          "product); oft (orthogonal rotation of blocks of lora_rank input features; "
                          "text runs).", "lora", choices=ADAPTERS)
    lora_fused: bool = option(True, "LoRA: add the adapter's output inside the base layer's matmul "
                              "(one fused multiply-add, no full-width temporaries): same results "
                              "and memory, faster. Off: peft's own forward.", "lora", tasks=TEXT)
    rslora: bool = option(False, "LoRA / DoRA: rank-stabilised scale alpha / sqrt(r) instead of "
                          "alpha / r (keeps high ranks learning).", "lora", tasks=TEXT)
    lora_init: str = option("default", "LoRA / DoRA initial weights: default (A random, B zero); "
                            "gaussian (A Gaussian); pissa (A and B from the weight's principal "
                            "singular vectors, the base keeps the rest; an SVD of every adapted layer "
                            "before the first step); olora (A and B from a QR decomposition); loftq (with "
                            "quantization nf4: A and B fitted to each weight's 4-bit rounding error); "
                            "eva (A from the principal directions of each layer's inputs on a few "
                            "batches of the training data); corda (A and B from the weights shaped by "
                            "those inputs' covariance, the base keeps the rest).",
                            "lora", choices=LORA_INITS, tasks=TEXT)
    lora_plus_ratio: float = option(1.0, "LoRA / DoRA: LoRA+, the learning rate of B is this many "
                                    "times that of A (1 = off; the LoRA+ paper uses 16).", "lora",
                                    low=1.0, high=1024.0, tasks=TEXT)
    lora_fa: bool = option(False, "LoRA / DoRA: LoRA-FA, keep A frozen at its random init and train "
                           "B only (less gradient, optimizer and activation memory).", "lora",
                           tasks=TEXT, label="LoRA-FA (frozen A)")

    def _check_image_adapter(self) -> None:
        if self.adapter not in IMAGE_ADAPTERS:
            raise ConfigError(f"adapter: {self.adapter} is for text runs; image runs use one of "
                              f"{', '.join(IMAGE_ADAPTERS)}")
        text_only = [k for k, on in (("rslora", self.rslora), ("lora_fa", self.lora_fa),
                                     ("lora_init", self.lora_init != "default"),
                                     ("lora_plus_ratio", self.lora_plus_ratio != 1.0)) if on]
        if text_only:
            raise ConfigError(f"{text_only[0]}: applies to text runs; leave it at its default for an "
                              "image run")
        if self.adapter != "lora" and self.train_text_encoder:
            raise ConfigError(f"train_text_encoder: the text encoders train plain LoRA; use adapter: lora "
                              f"with train_text_encoder, or train_text_encoder: false with "
                              f"{self.adapter}")

    def _check_adapter(self) -> None:
        """Refuses adapter settings that peft or bitsandbytes cannot run, naming what works."""
        if self.task in ("image", "video"):
            self._check_image_adapter()
        if self.adapter not in ("lora", "dora"):
            lora_only = {"rslora": self.rslora, "lora_fa": self.lora_fa,
                         "lora_init": self.lora_init != "default",
                         "lora_plus_ratio": self.lora_plus_ratio != 1.0}
            for key, used in lora_only.items():
                if used:
                    raise ConfigError(f"{key}: applies to adapter: lora or dora, not {self.adapter}; "
                                      f"use adapter: lora or leave {key} at its default")
            if self.quantization != "none":
                raise ConfigError(f"adapter: {self.adapter} cannot train on a {self.quantization} "
                                  "base (peft has no quantized layer for it); use adapter: lora or "
                                  "dora with quantization, or quantization: none")
            if self.lora_dropout:
                raise ConfigError(f"lora_dropout: adapter {self.adapter} has no input dropout; use "
                                  "lora_dropout: 0 or adapter: lora / dora")
        self._check_init()
        if self.lora_init in ("pissa", "olora") and self.quantization != "none":
            raise ConfigError(f"lora_init: {self.lora_init} needs the full-precision weights it "
                              f"decomposes, not a {self.quantization} base; use lora_init: default "
                              "with quantization, or quantization: none")
        if self.lora_fa and self.lora_plus_ratio != 1.0:
            raise ConfigError("lora_plus_ratio: LoRA+ speeds up B relative to A, but lora_fa freezes "
                              "A; use one of them")

    def _check_init(self) -> None:
        """The data-driven and quantization-aware initialisations, as peft runs them."""
        init = self.lora_init
        if init == "loftq" and self.quantization != "nf4":
            raise ConfigError(f"lora_init: loftq fits the adapter to a 4-bit base's rounding error and "
                              f"needs quantization: nf4, not {self.quantization}; use quantization: nf4 "
                              "or lora_init: pissa on a full-precision base")
        if init in ("loftq", *DATA_INITS) and self.adapter != "lora":
            raise ConfigError(f"lora_init: {init} initialises plain LoRA layers only, not "
                              f"adapter: {self.adapter}; use adapter: lora with it")
        if init in DATA_INITS and self.quantization != "none":
            raise ConfigError(f"lora_init: {init} reads the full-precision weights and layer inputs, "
                              f"not a {self.quantization} base; use quantization: none, or "
                              "lora_init: loftq with quantization: nf4")
