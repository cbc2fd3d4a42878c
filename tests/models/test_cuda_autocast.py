"""CUDA autocast's casts applied on a CPU (lora_gui.models.cuda_autocast), checked against torch's
own CUDA autocast kernels, which run on fake CUDA tensors without a GPU."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from lora_gui.models import cuda_autocast
from lora_gui.models.cuda_autocast import FLOAT32, FLOAT32_UNLESS_DTYPE, LOWER, CudaAutocast, forward_under

T = torch.Tensor
_8x8 = (8, 8)



# every listed function with arguments it accepts: (x, y) are (8, 8) tensors of the case's dtypes
CASES = {
    F.linear: lambda x, y: F.linear(x, y), F.prelu: lambda x, y: F.prelu(x, y[0, :1]),
    F.conv1d: lambda x, y: F.conv1d(x.view(1, 8, 8), y.view(8, 8, 1)),
    F.conv2d: lambda x, y: F.conv2d(x.view(1, 8, 2, 4), y.view(8, 8, 1, 1)),
    F.conv3d: lambda x, y: F.conv3d(x.view(1, 8, 2, 2, 2), y.view(8, 8, 1, 1, 1)),
    torch.conv1d: lambda x, y: torch.conv1d(x.view(1, 8, 8), y.view(8, 8, 1)),
    torch.conv2d: lambda x, y: torch.conv2d(x.view(1, 8, 2, 4), y.view(8, 8, 1, 1)),
    torch.conv3d: lambda x, y: torch.conv3d(x.view(1, 8, 2, 2, 2), y.view(8, 8, 1, 1, 1)),
    F.conv_transpose1d: lambda x, y: F.conv_transpose1d(x.view(1, 8, 8), y.view(8, 8, 1)),
    F.conv_transpose2d: lambda x, y: F.conv_transpose2d(x.view(1, 8, 2, 4), y.view(8, 8, 1, 1)),
    F.conv_transpose3d: lambda x, y: F.conv_transpose3d(x.view(1, 8, 2, 2, 2), y.view(8, 8, 1, 1, 1)),
    F.scaled_dot_product_attention: lambda x, y: F.scaled_dot_product_attention(
        x.view(1, 1, 8, 8), y.view(1, 1, 8, 8), x.view(1, 1, 8, 8)),
    torch.matmul: lambda x, y: torch.matmul(x, y), T.matmul: lambda x, y: x.matmul(y),
    T.__matmul__: lambda x, y: x @ y, T.__rmatmul__: lambda x, y: T.__rmatmul__(x, y),
    torch.mm: lambda x, y: torch.mm(x, y), T.mm: lambda x, y: x.mm(y),
    torch.bmm: lambda x, y: torch.bmm(x.view(1, 8, 8), y.view(1, 8, 8)),
    T.bmm: lambda x, y: x.view(1, 8, 8).bmm(y.view(1, 8, 8)),
    torch.baddbmm: lambda x, y: torch.baddbmm(x.view(1, 8, 8), y.view(1, 8, 8), x.view(1, 8, 8)),
    T.baddbmm: lambda x, y: x.view(1, 8, 8).baddbmm(y.view(1, 8, 8), x.view(1, 8, 8)),
    torch.addmm: lambda x, y: torch.addmm(x, y, x), T.addmm: lambda x, y: x.addmm(y, x),
    torch.addbmm: lambda x, y: torch.addbmm(x, y.view(1, 8, 8), x.view(1, 8, 8)),
    T.addbmm: lambda x, y: x.addbmm(y.view(1, 8, 8), x.view(1, 8, 8)),
    torch.mv: lambda x, y: torch.mv(x, y[0]), T.mv: lambda x, y: x.mv(y[0]),
    torch.addmv: lambda x, y: torch.addmv(x[0], y, x[1]), T.addmv: lambda x, y: x[0].addmv(y, x[1]),
    torch.einsum: lambda x, y: torch.einsum("ij,jk->ik", x, y),
    F.layer_norm: lambda x, y: F.layer_norm(x, (8,)),
    torch.layer_norm: lambda x, y: torch.layer_norm(x, (8,)),
    F.group_norm: lambda x, y: F.group_norm(x.view(2, 8, 4), 2),
    torch.group_norm: lambda x, y: torch.group_norm(x.view(2, 8, 4), 2),
    F.rms_norm: lambda x, y: F.rms_norm(x, (8,)), torch.rms_norm: lambda x, y: torch.rms_norm(x, (8,)),
    torch.pow: lambda x, y: torch.pow(x, 2), T.pow: lambda x, y: x.pow(2), T.__pow__: lambda x, y: x ** 2,
    T.__rpow__: lambda x, y: 2 ** x, T.__rtruediv__: lambda x, y: 1 / x,
    T.__rdiv__: lambda x, y: x.__rdiv__(y),
    torch.square: lambda x, y: torch.square(x), T.square: lambda x, y: x.square(),
    F.normalize: lambda x, y: F.normalize(x, dim=-1),
    torch.linalg.matrix_norm: lambda x, y: torch.linalg.matrix_norm(x),
    torch.dist: lambda x, y: torch.dist(x, y), T.dist: lambda x, y: x.dist(y),
    torch.renorm: lambda x, y: torch.renorm(x, 2, 0, 1.0), T.renorm: lambda x, y: x.renorm(2, 0, 1.0),
    F.interpolate: lambda x, y: F.interpolate(x.view(1, 8, 2, 4), scale_factor=2.0, mode="nearest"),
    F.softplus: lambda x, y: F.softplus(x), F.cosine_similarity: lambda x, y: F.cosine_similarity(x, y),
    torch.norm: lambda x, y: torch.norm(x), T.norm: lambda x, y: x.norm(dim=-1),
    torch.linalg.vector_norm: lambda x, y: torch.linalg.vector_norm(x),
    torch.logsumexp: lambda x, y: torch.logsumexp(x, -1), T.logsumexp: lambda x, y: x.logsumexp(-1),
    torch.cdist: lambda x, y: torch.cdist(x, y),
    F.mse_loss: lambda x, y: F.mse_loss(x, y), F.l1_loss: lambda x, y: F.l1_loss(x, y),
    F.smooth_l1_loss: lambda x, y: F.smooth_l1_loss(x, y), F.huber_loss: lambda x, y: F.huber_loss(x, y),
    F.nll_loss: lambda x, y: F.nll_loss(x, torch.zeros(8, dtype=torch.long, device=x.device)),
    F.cross_entropy: lambda x, y: F.cross_entropy(x, torch.zeros(8, dtype=torch.long, device=x.device)),
    F.kl_div: lambda x, y: F.kl_div(x, y, reduction="batchmean"),
    F.binary_cross_entropy_with_logits: lambda x, y: F.binary_cross_entropy_with_logits(x, y),
    torch.softmax: lambda x, y: torch.softmax(x, -1), T.softmax: lambda x, y: x.softmax(-1),
    F.softmax: lambda x, y: F.softmax(x, -1), torch.log_softmax: lambda x, y: torch.log_softmax(x, -1),
    T.log_softmax: lambda x, y: x.log_softmax(-1), F.log_softmax: lambda x, y: F.log_softmax(x, -1),
}
for _name in ("exp", "expm1", "log", "log2", "log10", "log1p", "reciprocal", "rsqrt", "acos", "asin",
              "cosh", "sinh", "tan", "erfinv", "sum", "prod", "cumsum", "cumprod"):
    _dim = (-1,) if _name in ("cumsum", "cumprod") else ()
    CASES[getattr(torch, _name)] = lambda x, y, n=_name, d=_dim: getattr(torch, n)(x, *d)
    CASES[getattr(T, _name)] = lambda x, y, n=_name, d=_dim: getattr(x, n)(*d)
# unlisted: autocast leaves them alone (the inputs' own dtypes decide)
UNLISTED = {
    "gelu": lambda x, y: F.gelu(x), "silu": lambda x, y: F.silu(x), "mean": lambda x, y: x.mean(-1),
    "add": lambda x, y: x + y, "mul": lambda x, y: x * y, "cat": lambda x, y: torch.cat([x, y]),
    "softmax with dtype": lambda x, y: torch.softmax(x, -1, dtype=torch.bfloat16),
    "sum with dtype": lambda x, y: x.sum(dtype=torch.bfloat16), "tanh": lambda x, y: x.tanh(),
    "interpolate bilinear": lambda x, y: F.interpolate(x.view(1, 8, 2, 4), scale_factor=2.0, mode="bilinear"),
    "interpolate area": lambda x, y: F.interpolate(x.view(1, 8, 2, 4), size=(1, 2), mode="area"),
    "interpolate positional": lambda x, y: F.interpolate(x.view(1, 8, 2, 4), None, 2.0, "area"),
    "var": lambda x, y: x.var(-1), "sqrt": lambda x, y: x.sqrt(), "cos": lambda x, y: x.cos(),
    "sigmoid": lambda x, y: x.sigmoid(),
    "batch_norm": lambda x, y: F.batch_norm(x, None, None, training=True),
}
DTYPES = [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32), (torch.bfloat16, torch.float32),
          (torch.float16, torch.float16)]


def _dtypes(fn, x_dtype, y_dtype, device: str, emulate: bool, cast: torch.dtype):  # noqa: ANN001, ANN202
    """The output dtype(s) of ``fn`` on fake tensors of ``device`` under the real autocast (CUDA)
    or the emulation (CPU); or the error's type when the op refuses the inputs."""
    with FakeTensorMode():
        x = torch.empty(_8x8, dtype=x_dtype, device=device)
        y = torch.empty(_8x8, dtype=y_dtype, device=device)
        if emulate:
            with CudaAutocast(cast):
                out = _call(fn, x, y)
        else:
            torch.set_autocast_enabled("cuda", True)
            torch.set_autocast_dtype("cuda", cast)
            torch.autocast_increment_nesting()
            try:
                out = _call(fn, x, y)
            finally:
                torch.autocast_decrement_nesting()
                torch.set_autocast_enabled("cuda", False)
                torch.clear_autocast_cache()
    return out


def _call(fn, x, y):  # noqa: ANN001, ANN202
    try:
        out = fn(x, y)
    except (RuntimeError, TypeError) as e:
        return type(e).__name__
    return [t.dtype for t in (out if isinstance(out, tuple) else (out,))]


def test_every_listed_op_has_a_case() -> None:
    assert LOWER | FLOAT32 | FLOAT32_UNLESS_DTYPE | {cuda_autocast.INTERPOLATE} <= set(CASES)


@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", [getattr(f, "__qualname__", str(f)) for f in CASES] + list(UNLISTED))
def test_casts_as_torch_cuda_autocast(name: str, cast: torch.dtype) -> None:
    fn = UNLISTED.get(name) or next(f for k, f in CASES.items() if getattr(k, "__qualname__", str(k)) == name)
    for x_dtype, y_dtype in DTYPES:
        real = _dtypes(fn, x_dtype, y_dtype, "cuda", emulate=False, cast=cast)
        emulated = _dtypes(fn, x_dtype, y_dtype, "cpu", emulate=True, cast=cast)
        if isinstance(real, str):  # the CUDA kernel refuses these inputs: nothing to compare
            continue
        assert emulated == real, (name, x_dtype, y_dtype)


def test_a_trainable_leaf_is_cast_once_per_region() -> None:
    w = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    casts = []
    original = torch.Tensor.to

    def counting_to(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if self is w:
            casts.append(1)
        return original(self, *args, **kwargs)

    torch.Tensor.to = counting_to
    try:
        with CudaAutocast(torch.bfloat16):
            F.linear(x, w)
            F.linear(x, w)
        with CudaAutocast(torch.bfloat16):
            F.linear(x, w)
    finally:
        torch.Tensor.to = original
    assert len(casts) == 2  # once in each region


def test_the_emulation_is_seen_by_recomputing_layers() -> None:
    assert cuda_autocast.autocast_dtype("cpu") is None
    with CudaAutocast(torch.float16):
        assert cuda_autocast.autocast_dtype("cpu") == torch.float16
        with CudaAutocast(torch.bfloat16):
            assert cuda_autocast.emulated_dtype() == torch.bfloat16
        assert cuda_autocast.emulated_dtype() == torch.float16
        recompute = cuda_autocast.same_autocast(lambda t: F.layer_norm(t, (8,)), "cpu")
    assert cuda_autocast.emulated_dtype() is None
    assert recompute(torch.randn(2, 8, dtype=torch.float16)).dtype == torch.float32  # as in the forward


def _tiny_unet_step(lean: bool, checkpointing: bool) -> tuple[dict[str, torch.Tensor], int]:
    """LoRA gradients and the step's tracked peak of a tiny bf16 SDXL UNet under the emulation."""
    from peft import LoraConfig

    from lora_gui.memory.runtime.tracker import StorageTracker
    from lora_gui.models.build_diffusion import build_sdxl_pipeline
    from lora_gui.models.checkpointing import enable_checkpointing
    from lora_gui.models.lean_backward import lean_frozen_layers

    unet = build_sdxl_pipeline(seed=0).unet.to(torch.bfloat16)
    unet.requires_grad_(False)
    torch.manual_seed(0)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                init_lora_weights="gaussian"))
    for p in unet.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # peft's float32 adapters over 16-bit weights
    unet = copy.deepcopy(unet)
    if checkpointing:
        enable_checkpointing(unet)
    if lean:
        lean_frozen_layers(unet)
    unet.train()
    gen = torch.Generator().manual_seed(1)
    sample = torch.randn(2, 4, 8, 8, generator=gen, dtype=torch.bfloat16)
    kwargs = {"encoder_hidden_states": torch.randn(2, 77, 64, generator=gen, dtype=torch.bfloat16),
              "added_cond_kwargs": {"text_embeds": torch.randn(2, 32, generator=gen, dtype=torch.bfloat16),
                                    "time_ids": torch.randn(2, 6, generator=gen, dtype=torch.bfloat16)}}
    tracker = StorageTracker()
    with tracker, forward_under(unet, torch.bfloat16):
        out = unet(sample, torch.tensor([10, 500]), **kwargs).sample
        assert out.dtype == torch.float32  # accelerate's outputs, converted
        out.square().mean().backward()
    grads = {n: p.grad for n, p in unet.named_parameters() if p.requires_grad}
    return grads, tracker.peak_bytes


@pytest.mark.parametrize("checkpointing", [False, True])
def test_lean_layers_and_checkpointing_recompute_under_the_emulation(checkpointing: bool) -> None:
    """The recomputes (lean layers, checkpointed blocks) run under the emulated autocast of their
    forward: the same gradients, bit for bit, as the plain step (a recompute in another dtype
    would change them, or fail checkpointing's metadata check)."""
    plain, plain_peak = _tiny_unet_step(lean=False, checkpointing=False)
    grads, peak = _tiny_unet_step(lean=True, checkpointing=checkpointing)
    assert plain.keys() == grads.keys()
    for name in plain:
        assert torch.equal(plain[name], grads[name]), name
    assert peak < plain_peak


def test_forward_under_restores_the_forward() -> None:
    model = torch.nn.Linear(4, 4)
    with forward_under(model, torch.bfloat16):
        assert model(torch.randn(1, 4)).dtype == torch.float32
        assert "forward" in model.__dict__
    assert "forward" not in model.__dict__
    with forward_under(model, None):
        assert "forward" not in model.__dict__
