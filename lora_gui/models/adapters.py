"""The adapter a run trains: plain LoRA or one of its variants, built once for the engine and
the memory trace alike.

``adapter`` picks the peft method; the same :func:`attach_adapter` wraps the real model in the
engine and the meta model in the memory trace, so a plan traces the very layers that train:

- ``lora``: ``W x + (alpha / r) B A x`` (peft ``LoraConfig``).
- ``dora``: LoRA plus a learned magnitude per output row (``use_dora``); every forward builds
  the dense ``B A`` product and the norm of ``W + B A`` (about one weight matrix of float32
  activations per adapted layer), and with dropout also recomputes the base matmul.
- ``loha``: low-rank Hadamard product ``(B1 A1) * (B2 A2)``: twice LoRA's parameters, and a
  dense weight delta is built per forward.
- ``lokr``: Kronecker product ``W1 kron (B A)`` of factors of each layer's sizes; the dense
  delta is built per forward.
- ``oft``: an orthogonal rotation of each input block of ``lora_rank`` features (block size =
  ``lora_rank``, which must divide every adapted layer's input size).

Options of LoRA and DoRA only: ``rslora`` (scale ``alpha / sqrt(r)``), ``lora_init`` (peft's
initialisations: ``gaussian``, ``pissa`` / ``olora`` which move the weight's principal part into
the adapter), ``lora_fa`` (A frozen after its random init: no gradient, no optimizer state and no
saved layer input for A) and ``lora_plus_ratio`` (LoRA+: B learns this many times faster than A).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from lora_gui.config import ConfigError, RunConfig

log = logging.getLogger(__name__)
LORA_LIKE = ("lora", "dora")


@dataclass(frozen=True)
class AdapterSpec:
    """What the adapter is, independent of the model it goes on (hashable: traces cache on it)."""

    kind: str = "lora"
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    rslora: bool = False
    init: str = "default"
    fa: bool = False

    def for_trace(self) -> AdapterSpec:
        """The same layers with peft's default init: the trace's weights are fake, and PiSSA /
        OLoRA change values, not shapes."""
        return AdapterSpec(self.kind, self.rank, self.alpha, self.dropout, self.rslora, "default", self.fa)


def adapter_spec(cfg: RunConfig) -> AdapterSpec:
    """The adapter of a run's settings."""
    return AdapterSpec(cfg.adapter, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.rslora,
                       cfg.lora_init, cfg.lora_fa)


def peft_config(spec: AdapterSpec, targets: Any, *, task_type: str | None = None,
                tokens: Any = None) -> Any:
    """The peft config of ``spec`` on ``targets`` (``"all-linear"`` or module names).

    Args:
        spec: the adapter.
        targets: peft ``target_modules``.
        task_type: peft task type (``"CAUSAL_LM"`` for text models; None for a bare module).
        tokens: peft ``trainable_token_indices`` (rows added to the vocabulary), LoRA/DoRA only.
    """
    from peft import LoHaConfig, LoKrConfig, LoraConfig, OFTConfig

    targets = list(targets) if isinstance(targets, (list, tuple)) else targets
    common = {"target_modules": targets, "task_type": task_type}
    if spec.kind in LORA_LIKE:
        # loftq: attached with peft's default init, then fitted on the 4-bit base (init_passes)
        init = {"default": True, "gaussian": "gaussian", "loftq": True}.get(spec.init, spec.init)
        if spec.init in ("eva", "corda"):
            from lora_gui.models import init_passes

            common[f"{spec.init}_config"] = getattr(init_passes, f"{spec.init}_config")()
        return LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                          use_dora=spec.kind == "dora", use_rslora=spec.rslora,
                          init_lora_weights=init, trainable_token_indices=tokens, **common)
    if tokens:
        raise ConfigError(f"adapter: {spec.kind} cannot train the rows a chat template adds to the "
                          "vocabulary; use adapter: lora or dora for this chat data")
    if spec.kind == "loha":
        return LoHaConfig(r=spec.rank, alpha=spec.alpha, **common)
    if spec.kind == "lokr":
        return LoKrConfig(r=spec.rank, alpha=spec.alpha, **common)
    if spec.kind == "oft":
        return OFTConfig(r=0, oft_block_size=spec.rank, **common)
    raise ConfigError(f"adapter: {spec.kind!r} is not one of lora, dora, loha, lokr, oft")


def attach_adapter(model: nn.Module, spec: AdapterSpec, targets: Any, *,
                   task_type: str | None = None, tokens: Any = None, corda_rows: Any = None) -> nn.Module:
    """Wraps ``model`` (real or on the meta device) with the adapter; base weights are frozen.
    ``corda_rows``: the training samples CorDA reads first (``lora_init`` corda).

    Raises:
        ConfigError: an OFT block size that does not divide an adapted layer's input size (names
            the layer and the sizes that would), or a variant that cannot train added tokens.
        ValueError: peft refused the targets (the caller names the setting).
    """
    from peft import get_peft_model

    config = peft_config(spec, targets, task_type=task_type, tokens=tokens)
    if spec.kind == "oft":
        _check_oft_blocks(model, config, spec.rank)
    if spec.init == "corda":
        from lora_gui.models.init_passes import run_corda

        config = run_corda(model, config, corda_rows or [])
    with warnings.catch_warnings():  # peft calls a deprecated transformers alias; not ours to fix
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = get_peft_model(model, config)
    if spec.fa:
        freeze_lora_a(peft_model)
    return peft_model


def freeze_lora_a(model: nn.Module) -> int:
    """LoRA-FA: keeps every ``lora_A`` at its random init (no gradient, no AdamW state; autograd
    no longer saves each layer's input for A's gradient). Returns the number of frozen tensors."""
    frozen = 0
    for name, p in model.named_parameters():
        if ".lora_A." in name and p.requires_grad:
            p.requires_grad_(False)
            frozen += 1
    return frozen


def param_groups(model: nn.Module, cfg: RunConfig) -> list[dict[str, Any]]:
    """The trainable parameters as optimizer groups: one group, or with ``lora_plus_ratio`` > 1
    (LoRA+) the ``lora_B`` weights in a group whose learning rate is ``lr`` x the ratio.
    The optimizer state is the same either way (same parameters)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg.lora_plus_ratio <= 1.0:
        return [{"params": [p for _, p in trainable]}]
    fast = [p for n, p in trainable if ".lora_B." in n]
    rest = [p for n, p in trainable if ".lora_B." not in n]
    groups = ({"params": rest}, {"params": fast, "lr": cfg.lr * cfg.lora_plus_ratio})
    return [g for g in groups if g["params"]]


def _check_oft_blocks(model: nn.Module, config: Any, block: int) -> None:
    """peft would quietly change the block size of a layer it does not divide; refuse instead."""
    from peft.tuners.tuners_utils import check_target_module_exists

    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or not _targeted(config, name, check_target_module_exists):
            continue
        size = module.in_features
        if size % block:
            fits = [d for d in range(2, min(size, 256) + 1) if size % d == 0][:8]
            raise ConfigError(f"lora_rank: OFT block size {block} does not divide the input size "
                              f"{size} of layer {name}; block sizes that do: "
                              f"{', '.join(map(str, fits)) or 'none below 256'}")


def _targeted(config: Any, name: str, check: Any) -> bool:
    if config.target_modules == "all-linear":
        return not name.endswith(("lm_head", "output", "embed_out"))
    return bool(check(config, name))


INIT_FILE = "lora_init.safetensors"  # run folder: what a lora_init pass made before step 1


def save_init(model: nn.Module, path: Any, with_base: bool = True) -> int:
    """Writes what a decomposing initialisation (PiSSA's SVD, OLoRA's QR) produced: every adapted
    layer's residual base weight and its initial A and B, so that a resume loads them instead of
    decomposing again. Atomic (temp file, then rename). Returns the tensors written."""
    import os
    from pathlib import Path

    from safetensors.torch import save_file

    tensors = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            if with_base:  # the residual a decomposing init left in the base (pissa, olora, corda)
                tensors[f"{name}.base_layer.weight"] = module.get_base_layer().weight.detach()
            tensors[f"{name}.lora_A.default.weight"] = module.lora_A["default"].weight.detach()
            tensors[f"{name}.lora_B.default.weight"] = module.lora_B["default"].weight.detach()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({k: v.cpu().contiguous() for k, v in tensors.items()}, tmp)
    os.replace(tmp, path)
    return len(tensors)


def load_init(model: nn.Module, path: Any, init: str) -> None:
    """Puts a saved initialisation (:func:`save_init`) into a model whose adapter was attached
    without decomposing, and records ``init`` in its peft config again (a saved adapter then says
    how it was initialised: peft redoes it on the original base when loading it).

    Raises:
        ConfigError: the file does not match the model's adapted layers (names the file).
    """
    from safetensors.torch import load_file

    saved = load_file(str(path))
    params = dict(model.named_parameters())
    missing = [k for k in saved if k not in params]
    if missing:
        raise ConfigError(f"{path}: does not match this run's adapter ({len(missing)} tensors, first "
                          f"{missing[0]}); start the run again without resuming")
    for key, value in saved.items():
        params[key].data = value.to(params[key].device, params[key].dtype, copy=True)  # own storage
    if init != "loftq":  # a LoftQ adapter is plain LoRA on its 4-bit base (peft's own recipe)
        model.peft_config["default"].init_lora_weights = init


def save_as_plain_lora(model: nn.Module, adapter_dir: Any, init_file: Any) -> bool:
    """A CorDA adapter's base holds a residual that peft cannot rebuild when loading it, so the
    saved adapter (in ``adapter_dir``) is rewritten as plain LoRA on the original base, peft's
    own conversion: ``W + dW = W_res + s B A`` with ``W = W_res + s B0 A0`` gives
    ``dW = s' [B | -B0] [A ; A0]`` at rank 2r (alpha doubled, or times sqrt 2 with rsLoRA, so
    that the scale stays). ``init_file``: the initial A0 and B0 (:func:`save_init`). Returns
    False (nothing done) for every other adapter."""
    import json
    import os
    from pathlib import Path

    import torch
    from safetensors.torch import load_file, save_file

    config = getattr(model, "peft_config", {}).get("default")
    if getattr(config, "init_lora_weights", None) != "corda":  # LoHa / LoKr / OFT have no such field
        return False
    adapter_dir = Path(adapter_dir)
    initial = {k.replace(".default.", "."): v for k, v in load_file(str(init_file)).items()}
    trained = load_file(str(adapter_dir / "adapter_model.safetensors"))
    for key, value in trained.items():
        if ".lora_A." in key:
            trained[key] = torch.cat([value, initial[key].to(value.dtype)], dim=0).contiguous()
        elif ".lora_B." in key:
            trained[key] = torch.cat([value, -initial[key].to(value.dtype)], dim=1).contiguous()
    save_file(trained, adapter_dir / "adapter_model.safetensors", metadata={"format": "pt"})
    path = adapter_dir / "adapter_config.json"
    saved = json.loads(path.read_text())
    saved.update(init_lora_weights=True, corda_config=None, r=saved["r"] * 2,
                 lora_alpha=saved["lora_alpha"] * (2 ** 0.5 if saved.get("use_rslora") else 2))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(saved, indent=2))
    os.replace(tmp, path)
    return True


@contextlib.contextmanager
def decomposition_progress(init: str | None, every: int = 8) -> Iterator[None]:
    """Logs a progress line while peft decomposes the adapted weights (``init`` pissa / olora;
    None: nothing to report): the first layer and every ``every``-th, with the layer's name,
    its size and the time so far, and a closing line with the count."""
    if init not in ("pissa", "olora"):
        yield
        return
    from peft.tuners.lora.layer import LoraLayer

    name = "pissa_init" if init == "pissa" else "olora_init"
    real = getattr(LoraLayer, name)
    done, start = [0], time.perf_counter()

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(self, *args, **kwargs)
        done[0] += 1
        if done[0] == 1 or done[0] % every == 0:
            w = self.get_base_layer().weight
            log.info("lora_init %s: %d layers decomposed (last %s x %s), %.1f s", init, done[0],
                     w.shape[0], w.shape[1], time.perf_counter() - start)
        return result

    setattr(LoraLayer, name, timed)
    try:
        yield
    finally:
        setattr(LoraLayer, name, real)
    log.info("lora_init %s: %d layers decomposed in %.1f s", init, done[0], time.perf_counter() - start)
