"""The memory switches of a run (batching, attention, checkpointing, chunked loss, the long-context
switches, precision and budget): a group of :class:`lora_gui.config.RunConfig`'s fields and the
rules that resolve their 'auto' by the mode. The image runs' switches sit with the image settings
(:mod:`lora_gui.image_settings`)."""

from __future__ import annotations

from dataclasses import dataclass

from lora_gui.options import TEXT, option

AUTO_LOSS_CHUNK = 1024  # loss_chunk=-1 in optimized mode: 1024 x vocab x 12 bytes of logits at most


@dataclass
class MemorySettings:
    """The memory switches (mixed into RunConfig, whose other fields the rules below read:
    ``max_seq_len`` from the training settings)."""

    # -- the three memory switches -------------------------------------------------------------
    mode: str = option("optimized", "traditional: pad to max_seq_len, eager attention, fixed "
                       "batch. optimized: dynamic sizing, SDPA, token budget.", "memory",
                       choices=("traditional", "optimized"))
    batching: str = option("auto", "Batch builder; auto picks fixed (traditional) or bucketed "
                           "(optimized).", "memory", choices=("auto", "fixed", "bucketed", "packed"),
                           tasks=TEXT)
    attn_backend: str = option("auto", "Attention kernel; auto picks eager (traditional) or "
                               "sdpa (optimized).", "memory", choices=("auto", "eager", "sdpa"))
    token_budget: int = option(2048, "Bucketed/packed: at most this many (padded) tokens in one "
                               "micro-batch (packed: one row of several documents); steps above "
                               "it are split by gradient accumulation.",
                               "memory", low=16, high=1 << 22, tasks=TEXT)
    # 8: the tensor-core multiple of 16-bit GEMMs; 64 padded the bundled corpus 11% (8: 6%)
    pad_multiple: int = option(8, "Bucketed: pad each batch to its longest sample rounded up to "
                               "this multiple; packed: each row to this multiple (larger: fewer "
                               "shapes, more padded tokens).", "memory",
                               low=1, high=4096, tasks=TEXT)
    attention: str = option("full", "full: every token attends to all earlier ones. windowed: each "
                            "token sees the previous `window` tokens and the first `global_tokens` "
                            "of its document (Longformer style); O(S x (W + G)) instead of O(S^2).",
                            "memory", choices=("full", "windowed"), tasks=TEXT)
    window: int = option(256, "Windowed attention: tokens each query sees behind it.", "memory",
                         low=1, high=1 << 20, tasks=TEXT)
    global_tokens: int = option(4, "Windowed attention: leading tokens of each document that every "
                                "query also sees.", "memory", low=0, high=1 << 20, tasks=TEXT)
    gradient_checkpointing: bool = option(False, "Recompute activations in backward: less memory, "
                                          "about 30% more compute.", "memory")
    checkpoint_layers: int = option(0, "Gradient checkpointing: checkpoint only this many of the "
                                    "model's first decoder layers (text) or transformer blocks "
                                    "(video); the last ones keep their activations and are not "
                                    "recomputed (faster, more memory; the plan shows how much and "
                                    "the fewest that fit a budget). 0 = every layer, or for a text "
                                    "run under a budget with the fastest micro-batch choice, the "
                                    "number of layers the plan predicts trains fastest.", "memory",
                                    low=0, high=1 << 16, tasks=(*TEXT, "video"))
    loss_chunk: int = option(-1, "Chunked loss: compute the cross-entropy over this many token "
                             "positions at a time instead of the whole batch's float32 logits (same "
                             "value; saves ~12 bytes x vocab per token). 0 = off; -1 = auto: "
                             f"{AUTO_LOSS_CHUNK} in optimized mode, off in traditional.", "memory",
                             low=-1, high=1 << 22, tasks=TEXT)
    # long context: each switch trades speed for accelerator memory; the planner traces each one
    offload_checkpoints: bool = option(False, "Gradient checkpointing: keep each layer's saved "
                                       "input in host memory and bring it back for backward (no "
                                       "accelerator memory for checkpoints; costs host copies). Left "
                                       "off, a GPU run under a budget with the fastest micro-batch "
                                       "choice turns it on by itself when that is the fastest way to fit.",
                                       "memory", tasks=TEXT)
    mlp_chunk: int = option(0, "Sequence-tiled MLP: run each layer's MLP and its LoRA over this "
                            "many tokens at a time, so its intermediates do not grow with the "
                            "sequence (same result). 0 = off.", "memory", low=0, high=1 << 22,
                            tasks=TEXT)
    attention_head_groups: int = option(0, "Attention in head groups: run each layer's attention as "
                                        "this many calls, each over an equal share of the key/value "
                                        "heads, so the GPU kernels' backward scratch is that many "
                                        "times smaller (same result, more kernel launches). Must "
                                        "divide the model's key/value heads. 0 = one call.", "memory",
                                        low=0, high=1024, tasks=TEXT)
    embeddings_on_host: bool = option(False, "Keep the frozen input embedding table in host memory "
                                      "and move only the looked-up rows to the accelerator.",
                                      "memory", tasks=TEXT)
    precision: str = option("auto", "auto measures: bf16 on GPUs that support it, fp32 on CPUs "
                            "where bf16 autocast is slower.", "memory",
                            choices=("auto", "fp32", "bf16", "fp16"))
    budget_gb: float = option(0.0, "VRAM budget in GB (0 = none). Without a GPU it is a simulated "
                              "budget enforced by the tracker.", "memory", low=0.0, high=4096.0,
                              label="VRAM budget (GB)")
    # -- throughput-aware plan (lora_gui.memory.predict.step_time) -----------------------------
    batch_choice: str = option("fastest", "Bucketed batches under a VRAM budget: which micro-batch "
                               "each length bucket trains with, among those that fit. fastest: the "
                               "highest predicted tokens/s (step time measured on this device; of "
                               "equally fast ones the smallest); headroom: the smallest that keeps 90% "
                               "of the fastest tokens/s (more memory left free); largest: the largest "
                               "that fits. Image runs take the largest micro-batch that fits; with "
                               "fastest, a run with gradient checkpointing also weighs it off and "
                               "trains without it when the plan predicts more images/s inside the "
                               "budget.", "memory", choices=("fastest", "headroom", "largest"),
                               tasks=(*TEXT, "image"), label="Micro-batch choice")
    # -- fast kernels from libraries on CUDA (lora_gui.models.fast_kernels) ---------------------
    liger_kernels: str = option("auto", "CUDA: Liger-Kernel's fused RMSNorm, RoPE, SwiGLU and (without "
                                "loss_chunk) fused linear cross-entropy, from the optional liger-kernel "
                                "package. auto / on: used on a CUDA GPU with the package installed, "
                                "otherwise the run goes on without them and logs why; off: never.",
                                "memory", choices=("auto", "on", "off"), tasks=TEXT)
    compile_blocks: str = option("auto", "CUDA: compile each decoder block with torch.compile (one "
                                 "graph for every layer and length; the first steps take longer). "
                                 "auto / on: on a CUDA GPU, not on CPUs (their memory measurement runs "
                                 "compiled code eagerly); off: never.", "memory",
                                 choices=("auto", "on", "off"), tasks=TEXT)
    monitor_hz: float = option(2.0, "Memory samples per second written to memory.jsonl (0 = off).",
                               "memory", low=0.0, high=20.0)
    measure_every_step: bool = option(False, "CPU runs: measure every step's peak memory with the "
                                      "tracker (2-3x slower steps). Off: the first 2 steps of each "
                                      "step shape are measured; later ones, and steps no larger than "
                                      "a measured one, run at full speed and record no peak. GPU "
                                      "runs measure every step either way.",
                                      "memory")

    def resolved_batching(self) -> str:
        """The batch builder this run uses once 'auto' is resolved by the mode."""
        if self.batching != "auto":
            return self.batching
        return "fixed" if self.mode == "traditional" else "bucketed"

    def packed_row_tokens(self) -> int:
        """Tokens a packed row holds at most: the token budget where each document is attended
        on its own (sdpa, full attention; every document still at most max_seq_len), else one
        sample's length (there a row's mask grows with its length squared)."""
        if self.attention != "windowed" and self.resolved_attn_backend() == "sdpa":
            return self.token_budget
        return min(self.max_seq_len, self.token_budget)

    def resolved_attn_backend(self) -> str:
        """The attention kernel this run uses once 'auto' is resolved by the mode."""
        if self.attn_backend != "auto":
            return self.attn_backend
        return "eager" if self.mode == "traditional" else "sdpa"

    def resolved_loss_chunk(self) -> int:
        """Chunked-loss positions once auto (-1) is resolved by the mode; 0 = off."""
        if self.loss_chunk >= 0:
            return self.loss_chunk
        return 0 if self.mode == "traditional" else AUTO_LOSS_CHUNK
