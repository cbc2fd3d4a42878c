"""Text base models: resolve 'builtin' / a local directory / a Hugging Face id, load it with the
requested attention kernel, attach LoRA (peft), and save the adapter in peft format."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from lora_gui.attention.documents import enable_document_attention
from lora_gui.config import BUILTIN_MODEL_DIR, ConfigError, RunConfig
from lora_gui.models.errors import ModelError  # noqa: F401  (re-exported: callers import it here)

log = logging.getLogger(__name__)
HUB_TIMEOUT_S = 5  # how long an online check may take before we call the machine offline


def resolve_model_source(name: str) -> str:
    """Returns a local directory or a Hugging Face id that is known to be reachable.

    Raises:
        ModelError: within seconds when the id is neither cached nor downloadable (offline).
    """
    if name == "builtin":
        return str(BUILTIN_MODEL_DIR)
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelError(f"model: {path} has no config.json (save it with save_pretrained)")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelError(f"model: local directory {name} not found")
    try:  # cached already? then no network is needed
        AutoConfig.from_pretrained(name, local_files_only=True)
        return name
    except (OSError, ValueError):
        pass
    check_hub_id(name, "a local directory")
    return name


def check_hub_id(name: str, local: str) -> None:
    """Fails fast with a clear ModelError when ``name`` (not cached locally) cannot come from the
    Hub: HF_HUB_OFFLINE set, an unknown id, or no network within HUB_TIMEOUT_S. ``local`` names
    the local alternative in the messages."""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelError(f"model: '{name}' is not in the local cache and HF_HUB_OFFLINE=1 is set; "
                         f"use 'builtin' or {local}")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except RepositoryNotFoundError:
        raise ModelError(f"model: '{name}' is not a Hugging Face model id (not found, or gated)") from None
    except Exception as err:  # connection refused, DNS failure, timeout
        raise ModelError(f"model: cannot reach the Hugging Face Hub to download '{name}' "
                         f"({type(err).__name__}); offline? use 'builtin' or {local}") from None


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token_id is None:  # many causal LMs ship without one; padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def max_positions(source: str) -> int | None:
    """The model's longest supported sequence (max_position_embeddings or n_positions)."""
    cfg = AutoConfig.from_pretrained(source)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(cfg, key, None)
        if isinstance(value, int):
            return value
    return None


def load_base_model(source: str, attn_backend: str, dtype: torch.dtype = torch.float32):
    """Loads the causal LM with the given attention implementation ('eager' or 'sdpa')."""
    model = AutoModelForCausalLM.from_pretrained(source, attn_implementation=attn_backend, dtype=dtype)
    model.config.use_cache = False  # training: no KV cache
    return model


def load_model_for(cfg: RunConfig, source: str, dtype: torch.dtype = torch.float32,
                   device: torch.device | None = None, layout: dict[str, Any] | None = None):
    """The base model with the run's attention: its kernel, and the window when asked for;
    with sdpa, packed rows attend each document on its own (lora_gui.attention.documents).

    Windowed attention support is checked on the config before any weight is loaded. ``dtype`` is
    the frozen weights' dtype (bf16 on GPUs that train in bf16: half the memory of fp32); with
    ``quantization`` nf4 / int8 the Linear layers are quantized on ``device`` and ``dtype`` is
    the compute dtype of the rest (lora_gui.models.quant). ``layout``: build the model with no
    weights (meta device) after the main process's loaded one (lora_gui.models.skeleton), for
    the processes of an FSDP run that receive their shards instead of loading.
    """
    if cfg.attention == "windowed":
        from lora_gui.attention import check_windowed_support

        try:
            check_windowed_support(AutoConfig.from_pretrained(source))
        except ValueError as err:
            raise ModelError(f"attention=windowed: {err}") from None
    if layout is not None:
        from lora_gui.models.quant import bnb_config
        from lora_gui.models.skeleton import meta_skeleton

        qconfig = (bnb_config(cfg.quantization, cfg.double_quant, dtype, fsdp=True)
                   if layout["layers"] else None)
        model = meta_skeleton(source, cfg.resolved_attn_backend(), dtype, layout, qconfig)
    elif cfg.quantization != "none":
        from lora_gui.models.quant import load_quantized

        model = load_quantized(source, cfg, cfg.resolved_attn_backend(), dtype, device or torch.device("cpu"))
    else:
        model = load_base_model(source, cfg.resolved_attn_backend(), dtype)
    if cfg.resolved_loss_chunk():
        from lora_gui.models.chunked_loss import enable_chunked_loss

        try:
            enable_chunked_loss(model, cfg.resolved_loss_chunk())
        except ValueError as err:
            if cfg.loss_chunk > 0:  # asked for by the user: say why it cannot be done
                raise ModelError(str(err)) from None
            log.info("loss_chunk auto: off for this model (%s)", err)  # auto: keep the full loss
    if cfg.attention == "windowed":
        from lora_gui.attention import enable_windowed_attention

        enable_windowed_attention(model, cfg.window, cfg.global_tokens, max_seq_len=cfg.max_seq_len)
    # packed rows: each document's own causal SDPA call, not a dense block mask (sdpa only)
    enable_document_attention(model)
    return model


@contextlib.contextmanager
def attention_backend(model, backend: str) -> Iterator[None]:
    """Temporarily runs the model with another attention implementation (e.g. full for eval)."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    previous = base.config._attn_implementation
    base.set_attn_implementation(backend)
    try:
        yield
    finally:
        base.set_attn_implementation(previous)


def fit_embeddings(model, tokenizer) -> list[int]:
    """Grows the input (and tied output) embeddings to the tokenizer's vocabulary when a chat
    template added special tokens; returns the new token ids, whose rows must be trained."""
    rows = model.get_input_embeddings().weight.shape[0]
    if tokenizer is None or len(tokenizer) <= rows:
        return []
    model.resize_token_embeddings(len(tokenizer))  # new rows: mean of the old ones (transformers)
    return list(range(rows, len(tokenizer)))


def trainable_token_targets(model, new_ids: list[int]) -> list[int] | dict[str, list[int]] | None:
    """peft's ``trainable_token_indices`` for rows added to the vocabulary: the input embeddings,
    and the output head's rows too when it is not tied to them (None: nothing added)."""
    if not new_ids:
        return None
    if model.config.get_text_config().tie_word_embeddings:
        return new_ids
    names = {m: n.rsplit(".", 1)[-1] for n, m in model.named_modules()}
    return {names[model.get_input_embeddings()]: new_ids, names[model.get_output_embeddings()]: new_ids}


def attach_lora(model, cfg: RunConfig, tokenizer=None, saved_init: Any = None,
                init_data: dict[str, Any] | None = None) -> PeftModel:
    """Wraps the model with trainable LoRA adapters; base weights are frozen. With a tokenizer
    larger than the model's vocabulary (chat template tokens added), the embeddings grow and the
    new tokens' rows are trained too and saved in the adapter (peft trainable tokens).
    ``saved_init``: a file of :func:`lora_gui.models.adapters.save_init` (a resumed run whose
    ``lora_init`` ran a pass before step 1): the adapter is attached with peft's default init and
    the saved initialisation loaded, so the pass is not repeated. ``init_data``: what that pass
    reads: ``batches`` (eva), ``rows`` (corda), ``model_path`` (loftq: the original weights)."""
    new_ids = trainable_token_targets(model, fit_embeddings(model, tokenizer))
    targets = cfg.lora_targets if cfg.lora_targets == "all-linear" else [
        t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
    import dataclasses

    from lora_gui.models import init_passes
    from lora_gui.models.adapters import adapter_spec, attach_adapter, decomposition_progress, load_init

    spec = adapter_spec(cfg)
    passes = spec.init in ("pissa", "olora", "loftq", "eva", "corda")
    data = init_data or {}
    if passes and saved_init is not None:
        log.info("lora_init %s: loading the initialisation saved in %s (not run again)", spec.init,
                 saved_init)
    elif passes:
        log.info("lora_init %s: initialising the adapter before the first step", spec.init)
    try:
        with decomposition_progress(spec.init if passes and saved_init is None else None):
            peft_model = attach_adapter(model, dataclasses.replace(spec, init="default") if saved_init
                                        else spec, targets, task_type="CAUSAL_LM", tokens=new_ids,
                                        corda_rows=data.get("rows"))
        if saved_init is not None:
            load_init(peft_model, saved_init, spec.init)
        elif spec.init == "eva":
            init_passes.run_eva(peft_model, data.get("batches") or [])
        elif spec.init == "loftq":
            init_passes.run_loftq(peft_model, str(data["model_path"]))
    except ConfigError:
        raise
    except ValueError as err:
        raise ModelError(f"lora_targets: {err}") from None
    if cfg.quantization != "none":
        from lora_gui.models.quant import prepare_for_training

        prepare_for_training(peft_model)
    if cfg.lora_fused:  # plain LoRA layers only; every other adapter keeps peft's forward
        from lora_gui.models.lora_fused import fuse_lora

        fuse_lora(peft_model)
    if cfg.resolved_lean_backward():  # after the fused forward, which it wraps
        from lora_gui.models.lean_backward import lean_frozen_layers

        lean_frozen_layers(peft_model)
    return peft_model
