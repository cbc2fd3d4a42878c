"""Peak memory of an image run's encoding pass (VAE encoder + text encoders, no gradients),
traced on fake tensors with the run's own modules and code.

An image run encodes pictures in two places: the one-time caching pass (every training image
once, batch 1, and the held-out images square at the run's resolution) and, with
``cache_latents=off``, every step. While it encodes, the VAE and the text encoders sit on the
device beside the transformer / UNet, and the VAE encoder's activations at full pixel
resolution are alive (a 1024 px picture through a 128-channel first block is 512 MiB per
float32 tensor): for a small denoiser this pass, not the training step, is the run's peak.

:func:`trace_encode_peak` runs :func:`lora_gui.models.diffusion.encode_pixels` (the code
the run calls) with every weight of the loaded modules swapped for a fake tensor of the same
shape and dtype (``torch.nn.utils.stateless``), so nothing is computed or allocated, and counts
the storages it creates with a :class:`~lora_gui.memory.runtime.tracker.StorageTracker` (source:
predicted). :func:`held_bytes` gives what the run keeps on the host between steps (cached
latents and embeddings, the encoded held-out set), which is device memory when the run trains
on the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module

from lora_gui.memory.runtime.tracker import StorageTracker

if TYPE_CHECKING:
    from lora_gui.memory.predict.trace import TraceResult

CACHE_BYTES_PER_VALUE = 4  # cached latents and embeddings are kept as float32 (engine/image/inputs.py)


def denoiser_waits_for_cache(cache_mode: str, device_type: str) -> bool:
    """True when the run moves the denoiser (UNet / transformer) to the device only after its
    caching pass (a GPU run with a latent cache; on a CPU the host is the device anyway)."""
    return device_type == "cuda" and cache_mode != "off"


def module_bytes(modules: Iterable[nn.Module]) -> int:
    """Bytes of the parameters and buffers of ``modules`` (each storage once)."""
    seen: dict[int, int] = {}
    for module in modules:
        for t in (*module.parameters(), *module.buffers()):
            seen[id(t.untyped_storage())] = t.untyped_storage().nbytes()
    return sum(seen.values())


@contextlib.contextmanager
def _fake_weights(modules: Sequence[nn.Module], mode: FakeTensorMode,
                  device: torch.device) -> Iterator[list[torch.Tensor]]:
    """Swaps every parameter and buffer of ``modules`` for a fake tensor of the same shape,
    dtype and device for the duration (the real weights are untouched and not copied); a
    module built on the meta device (the plan before a run) gets fakes on ``device``."""

    def fake_of(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            return mode.from_tensor(t)
        with mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)

    with contextlib.ExitStack() as stack:
        fakes: list[torch.Tensor] = []
        for module in modules:
            named = {**dict(module.named_parameters(remove_duplicate=False)),
                     **dict(module.named_buffers(remove_duplicate=False))}
            swap = {name: fake_of(t) for name, t in named.items()}
            stack.enter_context(_reparametrize_module(module, swap, tie_weights=True))
            fakes += swap.values()
        yield fakes


def trace_encode_peak(model, buckets: Sequence[tuple[int, int]], device: torch.device,
                      caption: str = "a photo") -> int:
    """Largest transient bytes of encoding one picture of any of ``buckets`` ((width, height)
    px) and its caption with the run's VAE and text encoders: pixels, VAE encoder activations,
    the latent distribution and sample, the prompt embeddings (weights not included).

    Args:
        model: the run's :class:`~lora_gui.models.diffusion.ImageModel` (VAE and encoders loaded).
        buckets: picture sizes the pass encodes (training buckets and the held-out square).
        device: the run's device.
    """
    from lora_gui.models.diffusion import encode_pixels

    if device.type == "cuda" and not torch.cuda.is_available():
        device = torch.device("cpu")  # a plan for a GPU made without one: the same bytes
    peak = 0
    modules = [model.vae, *model.text_encoders]
    largest = max(w * h for w, h in buckets)  # activations scale with the area: trace the largest
    for w, h in sorted(b for b in set(buckets) if b[0] * b[1] == largest):
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        tracker = StorageTracker()
        with torch.no_grad(), mode, _fake_weights(modules, mode, device) as fakes:
            tracker.track(fakes)  # weights are counted by the caller
            start = tracker.live_bytes
            with tracker:
                pixels = [torch.empty(3, h, w)]  # load_pixels' float32 (3, H, W), on the host
                time_ids = [[h, w, 0, 0, h, w]]
                encoded = encode_pixels(model, pixels, [caption], time_ids, device, sample=True)
                del encoded, pixels
        peak = max(peak, tracker.peak_bytes - start)
    return peak


def held_bytes(*, train_buckets: Sequence[tuple[int, int]], eval_images: int, resolution: int,
               latent_channels: int, vae_factor: int, text_tokens: int, text_width: int,
               pooled: int, embed_dtype: torch.dtype, cache_mode: str, train_captions: int | None = None,
               time_ids: int = 0, caching_pass: bool = False) -> int:
    """Host bytes the run keeps between steps: the encoded held-out set (latents float32, text
    embeddings in the encoders' dtype) and, with ``cache_latents=ram``, every training image's
    cached latents (and ``time_ids`` values) and each of its ``train_captions`` distinct captions'
    embeddings (float32; None: one caption per image). ``caching_pass``: at the caching pass's
    peak instead, where a repeated caption's fresh embeddings are alive beside the kept ones until
    the cache drops them for the kept copy: one caption more."""
    size = torch.empty((), dtype=embed_dtype).element_size()
    lat = lambda w, h: latent_channels * (h // vae_factor) * (w // vae_factor) * 4  # noqa: E731
    prompt = text_tokens * text_width + pooled  # values of one caption's embeddings
    held = eval_images * (lat(resolution, resolution) + (prompt + time_ids) * size)
    if cache_mode == "ram":
        captions = len(train_buckets) if train_captions is None else train_captions
        held += sum(lat(w, h) + time_ids * CACHE_BYTES_PER_VALUE for w, h in train_buckets)
        repeated = caching_pass and captions < len(train_buckets)
        held += (captions + repeated) * prompt * CACHE_BYTES_PER_VALUE
    return held


def trace_vae_encode(vae_config: dict, height: int, width: int) -> int:
    """Transient bytes of encoding one ``height x width`` picture with an AutoencoderKL built from
    ``vae_config`` (float32, fake tensors; pixels, encoder activations, latent sample), for the
    planner, which has no loaded VAE."""
    from diffusers import AutoencoderKL

    from lora_gui.memory.predict.trace import materialize

    with torch.device("meta"):
        vae = AutoencoderKL(**vae_config)
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    tracker = StorageTracker()
    with torch.no_grad(), mode:
        materialize(vae, lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))
        tracker.track([*vae.parameters(), *vae.buffers()])
        start = tracker.live_bytes
        with tracker:
            pixels = [torch.empty(3, height, width)]
            latents = vae.encode(torch.stack(pixels)).latent_dist.sample()
            del latents, pixels
    return tracker.peak_bytes - start


def planned_encoding_pass(cache_mode: str, step: TraceResult, encoder_bytes: int, vae_config: dict,
                          height: int, width: int) -> int:
    """Predicted peak of an image run's encoding pass, UNet or DiT alike (source: predicted):
    the VAE and text encoders (``encoder_bytes``), the denoiser's weights and LoRA from
    ``step``'s breakdown unless it joins the device after the cache
    (:func:`denoiser_waits_for_cache`), the VAE encoder's activations on the largest
    ``height x width`` picture, and ``step``'s CUDA context and cuBLAS workspace. Text-encoder
    activations (one caption's forward) are left out: small beside the weights. With
    ``cache_mode="off"`` every step encodes its batch, and from the second step on the optimizer
    state is alive beside it: that is counted too."""
    weights = encoder_bytes
    if not denoiser_waits_for_cache(cache_mode, step.device):
        weights += step.breakdown["frozen_weights"] + step.breakdown["lora_params"]
    if cache_mode == "off":
        weights += step.breakdown.get("optimizer_state", 0)
    overheads = step.cuda_overheads.get("cuda_context", 0) + step.cuda_overheads.get("cublas_workspace", 0)
    return weights + trace_vae_encode(vae_config, height, width) + overheads
