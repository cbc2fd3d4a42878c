"""Adapter initialisations that need a pass over data or a quantized base, run with peft's own
code before the first step, with a progress line:

- ``eva``: peft's ``initialize_lora_eva_weights`` on a few batches of the run's training data:
  A holds the principal directions of each adapted layer's inputs (incremental SVD until they
  converge; ``rho`` 1 keeps every layer at ``lora_rank``, so the adapter's shapes, and the plan,
  do not change). B stays zero; the base is untouched.
- ``corda``: peft's ``preprocess_corda`` reads the covariance of each adapted layer's inputs on
  a few training samples (one sample per forward, as peft's hook requires), then the SVD of the
  weight times that covariance gives A and B; the base keeps the residual (like PiSSA).
- ``loftq``: peft's ``replace_lora_weights_loftq`` on a 4-bit (nf4) base: for every 4-bit
  layer, A and B become the rank-r SVD of the difference between the original weight (read from
  the model's safetensors file) and its 4-bit rounding. peft 0.21 computes that on a CUDA / XPU
  device only; on a CPU run the same steps (peft's own ``_low_rank_decomposition``) run on the CPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from lora_gui.config import ConfigError

log = logging.getLogger(__name__)
INIT_BATCHES = 4  # batches (eva) or batch_size x this many samples (corda) of the run's data read
EVA_MAX_FORWARDS = 400  # peft cycles the batches until every layer's directions converge
BASE_CHANGING = ("pissa", "olora", "corda")  # the base keeps a residual: saved with the init


def eva_config() -> Any:
    """peft's EVA settings for a run: rho 1 keeps every layer's rank (the plan's shapes)."""
    from peft import EvaConfig

    return EvaConfig(rho=1.0)


def corda_config() -> Any:
    from peft.tuners.lora.config import CordaConfig

    return CordaConfig(corda_method="ipm", prune_temporary_fields=True)


def loftq_config() -> Any:
    from peft import LoftQConfig

    return LoftQConfig(loftq_bits=4, loftq_iter=1)


def run_eva(peft_model: nn.Module, batches: Sequence[dict[str, torch.Tensor]]) -> None:
    """EVA on ``batches`` (dicts of input_ids / attention_mask / labels on the model's device).

    Raises:
        ConfigError: the layer inputs did not converge within ``EVA_MAX_FORWARDS`` forwards.
    """
    from peft import initialize_lora_eva_weights

    if not batches:
        raise ConfigError("lora_init: eva needs training data to read; the run has none")
    seen, start = [0], time.perf_counter()

    def forward(model: nn.Module, inputs: dict[str, torch.Tensor]) -> Any:
        seen[0] += 1
        if seen[0] > EVA_MAX_FORWARDS:
            raise ConfigError(f"lora_init: eva's layer directions did not converge in {EVA_MAX_FORWARDS} "
                              "batches of this data (peft skips a batch with fewer trained tokens "
                              "than lora_rank); use a larger batch_size or max_seq_len, or "
                              "lora_init: default")
        if seen[0] == 1 or seen[0] % 10 == 0:
            log.info("lora_init eva: batch %d read (incremental SVD of each adapted layer's inputs), "
                     "%.1f s", seen[0], time.perf_counter() - start)
        return model(**inputs)

    try:
        # every process reads the same batches: gathering them across processes adds nothing
        initialize_lora_eva_weights(peft_model, dataloader=list(batches), forward_fn=forward,
                                    show_progress_bar=False, gather_distributed_inputs=False)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"lora_init: eva could not run on this data ({err}); use lora_init: "
                          "default") from None
    log.info("lora_init eva: %d batches read in %.1f s", seen[0], time.perf_counter() - start)


def run_corda(model: nn.Module, config: Any, rows: Sequence[torch.Tensor]) -> Any:
    """CorDA's preprocessing on the base ``model`` (before the adapter is attached) with one
    forward per row of ``rows`` (1 x tokens id tensors on the model's device). Returns the peft
    config with explicit target names (peft's preprocessing does not expand ``all-linear``)."""
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

    try:
        from peft.tuners.lora.corda import preprocess_corda
    except ImportError as err:  # peft's CorDA module imports attrs, which peft does not require
        raise ConfigError(f"lora_init: corda needs the {err.name} package (pip install attrs); "
                          "install it or use lora_init: pissa") from None

    if not rows:
        raise ConfigError("lora_init: corda needs training data to read; the run has none")
    config = _maybe_include_all_linear_layers(config, model)
    start = time.perf_counter()

    def run_model() -> None:
        for i, ids in enumerate(rows, 1):
            model(input_ids=ids)
            if i == 1 or i % 8 == 0 or i == len(rows):
                log.info("lora_init corda: sample %d of %d read (covariance of each adapted layer's "
                         "inputs), %.1f s", i, len(rows), time.perf_counter() - start)

    training = model.training
    try:
        preprocess_corda(model, config, run_model=run_model)
    except ValueError as err:  # e.g. a covariance that cannot be inverted on this data
        raise ConfigError(f"lora_init: corda could not run on this data ({err}); use lora_init: "
                          "pissa") from None
    model.train(training)
    log.info("lora_init corda: covariances and decompositions done in %.1f s", time.perf_counter() - start)
    return config


def run_loftq(peft_model: nn.Module, model_path: str) -> int:
    """LoftQ on a 4-bit base: every 4-bit layer's A and B from the SVD of its rounding error.
    Returns the number of layers initialised."""
    from peft import replace_lora_weights_loftq
    from peft.utils import loftq_utils

    done, start = [0], time.perf_counter()

    def progress(_model: nn.Module, name: str) -> bool:
        done[0] += 1
        if done[0] == 1 or done[0] % 8 == 0:
            log.info("lora_init loftq: %d layers fitted to their 4-bit error (last %s), %.1f s",
                     done[0], name, time.perf_counter() - start)
        return True

    device = next(p.device for p in peft_model.parameters())
    real = loftq_utils._loftq_init_new
    if device.type == "cpu":  # peft computes on cuda / xpu only: the same steps on the CPU
        loftq_utils._loftq_init_new = _loftq_on_cpu
    try:
        replace_lora_weights_loftq(peft_model, model_path=model_path, callback=progress)
    except (OSError, ValueError) as err:  # no safetensors file, or no 4-bit layer
        raise ConfigError(f"lora_init: loftq reads the original weights from the model's safetensors "
                          f"file(s) in {model_path} and could not ({err}); use lora_init: default") from None
    finally:
        loftq_utils._loftq_init_new = real
    log.info("lora_init loftq: %d layers in %.1f s", done[0], time.perf_counter() - start)
    return done[0]


@torch.no_grad()
def _loftq_on_cpu(qweight: Any, weight: torch.Tensor, num_bits: int, reduced_rank: int) -> tuple[Any, Any]:
    """peft's ``_loftq_init_new`` with the CPU as the compute device."""
    import bitsandbytes as bnb
    from peft.utils.loftq_utils import _low_rank_decomposition

    if num_bits != 4:
        raise ValueError("Only 4 bit quantization supported at the moment.")
    dequantized = bnb.functional.dequantize_4bit(qweight.data, qweight.quant_state)
    residual = weight.to(dtype=torch.float32) - dequantized
    out = _low_rank_decomposition(residual, reduced_rank=reduced_rank)
    return out["R"], out["L"]


def init_rows(samples: Sequence[Any], count: int, max_len: int, device: torch.device) -> list[torch.Tensor]:
    """The first ``count`` training samples as 1 x tokens id tensors (CorDA's forwards)."""
    return [torch.tensor([s.input_ids[:max_len]], device=device) for s in samples[:count]]


def init_batch_rows(samples: int, batch_size: int) -> list[tuple[int, ...]]:
    """The sample indices of each batch EVA reads: the first ``INIT_BATCHES`` batches of
    ``batch_size`` of the ``samples`` training samples."""
    return [tuple(range(start, min(start + batch_size, samples)))
            for start in range(0, min(samples, batch_size * INIT_BATCHES), batch_size)]


def init_batches(samples: Sequence[Any], batch_size: int, max_len: int, pad_id: int,
                 device: torch.device, collate: Callable[..., dict[str, torch.Tensor]],
                 micro_batch: Callable[..., Any]) -> list[dict[str, torch.Tensor]]:
    """The first ``INIT_BATCHES`` batches of ``batch_size`` samples, padded to their longest (EVA)."""
    out = []
    for idx in init_batch_rows(len(samples), batch_size):
        width = min(max_len, max(len(samples[i]) for i in idx))
        batch = collate(samples, micro_batch(idx, width), pad_id)
        out.append({k: v.to(device) for k, v in batch.items()})
    return out
