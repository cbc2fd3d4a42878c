"""Time cost of attention in head groups on a CPU: one attention layer's forward + backward,
Llama-3.1-8B's attention shapes (32 query heads, 8 key/value heads of 128), side by side.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m bench.head_groups_speed [--seq 2048] [--rounds 9]

Arms: transformers' SDPA attention function in one call, and the same function in 8 head groups
(:mod:`lora_gui.attention.head_groups`: one key/value head a call), float32 on the CPU, causal,
no mask (the flash path with GQA). Each round runs both arms, alternating which goes first; the
figure is the median over rounds of the paired ratio. On CUDA the cost is not measured here
(no GPU was lent): there each group is one more flash kernel launch per layer and direction.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lora_gui.attention.head_groups import GROUPS_ATTR, with_head_groups


class _Layer(torch.nn.Module):
    num_key_value_groups = 4  # 32 query heads / 8 key/value heads
    is_causal = True


def run(module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> float:
    attention = with_head_groups(sdpa_attention_forward)
    start = time.perf_counter()
    out, _ = attention(module, q, k, v, None, scaling=q.shape[-1] ** -0.5)
    out.sum().backward()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    q = torch.randn(1, 32, args.seq, 128, requires_grad=True)
    k = torch.randn(1, 8, args.seq, 128, requires_grad=True)
    v = torch.randn(1, 8, args.seq, 128, requires_grad=True)
    one, grouped = _Layer(), _Layer()
    setattr(grouped, GROUPS_ATTR, 8)
    arms = {"one call": one, "8 head groups": grouped}
    for module in arms.values():  # warm-up
        run(module, q, k, v)
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        for name in order:
            times[name].append(run(arms[name], q, k, v))
    ratio = statistics.median(a / b for a, b in zip(times["8 head groups"], times["one call"]))
    print(f"threads {torch.get_num_threads()}, seq {args.seq}, rounds {args.rounds} (shared machine)")
    for name, t in times.items():
        print(f"  {name:14s} median fwd+bwd {statistics.median(t) * 1000:8.1f} ms")
    print(f"  8 head groups / one call: x{ratio:.3f} (median of paired ratios)")


if __name__ == "__main__":
    main()
