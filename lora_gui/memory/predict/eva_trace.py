"""The memory of EVA's pass (``lora_init`` eva: peft's ``initialize_lora_eva_weights``), traced on
fake tensors with peft's own hooks, as the run executes it.

What the run does (:func:`lora_gui.models.init_passes.run_eva`): the model (weights and the
adapter's A and B, allocated when the adapter is attached) in eval mode, the adapter off, no
gradients, the run's first few batches on the device, all of them held at once. One forward
hashes each adapted layer's input to find layers that read the same tensor (q / k / v, gate /
up: one SVD serves them); then every forward runs peft's ``SVDHook`` on each distinct input: the
layer input's trained tokens (attention mask and a label) gathered into a (tokens x in) matrix,
cast to float32 and fed to ``IncrementalPCA.partial_fit`` (a float32 clone, float64 mean and
variance, from the second batch on a float64 stack of the kept components, the batch and the
mean correction, and a randomized low-rank SVD of it), whose state (components, singular
values, float64 mean and variance) stays alive per layer until the end. peft cycles the batches
until every layer's directions converge.

What the trace runs: the run's model built from its config on the meta device with fake weights
(the run's attention, loss and dtype), the run's batches as fake tensors of their real shapes
(held, as on the device), and peft's real ``SVDHook`` on each distinct layer input, fed each
batch's real number of trained tokens: a forward of the first batch (each layer's first fit,
float32), a second one (its state becomes float64), then, in that steady state, each batch that
no other batch dominates (rows, width, trained tokens, padding). The peak over those forwards is
the prediction. It errs high, never low, where peft stops early: the run sees every batch only if
some layer is still converging, and a converged layer's hook keeps the positions of the batch it
converged on (one per hook is counted, each the largest batch's). Not counted, on either side:
LAPACK's workspace on a CPU and the hash forward's Python list (host memory, not a tensor). On a
GPU each tensor counts at the caching allocator's 512-byte blocks, plus the CUDA context.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lora_gui.memory.predict.allocator import round_size
from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.units import gb

log = logging.getLogger(__name__)
MASK = "attention_mask"


@dataclasses.dataclass(frozen=True)
class EvaBatch:
    """One batch EVA reads: ``rows`` x ``width`` tokens, ``tokens`` of them trained (their layer
    inputs enter the SVD), ``padded``: a row is shorter than ``width`` (an attention mask reaches
    the model's attention)."""

    rows: int
    width: int
    tokens: int
    padded: bool

    def dominates(self, other: EvaBatch) -> bool:
        """This batch needs at least the memory of ``other`` (every size >=, a mask if it has one)."""
        return (self.rows >= other.rows and self.width >= other.width and self.tokens >= other.tokens
                and (self.padded or not other.padded))


def eva_batches(samples: Sequence[Any], batch_size: int, max_len: int) -> list[EvaBatch]:
    """The batches the run's EVA pass reads (:func:`lora_gui.models.init_passes.init_batches`), from
    the training samples (``input_ids`` and ``labels`` lists)."""
    from lora_gui.data.text import IGNORE_INDEX
    from lora_gui.models.init_passes import init_batch_rows

    out = []
    for idx in init_batch_rows(len(samples), batch_size):
        width = min(max_len, max(len(samples[i]) for i in idx))
        kept = [min(len(samples[i]), width) for i in idx]
        tokens = sum(sum(1 for label in samples[i].labels[:n] if label != IGNORE_INDEX)
                     for i, n in zip(idx, kept))
        out.append(EvaBatch(len(idx), width, tokens, any(n < width for n in kept)))
    return out


class _CudaBlocks(StorageTracker):
    """The tracker counting each storage at the block the CUDA caching allocator hands out
    (``allocator.round_size``; an empty storage takes none)."""

    def _new_storages(self, tensors: Any) -> list[tuple[torch.UntypedStorage, int]]:
        return [(s, round_size(n) if n else 0) for s, n in super()._new_storages(tensors)]


def plan_batches(cfg: Any, source: str | None, samples: Sequence[Any] | None = None,
                 added_tokens: int | None = None) -> tuple[list[EvaBatch], int]:
    """(the batches the run's EVA pass reads, the embedding rows a chat template adds) for the
    plan: from ``samples`` (the run passes its training samples), else read from the data as the
    run reads it; a bundled architecture without a tokenizer: ``batch_size`` rows of
    ``max_seq_len`` tokens, every token trained, padded (the worst case)."""
    from lora_gui.memory.predict.run_predict import added_rows, model_config_for, train_samples
    from lora_gui.models.init_passes import INIT_BATCHES

    if samples is None and source is not None:
        samples, tokenizer_len, is_chat = train_samples(cfg, source)
        if added_tokens is None:
            added_tokens = added_rows(model_config_for(cfg, source), tokenizer_len, is_chat)
    if samples is None:
        worst = EvaBatch(cfg.batch_size, cfg.max_seq_len, cfg.batch_size * cfg.max_seq_len, True)
        return [worst] * INIT_BATCHES, added_tokens or 0
    return eva_batches(samples, cfg.batch_size, cfg.max_seq_len), added_tokens or 0


class _Forwards:
    """The pass's forwards with peft's ``SVDHook`` on each adapted layer whose input is not the
    tensor an earlier layer read (peft hashes each layer's input on a first forward and hooks one
    layer per distinct input: q / k / v, gate / up share one; the same tensor hashes alike).
    ``self(i)`` gives every hook batch ``i``'s trained-token positions (peft's
    ``mask.nonzero()``: tokens x 2, long) and runs the model on the batch as peft's loop calls
    the run's ``forward_fn`` (``model(**batch)``, labels included). The first forward finds the
    distinct inputs and fits them (peft's hash forward, before it, holds less: no fit)."""

    def __init__(self, model: nn.Module, inputs: list[dict[str, torch.Tensor]],
                 batches: Sequence[EvaBatch], n_components: int, tau: float) -> None:
        from peft.tuners.lora.eva import UNSUPPORTED_LORA_MODULES

        self.model, self.inputs, self.batches = model, inputs, batches
        self.n_components, self.tau = n_components, tau
        self.layers = {n: m for n, m in model.named_modules()  # what peft's EVA hooks on a peft model
                       if hasattr(m, "base_layer") and not isinstance(m, UNSUPPORTED_LORA_MODULES)}
        self.hooks: dict[str, Any] = {}  # layer -> its SVDHook, or None (reads an earlier layer's input)
        self.read: list[weakref.ref] = []  # the first forward's distinct inputs (weakly)
        self.index: torch.Tensor | None = None
        self.held: list[torch.Tensor] = []
        for name, module in self.layers.items():
            module.register_forward_hook(self._hook(name))

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if name not in self.hooks:
                self.hooks[name] = self._svd_hook(name, args)
            if self.hooks[name] is not None:
                self.hooks[name](module, args, output)
        return hook

    def _svd_hook(self, name: str, args: Any) -> Any:
        from peft.tuners.lora.eva import SVDHook, prepare_layer_inputs_fn_language_modeling

        x = args[0] if isinstance(args, (tuple, list)) else args
        if any(ref() is x for ref in self.read):
            return None
        self.read.append(weakref.ref(x))
        hook = SVDHook(n_components=self.n_components, sim_thresh=self.tau, name=name,
                       prepare_layer_inputs_fn=prepare_layer_inputs_fn_language_modeling,
                       gather_distributed_inputs=False)
        hook.model_input = self.index
        return hook

    def hold_converged(self) -> None:
        """peft leaves a converged layer's hook holding the positions of the batch before it
        converged (it stops updating it): at most one earlier batch's positions per hook, each
        at most the largest batch's (the bound: when layers converge is up to the data)."""
        most = max(b.tokens for b in self.batches)
        self.held = [torch.empty((most, 2), dtype=torch.long) for h in self.hooks.values() if h is not None]

    def __call__(self, i: int) -> None:
        self.index = None  # the previous positions go (those held: hold_converged)
        self.index = torch.empty((self.batches[i].tokens, 2), dtype=torch.long)
        for hook in self.hooks.values():
            if hook is not None:
                hook.model_input = self.index
        self.model(**self.inputs[i])


def _fits(batches: Sequence[EvaBatch]) -> list[int]:
    """The forwards to trace: the first batch twice (every layer's first fit, in float32, then a
    fit that replaces that float32 state with float64), then each batch that no other batch
    dominates, in the steady state (each fit replacing a float64 state: the most held)."""
    top = [i for i, b in enumerate(batches)
           if not any(o.dominates(b) and (o != b or j < i) for j, o in enumerate(batches) if j != i)]
    return [0, 0, *top]


def eva_peak_bytes(config: Any, *, dtype: torch.dtype, target_modules: Any, spec: Any,
                   batches: Sequence[EvaBatch], attn_implementation: str = "sdpa",
                   loss_chunk: int = 0, added_tokens: int = 0, device: str = "cpu") -> int:
    """Predicted peak (bytes, source: predicted) of EVA's pass over ``batches`` (see the module
    doc) on the causal LM of ``config`` held in ``dtype`` with the adapter ``spec`` on
    ``target_modules``; the run's batches count (they are on the device for the pass).

    Raises:
        ValueError: no batch to read.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lora_gui.memory.predict.batch_trace import batch_structure
    from lora_gui.memory.predict.model_configs import load_model_config
    from lora_gui.memory.predict.trace import CUDA_CONTEXT_BYTES
    from lora_gui.memory.predict.trace_build import build_text_model, materialize
    from lora_gui.models.init_passes import eva_config

    if not batches:
        raise ValueError("lora_init eva reads the run's training data: no batch to trace")
    cfg = load_model_config(config)
    new_ids = None
    if added_tokens > 0:  # a chat template's tokens: the embeddings grow (as the run's model)
        cfg = copy.deepcopy(cfg)
        text = cfg.get_text_config()
        new_ids = list(range(text.vocab_size, text.vocab_size + added_tokens))
        text.vocab_size += added_tokens
    model = build_text_model(cfg, attn_implementation=attn_implementation, dtype=dtype,
                             lora_rank=spec.rank, lora_alpha=spec.alpha, target_modules=target_modules,
                             loss_chunk=loss_chunk, new_token_ids=new_ids, adapter=spec)
    model.config.use_cache = False  # as the engine loads the model (models.text)
    eva = eva_config()
    with FakeTensorMode(allow_non_fake_inputs=False):
        materialize(model, lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))
        tracker = _CudaBlocks() if device == "cuda" else StorageTracker()
        tracker.track([*model.parameters(), *model.buffers()])
        held = [{k: torch.empty((b.rows, b.width), dtype=torch.long) for k in ("input_ids", "labels", MASK)}
                for b in batches]  # what collate gives (long), every batch on the device at once
        tracker.track([t for batch in held for t in batch.values()])
        # a mask of ones is not given to the model (transformers drops it: batch_trace); it stays held
        inputs = [{k: v for k, v in kept.items() if k != MASK or b.padded} for kept, b in zip(held, batches)]
        model.eval()
        forwards = _Forwards(model, inputs, batches, round(spec.rank * eva.rho), eva.tau)
        with tracker, torch.no_grad(), model.disable_adapter(), batch_structure(False):
            first, *later = _fits(batches)
            forwards(first)
            forwards.hold_converged()
            for i in later:
                forwards(i)
    distinct = sum(h is not None for h in forwards.hooks.values())
    log.info("EVA pass traced: %d batches, %d of %d adapted layers with an SVD, %s",
             len(batches), distinct, len(forwards.layers), gb(tracker.peak_bytes))
    return tracker.peak_bytes + (CUDA_CONTEXT_BYTES if device == "cuda" else 0)
