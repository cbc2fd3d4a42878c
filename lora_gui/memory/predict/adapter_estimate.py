"""Closed-form terms of the adapter variants for the step estimate (checked against the trace).

The estimate (:mod:`lora_gui.memory.predict.estimate`) is written for plain LoRA; a variant changes it by:

- parameters, gradients and optimizer state: the exact sizes of the variant's trainable tensors,
  counted by building one peft layer of each adapted shape on the meta device (no memory);
- per token and adapted module (what autograd saves), measured on the trace of Llama-family
  configs: DoRA also keeps the base output (compute dtype) and the adapter output (float32) for
  its magnitude scale, ``(4 + d) x out`` bytes; LoHa, LoKr and OFT build a dense weight instead
  of a rank-r intermediate, so the float32 ``A x`` outputs (``4 x r``) are not kept; LoRA-FA's
  frozen A needs no copy of the layer input (the float32 input copies are not kept);
- a fixed term: LoHa and LoKr keep the dense weight delta (float32, in x out) of every adapted
  module for the backward; DoRA builds ``B A`` and the norm of ``W + B A`` of one module at a
  time (one float32 in x out matrix transient); OFT keeps four float32 tensors of its
  block-diagonal rotation per adapted module for the backward (in / r blocks of r x r each:
  fitted on the trace, whose gap to the estimate grew by 4.0 x 4 bytes x r x in per module).
"""

from __future__ import annotations

import functools
from typing import Any

F32 = 4  # bytes of a float32


@functools.lru_cache(maxsize=256)
def trainable_numels(spec: Any, n_in: int, n_out: int) -> tuple[int, ...]:
    """Sizes of the trainable tensors the variant ``spec`` adds to one (n_in -> n_out) Linear."""
    import torch
    from torch import nn

    from lora_gui.models.adapters import attach_adapter

    with torch.device("meta"):
        module = nn.Sequential()
        module.add_module("proj", nn.Linear(n_in, n_out, bias=False))
    model = attach_adapter(module, spec.for_trace(), ["proj"])
    return tuple(p.numel() for p in model.parameters() if p.requires_grad)


def variant_terms(spec: Any, dims: dict[str, tuple[int, int]], layers: int, d: int,
                  targets: tuple[str, ...], r: int) -> dict[str, Any]:
    """The variant's terms for one decoder architecture.

    Args:
        spec: the run's :class:`lora_gui.models.adapters.AdapterSpec` (its rank is ``r``).
        dims: (in, out) features of each projection of one decoder layer.
        layers: decoder layers.
        d: bytes per element of the compute dtype.
        targets: the adapted projections.
        r: the rank.

    Returns:
        ``numels`` (trainable tensor sizes, whole model), ``per_token`` (bytes per token, whole
        model, to add to one layer's saved bytes x layers: given per layer), ``drop_a_outputs``,
        ``drop_input_copies`` (plain-LoRA terms the variant does not keep) and ``fixed`` bytes.
    """
    import dataclasses

    spec = dataclasses.replace(spec, rank=r)
    numels = [n for t in targets for n in trainable_numels(spec, *dims[t])] * layers
    outs = sum(dims[t][1] for t in targets)
    dense = [dims[t][0] * dims[t][1] for t in targets]
    per_token, fixed = 0, 0
    if spec.kind == "dora":
        per_token = (F32 + d) * outs
        fixed = F32 * max(dense)
    elif spec.kind in ("loha", "lokr"):
        fixed = F32 * sum(dense) * layers
    elif spec.kind == "oft":  # four float32 block-diagonal tensors per module, in x r numbers each
        fixed = 4 * F32 * r * sum(dims[t][0] for t in targets) * layers
    return {"numels": numels, "per_token": per_token, "fixed": fixed,
            "drop_a_outputs": spec.kind in ("loha", "lokr", "oft"), "drop_input_copies": spec.fa}
