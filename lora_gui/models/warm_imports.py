"""Loads diffusers' lazily imported classes once, before the dashboard serves requests.

diffusers imports a class on the first attribute access of its lazy top-level module. Two threads
making that first access at once (the Train form's planner and a starting run, both threads of
the dashboard's process) can be handed a partly initialised module, and one of them fails with
"cannot import name 'AutoencoderKL' from 'diffusers'": that run failed before its first step.
The dashboard calls :func:`load_diffusers` once at start-up (about 6 s on a 2-core CPU), so later
threads find every class loaded. The CLI runs one thread and needs none of this.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

# every class lora_gui takes from diffusers' top level: models, schedulers and pipelines
CLASSES = ("AutoencoderKL", "UNet2DConditionModel", "SD3Transformer2DModel", "FluxTransformer2DModel",
           "DDPMScheduler", "DDIMScheduler", "EulerDiscreteScheduler", "FlowMatchEulerDiscreteScheduler",
           "StableDiffusionPipeline",
           "StableDiffusionXLPipeline", "StableDiffusion3Pipeline", "FluxPipeline",
           "AutoencoderKLWan", "WanTransformer3DModel", "WanPipeline",
           "AutoencoderKLLTXVideo", "LTXVideoTransformer3DModel", "LTXPipeline")
SUBMODULES = ("diffusers.models.activations", "diffusers.models.attention_dispatch",
              "diffusers.models.attention_processor", "diffusers.models.embeddings",
              "diffusers.models.transformers.transformer_flux", "diffusers.training_utils",
              "diffusers.utils")


def load_diffusers() -> None:
    """Imports every diffusers class and submodule lora_gui uses (see the module doc)."""
    import importlib

    start = time.perf_counter()
    import diffusers

    for name in CLASSES:
        getattr(diffusers, name)
    for module in SUBMODULES:
        importlib.import_module(module)
    log.info("diffusers classes loaded in %.1f s", time.perf_counter() - start)
