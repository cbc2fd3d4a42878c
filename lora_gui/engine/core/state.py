"""The training state a checkpoint carries besides tensors (trainer_state.json), typed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class TrainState:
    """Where a run is and what it must keep across a resume.

    Attributes:
        step: optimizer steps done (1-based count of the last finished step).
        base_eval_loss: held-out loss of the base model before training (None until measured).
        precision: accelerate's mixed precision the run started with ('no', 'bf16', 'fp16');
            a resumed run keeps it.
        sampler: what the global data order depends on (see :func:`engine.core.resume.sampler_state`).
        world_size: processes of the launch that wrote the checkpoint.
        quantization: base weights' storage (none, nf4, int8); a resume must keep it.
        optimizer: the optimizer as resolved (adamw, adamw8bit, paged_adamw8bit); kept on resume.
    """

    step: int = 0
    base_eval_loss: float | None = None
    precision: str = "no"
    sampler: dict[str, Any] | None = None
    world_size: int = 1
    quantization: str = "none"
    optimizer: str = "adamw"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainState:
        """From trainer_state.json; keys of other versions are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known})
