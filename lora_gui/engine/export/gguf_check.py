"""Read a written GGUF back with gguf's GGUFReader and compare it with what was meant: every
tensor (name, shape, values within the format's precision) and the metadata.

Precision per stored type: F32 exact; F16 exact to float16 rounding of the float32 value; BF16
exact to bfloat16 rounding (torch's round-to-nearest-even); Q8_0 within one quantization step
of its block (|x - y| <= max|block| / 127; the step is amax / 127, stored as float16).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

Q8_BLOCK = 32  # values per q8_0 block (ggml's QK8_0)


class GgufMismatch(ValueError):
    """A written GGUF does not hold what was meant (a bug, never the user's input)."""


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, tuple[Any, np.ndarray]]]:
    """(metadata key -> value, tensor name -> (stored type, float32 values in numpy order))."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    tensors = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(n) for n in reversed(t.shape))  # ggml ne -> numpy order
        tensors[t.name] = (t.tensor_type, np.asarray(values, dtype=np.float32).reshape(shape))
    return meta, tensors


def stored_exactly(kind: Any, meant: np.ndarray) -> np.ndarray | None:
    """What a lossless-rounding type must hold for ``meant`` (None: q8_0, bounded instead)."""
    import gguf

    types = gguf.GGMLQuantizationType
    if kind == types.F32:
        return meant.astype(np.float32)
    if kind == types.F16:
        return meant.astype(np.float16).astype(np.float32)
    if kind == types.BF16:
        return torch.from_numpy(meant).to(torch.bfloat16).to(torch.float32).numpy()
    return None


def q8_error_ok(meant: np.ndarray, got: np.ndarray) -> bool:
    blocks = meant.reshape(-1, Q8_BLOCK)
    step = np.abs(blocks).max(axis=1, keepdims=True) / 127
    return bool((np.abs(got.reshape(-1, Q8_BLOCK) - blocks) <= step + 1e-12).all())


def check_gguf(path: Path, meant: dict[str, np.ndarray], meta: dict[str, Any]) -> dict[str, Any]:
    """Compares the file at ``path`` with the tensors and metadata meant.

    Returns:
        {"tensors": count, "types": {stored type: count}, "max_abs_error": worst difference}.

    Raises:
        GgufMismatch: naming the first tensor or key that differs.
    """
    import gguf

    got_meta, got = read_gguf(path)
    for key, value in meta.items():
        if got_meta.get(key) != value:
            raise GgufMismatch(f"{path.name}: {key} is {got_meta.get(key)!r}, meant {value!r}")
    if set(got) != set(meant):
        raise GgufMismatch(f"{path.name}: tensors differ: missing {sorted(set(meant) - set(got))[:3]}, "
                           f"extra {sorted(set(got) - set(meant))[:3]}")
    types: dict[str, int] = {}
    worst = 0.0
    for name, (kind, values) in got.items():
        want = meant[name]
        if values.shape != want.shape:
            raise GgufMismatch(f"{path.name}: {name} has shape {values.shape}, meant {want.shape}")
        exact = stored_exactly(kind, want)
        ok = np.array_equal(values, exact) if exact is not None else \
            kind == gguf.GGMLQuantizationType.Q8_0 and q8_error_ok(want, values)
        if not ok:
            raise GgufMismatch(f"{path.name}: {name} ({kind.name}) differs from the model's values")
        types[kind.name] = types.get(kind.name, 0) + 1
        worst = max(worst, float(np.abs(values - want).max()) if want.size else 0.0)
    return {"tensors": len(got), "types": types, "max_abs_error": worst}
