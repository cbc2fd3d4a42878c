"""What a text run checks before anything is written: the model resolves, its length limit holds,
the data reads as the run will read it, and host-side switches fit the host's free memory."""

from __future__ import annotations

import torch

from lora_gui.config import ConfigError, RunConfig
from lora_gui.engine.text.steps import load_text_data
from lora_gui.models import text as text_models


def check_text_inputs(cfg: RunConfig) -> None:
    """Reads the run's data and resolves the model and its length limit (before a run is
    replaced: bad input must not cost the old run)."""
    source = text_models.resolve_model_source(cfg.model)
    limit = text_models.max_positions(source)
    if limit is not None and cfg.max_seq_len > limit:
        raise ConfigError(f"max_seq_len: {cfg.max_seq_len} is above the model's limit of {limit}")
    load_text_data(cfg, text_models.load_tokenizer(source))  # every format, as the run reads it
    if cfg.offload_checkpoints or cfg.embeddings_on_host:
        _check_host_memory(cfg, source)


def _check_host_memory(cfg: RunConfig, source: str) -> None:
    """Refuses host-side switches that need more host memory than is free (the estimate's host
    bytes equal the trace's), before the first step rather than swapping the machine to a halt."""
    from lora_gui.memory.predict.run_plan import estimated_step
    from lora_gui.memory.runtime.host import check_host_memory, host_available_bytes

    device = "cuda" if torch.cuda.is_available() else "cpu"
    need = int(estimated_step(cfg, device, source).info.get("host_bytes") or 0)
    check_host_memory(need, host_available_bytes(), "offloaded checkpoints and host-side embeddings")
