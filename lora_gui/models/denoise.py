"""The training loss of an image step, UNet and DiT alike: what the engine runs and the memory
trace replays (models layer, so both can import it)."""

from __future__ import annotations

import torch

from lora_gui.models.diffusion import Encoded
from lora_gui.models.dit import FlowMatching
from lora_gui.models.flops import counted_step_flops


def unet_loss(unet, scheduler, enc: Encoded, noise: torch.Tensor, timesteps: torch.Tensor,
              reduction: str = "mean") -> torch.Tensor:
    """Noise-prediction MSE (epsilon or v target, by the scheduler's prediction_type); for DiT
    models the flow-matching loss of their objective (:class:`lora_gui.models.dit.FlowMatching`,
    ``timesteps`` then being the uniform draws it maps through its timestep density)."""
    if isinstance(scheduler, FlowMatching):
        return scheduler.loss(unet, enc, noise, timesteps, reduction)
    noisy, target = noised(scheduler, enc, noise, timesteps)
    return denoise_loss(unet, enc, noisy, target, timesteps, reduction)


def noised(scheduler, enc: Encoded, noise: torch.Tensor, timesteps: torch.Tensor,
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The noisy latents and the UNet's target (noise, or velocity for v-prediction)."""
    noisy = scheduler.add_noise(enc.latents, noise, timesteps)
    if scheduler.config.prediction_type == "v_prediction":
        return noisy, scheduler.get_velocity(enc.latents, noise, timesteps)
    return noisy, noise


def denoise_loss(unet, enc: Encoded, noisy: torch.Tensor, target: torch.Tensor, timesteps: torch.Tensor,
                 reduction: str = "mean") -> torch.Tensor:
    """The UNet's prediction for ``noisy`` against ``target``, mean squared per image."""
    extra = {}
    if enc.pooled is not None:
        extra["added_cond_kwargs"] = {"text_embeds": enc.pooled, "time_ids": enc.time_ids}
    pred = unet(noisy.to(enc.hidden.dtype), timesteps, enc.hidden, **extra).sample
    per_image = torch.nn.functional.mse_loss(pred.float(), target.float(), reduction="none")
    per_image = per_image.mean(dim=(1, 2, 3))
    return per_image.sum() if reduction == "sum" else per_image.mean()


def step_flops(unet, scheduler, enc: Encoded, noise: torch.Tensor, timesteps: torch.Tensor) -> int:
    """Useful FLOPs of the loss of ``enc``'s images and its gradients (forward, activation
    gradients, the adapter's weight gradients; :func:`lora_gui.models.flops.counted_step_flops`
    on fake copies: nothing is computed, the model is untouched). The run's count per bucket
    (:mod:`lora_gui.engine.image.speed`) and the plan's (:mod:`lora_gui.memory.predict.image_speed`)
    are this one function."""
    if isinstance(scheduler, FlowMatching):
        def loss(latents, hidden, pooled, time_ids, noise, timesteps):  # noqa: ANN001, ANN202
            return unet_loss(unet, scheduler, Encoded(latents, hidden, pooled, time_ids), noise, timesteps,
                             reduction="sum")
        return counted_step_flops(unet, loss, enc.latents, enc.hidden, enc.pooled, enc.time_ids, noise,
                                  timesteps)

    def denoise(noisy, hidden, pooled, time_ids, target, timesteps):  # noqa: ANN001, ANN202
        return denoise_loss(unet, Encoded(noisy, hidden, pooled, time_ids), noisy, target, timesteps,
                            reduction="sum")
    # noising is elementwise (no FLOPs) and, in Euler's scheduler, looks its step up by value,
    # which fake tensors cannot: it runs on the real image
    with torch.no_grad():
        noisy, target = noised(scheduler, enc, noise, timesteps)
    return counted_step_flops(unet, denoise, noisy, enc.hidden, enc.pooled, enc.time_ids, target, timesteps)
