"""The frozen head's fused chunked loss: a chunk's logits turned into their own gradient in place,
against the log-softmax form it replaced (kept here as the reference). Same value and gradient;
time per call and the peak rise above the inputs (source ``tracker``), side by side.

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python -m bench.fused_loss [--rounds 9]

Each row: ``tokens`` hidden states of width ``hidden`` through a frozen (vocab, hidden) head,
``chunk`` positions at a time, one call of the autograd Function's forward (the loss and the
hidden states' gradient; the backward only scales that gradient). Rounds alternate the two forms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models.chunked_loss import IGNORE_INDEX, _FusedLinearCrossEntropy

ROWS = [  # (vocab, hidden, tokens, chunk): the text demo's head, a 32k and a 128k vocabulary
    (4096, 256, 2048, 1024), (32000, 256, 1024, 512), (128256, 256, 512, 256)]


def log_softmax_form(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                     chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The previous forward: float32 log-probs beside the logits, exp'd into the gradient."""
    total = torch.zeros((), dtype=torch.float32)
    grad_hidden = torch.empty_like(hidden)
    for start in range(0, hidden.shape[0], chunk):
        h, y = hidden[start:start + chunk], targets[start:start + chunk]
        logits = F.linear(h, weight)
        logp = torch.log_softmax(logits.float(), dim=-1)
        valid = (y != IGNORE_INDEX).unsqueeze(1)
        safe = y.clamp(min=0).unsqueeze(1)
        total = total - (logp.gather(1, safe) * valid).sum()
        grad = logp.exp_()
        grad.scatter_add_(1, safe, -torch.ones_like(safe, dtype=grad.dtype))
        grad.mul_(valid)
        del logp
        low = grad.to(logits.dtype)
        grad_hidden[start:start + chunk] = (low @ weight.to(logits.dtype)).to(hidden.dtype)
        del grad, low, logits
    return total, grad_hidden


def in_place_form(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """lora_gui's forward (``_FusedLinearCrossEntropy.forward``)."""
    saved: list[torch.Tensor] = []

    class Ctx:
        def save_for_backward(self, *tensors: torch.Tensor) -> None:
            saved.extend(tensors)

    total = _FusedLinearCrossEntropy.forward(Ctx(), hidden, weight, None, targets, chunk, None)
    return total, saved[0]


def measure(form: Any, args: tuple) -> tuple[float, int]:
    """(seconds, peak bytes above the inputs) of one call."""
    with StorageTracker() as t:
        t.track(list(args[:3]))
        start = t.live_bytes
        form(*args)
        rise = t.peak_bytes - start
    t0 = time.perf_counter()
    form(*args)
    return time.perf_counter() - t0, rise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); median of {args.rounds} "
          "alternating rounds\n")
    print("| dtype | vocab | tokens (chunk) | log-softmax form: ms, peak rise MiB | in place: ms, "
          "peak rise MiB | speed-up | loss difference (relative) | gradient max difference |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for vocab, width, tokens, chunk in ROWS:
            torch.manual_seed(0)
            hidden = torch.randn(tokens, width, dtype=dtype)
            weight = (torch.randn(vocab, width) * width ** -0.5).to(dtype)
            targets = torch.randint(0, vocab, (tokens,))
            targets[::16] = IGNORE_INDEX  # a few positions without a target, as padding has
            call = (hidden, weight, targets, chunk)
            old, new = log_softmax_form(*call), in_place_form(*call)
            times: dict[str, list[float]] = {"old": [], "new": []}
            rises: dict[str, int] = {}
            for r in range(args.rounds):
                for name, form in (("old", log_softmax_form), ("new", in_place_form))[::1 - 2 * (r % 2)]:
                    seconds, rises[name] = measure(form, call)
                    times[name].append(seconds)
            t_old, t_new = statistics.median(times["old"]), statistics.median(times["new"])
            loss_diff = abs(new[0] - old[0]).item() / abs(old[0]).item()
            grad_diff = (new[1].float() - old[1].float()).abs().max().item()
            print(f"| {str(dtype).split('.')[1]} | {vocab} | {tokens} ({chunk}) | {t_old * 1e3:.1f}, "
                  f"{rises['old'] / 2**20:.1f} | {t_new * 1e3:.1f}, {rises['new'] / 2**20:.1f} | "
                  f"{t_old / t_new:.2f}x | {loss_diff:.1e} | {grad_diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
