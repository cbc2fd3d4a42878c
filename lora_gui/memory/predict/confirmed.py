"""Which memory savings the plan counts have been confirmed on a card, and which not yet.

A saving is confirmed when a run on a real GPU held what the plan said with it on (the card's
``max_memory_allocated`` against the plan, the run and the commit named below). A saving shown
only by CPU traces (the trace checked against the same code on real tensors) is an instrument
check, not a confirmation: an answer at the edge of a card that leans on it keeps a margin, the
saving itself, until a card run confirms it (:func:`margin_needed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lora_gui.config import RunConfig

H200_RUN = ("bench/results/gpu_h200/run2_gpu_check.json: NVIDIA H200, torch 2.11 + CUDA 13.0, "
            "committed in e4c6abe")
CARD_ROWS = (f"{H200_RUN}, card rows: Llama-3.1-8B shapes, nf4, r32, at 9,408 tokens (8 GB cap) and "
             "89,408 (24 GB)")


# The caching allocator's reserve ran 1.23% above its plan on the card row at the 8 GB edge (the
# H200 run above: Llama-3.1-8B shapes, nf4, r32, 9,408 tokens without head groups, reserved
# 7,824,474,112 bytes measured, 7,728,005,120 planned); allocated was within 0.01%. An answer
# at the edge of a card keeps this share of the card's usable memory free until a card confirms
# the replay there.
RESERVE_MARGIN = 0.0125


@dataclass(frozen=True)
class Saving:
    """One memory saving the plan counts.

    Attributes:
        name: the setting (or mechanism) that makes it.
        what: what it saves, in words.
        confirmed_by: the card run that held the plan with it on (None: not yet confirmed).
    """

    name: str
    what: str
    confirmed_by: str | None


SAVINGS = (
    Saving("gradient_checkpointing", "decoder layers' activations recomputed in the backward",
           CARD_ROWS),
    Saving("offload_checkpoints", "checkpointed layer inputs kept in host memory",
           CARD_ROWS),
    Saving("mlp_chunk", "the MLP run over chunks of tokens", CARD_ROWS),
    Saving("embeddings_on_host", "the embedding table in host memory",
           CARD_ROWS),
    Saving("optimizer=adamw8bit", "8-bit optimizer states", CARD_ROWS),
    Saving("quantization=nf4", "4-bit frozen weights", f"{H200_RUN}, nf4 rows at 512-2,048 tokens"),
    # the 8 GB card row with head groups ran out of memory (the allocator's fragments under the cap)
    # where the same length without them fit: the longest search does not propose them
    Saving("attention_head_groups", "attention one key/value head group at a time (its backward scratch)",
           None),
    Saving("lean_backward rebuilds", "norm, feed-forward and attention outputs the LoRA layers read, "
           "rebuilt in the backward instead of kept (CPU traces only)", None),
)


def unconfirmed(cfg: RunConfig, changes: dict | None = None) -> list[Saving]:
    """The savings a run with ``cfg`` (and ``changes`` on top) counts that no card has confirmed."""
    head_groups = (changes or {}).get("attention_head_groups", cfg.attention_head_groups)
    counted = {"attention_head_groups": bool(head_groups),
               "lean_backward rebuilds": cfg.resolved_lean_backward()}
    return [s for s in SAVINGS if s.confirmed_by is None and counted.get(s.name)]


def margin_needed(cfg: RunConfig, changes: dict | None = None) -> bool:
    """Whether an answer at the edge of a card for this run keeps a margin: it counts the
    rebuilds, which no card has confirmed (the head groups' own case is their scratch, which the
    plan keeps counting per group, and is named apart)."""
    return any(s.name == "lean_backward rebuilds" for s in unconfirmed(cfg, changes))


def is_confirmed(name: str) -> bool:
    """Whether the saving called ``name`` (see :data:`SAVINGS`) is confirmed on a card."""
    return any(s.name == name and s.confirmed_by for s in SAVINGS)
