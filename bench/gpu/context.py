"""What a CUDA process holds outside the tensors a trace sees, stage by stage (the GPU check's
``context`` section): the CUDA context, the libraries' own memory and the cuBLAS workspaces.

At each stage, four readings of the same card:

- ``torch_free_bytes`` / ``torch_total_bytes``: ``torch.cuda.mem_get_info`` (cudaMemGetInfo), the
  figures an out-of-memory error is decided by;
- ``reserved_bytes`` / ``allocated_bytes``: the caching allocator;
- ``outside_allocator_bytes``: total - free - reserved, what this process holds outside the
  allocator (context, kernels loaded so far, library handles);
- ``nvml_used_bytes`` and, where the driver has it, ``nvml_v2_reserved_bytes`` (memory the driver
  keeps for itself, which NVML v1 counts as used).

Stages: before CUDA starts, after the first tensor, after a bf16 matmul with no autograd, after
the same matmul's backward (the autograd engine's device thread gets its own cuBLAS handle and
workspace), after a flash-attention forward and backward.
"""

from __future__ import annotations

import gc
from typing import Any

import torch


def _nvml() -> dict[str, int]:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        out = {"nvml_used_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)}
    except Exception:  # no NVML: the stage says so by leaving the field out
        return {}
    try:
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        out.update(nvml_v2_used_bytes=int(v2.used), nvml_v2_reserved_bytes=int(v2.reserved))
    except Exception:  # an older driver or binding without the v2 query
        pass
    return out


def _reading(stage: str, started: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"stage": stage, **_nvml()}
    if started:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        row.update(torch_free_bytes=free, torch_total_bytes=total, reserved_bytes=reserved,
                   allocated_bytes=torch.cuda.memory_allocated(),
                   outside_allocator_bytes=total - free - reserved)
    return row


def check_context() -> dict[str, Any]:
    """The readings per stage, and the cuBLAS workspace bytes each matmul thread added."""
    gc.collect()
    rows = [_reading("before any CUDA call", torch.cuda.is_initialized())]
    if not torch.cuda.is_available():
        return {"stages": rows}
    x = torch.zeros(1, device="cuda")
    rows.append(_reading("first tensor", True))
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        y = a @ w
    forward_workspace = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
    del y
    rows.append(_reading("bf16 matmul, no autograd", True))
    before = torch.cuda.memory_allocated()
    (a @ w).sum().backward()
    backward_workspace = torch.cuda.memory_allocated() - before - w.grad.numel() * w.grad.element_size()
    rows.append(_reading("matmul backward (autograd thread)", True))
    q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    rows.append(_reading("flash attention forward + backward", True))
    del x, a, w, q
    gc.collect()
    torch.cuda.empty_cache()
    rows.append(_reading("after empty_cache", True))
    props = torch.cuda.get_device_properties(0)
    return {"stages": rows, "forward_thread_workspace_bytes": forward_workspace,
            "backward_thread_workspace_bytes": backward_workspace,
            "device_total_memory_bytes": props.total_memory, "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda}


def markdown(result: dict[str, Any]) -> list[str]:
    """The section as a table (MiB)."""
    mib = 2**20
    out = ["## What the process holds outside the traced tensors (MiB)", "",
           f"cuBLAS workspace added by the first forward matmul: "
           f"{result.get('forward_thread_workspace_bytes', 0) / mib:,.1f}; by the first backward "
           f"matmul (autograd's thread): {result.get('backward_thread_workspace_bytes', 0) / mib:,.1f}", "",
           "| stage | outside allocator | reserved | torch free / total | NVML used | NVML v2 reserved |",
           "|---|---|---|---|---|---|"]
    for r in result.get("stages", []):
        def f(key: str, row: dict[str, Any] = r) -> str:
            return f"{row[key] / mib:,.0f}" if key in row else "-"
        free = f"{f('torch_free_bytes')} / {f('torch_total_bytes')}"
        out.append(f"| {r['stage']} | {f('outside_allocator_bytes')} | {f('reserved_bytes')} | {free} | "
                   f"{f('nvml_used_bytes')} | {f('nvml_v2_reserved_bytes')} |")
    return out + [""]
