"""The exported GGUF in llama.cpp against the merged model in transformers: next-token logits.

Trains (or reuses, ``--run``) a few steps of the bundled chat demo, exports it with
``python -m lora_gui export --gguf f16`` and ``--gguf q8_0`` (the same ``export_run`` call) and
the merged model with ``--merged``, then feeds the same token ids to transformers (fp32) and to
llama.cpp (llama-cpp-python, CPU) and compares the logits at every position of a few prompts:
the largest absolute difference, top-1 agreement (the same next token) and KL(transformers ||
llama.cpp) of the next-token distributions. It also says whether llama.cpp's own tokenizer,
reading the GGUF's vocabulary, gives the same ids as the Hugging Face tokenizer.

    .venv/bin/pip install -r bench/requirements.txt   # llama-cpp-python builds from source
    .venv/bin/python -m bench.quality.gguf_logits             # about a minute on 2 cores

Prints a Markdown table (docs/BENCHMARKS.md) and writes bench/results/gguf_logits.json.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import write_results

log = logging.getLogger(__name__)
RESULTS = Path(__file__).resolve().parents[1] / "results" / "gguf_logits.json"
KINDS = ("f16", "q8_0")
# (system, user) pairs in the chat template the demo trained with, and two plain-text prompts
CHATS = [("You are a helpful assistant.", "Hello, how are you?"),
         (None, "What is your favourite book?"),
         ("Answer briefly.", "Do you like music?")]
TEXTS = ["To be, or not to be, that is the question:",
         "The quick brown fox jumps over the lazy dog."]


def train_demo(out: Path, steps: int) -> Path:
    """The bundled chat demo for ``steps`` steps, no held-out evaluation (a tiny run)."""
    from lora_gui.engine.text.train import train_text
    from lora_gui.presets import load_config

    cfg = load_config("chat-demo", {"max_steps": steps, "monitor_hz": 0.0, "eval_fraction": 0.0})
    train_text(cfg, out, progress=False)
    return out


def prompts(tokenizer: Any) -> list[tuple[str, list[int]]]:
    """(label, token ids) of each prompt, chats through the run's own chat template."""
    out = []
    for system, user in CHATS:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append((f"chat: {user}", tokenizer(text, add_special_tokens=False)["input_ids"]))
    out += [(f"text: {t}", tokenizer(t)["input_ids"]) for t in TEXTS]
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
    """Per-position logits [tokens, vocab]: largest |difference|, top-1 agreement, KL(ref || other)."""
    p, q = log_softmax(reference), log_softmax(other)
    kl = (np.exp(p) * (p - q)).sum(-1)
    return {"max_abs_diff": float(np.abs(reference - other).max()),
            "top1_agree": float((reference.argmax(-1) == other.argmax(-1)).mean()),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "logit_range": float(reference.max() - reference.min())}


def llama_logits(path: Path, ids: list[int], threads: int) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=256, logits_all=True, verbose=False, n_threads=threads,
                n_batch=256)
    llm.reset()
    llm.eval(ids)
    out = np.array(llm.scores[: llm.n_tokens], dtype=np.float32)
    if hasattr(llm, "close"):  # frees the model now (newer llama-cpp-python)
        llm.close()
    return out


def llama_tokens(path: Path, text: str) -> list[int]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=256, verbose=False, vocab_only=True)
    return llm.tokenize(text.encode(), add_bos=False, special=True)


def run(run_dir: Path | None, steps: int, threads: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lora_gui.engine.export.run_export import export_run

    work = Path(tempfile.mkdtemp(prefix="gguf-logits-"))
    run_dir = run_dir or train_demo(work / "chat-demo", steps)
    merged = export_run(run_dir, work / "merged", merged=True)
    files = {kind: next((export_run(run_dir, work / f"gguf-{kind}", gguf=kind)).glob(f"*-{kind}.gguf"))
             for kind in KINDS}
    tokenizer = AutoTokenizer.from_pretrained(merged)
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    rows: list[dict[str, Any]] = []
    for label, ids in prompts(tokenizer):
        with torch.no_grad():
            reference = model(torch.tensor([ids])).logits[0].float().numpy()
        text = tokenizer.decode(ids)
        same_ids = llama_tokens(files["f16"], text) == ids
        for kind, path in files.items():
            rows.append({"prompt": label, "tokens": len(ids), "type": kind,
                         "llama_cpp_tokenizer_same": same_ids,
                         **compare(reference, llama_logits(path, ids, threads))})
    summary = {}
    for kind in KINDS:
        mine = [r for r in rows if r["type"] == kind]
        summary[kind] = {"positions": sum(r["tokens"] for r in mine),
                         "max_abs_diff": max(r["max_abs_diff"] for r in mine),
                         "top1_agree": float(np.average([r["top1_agree"] for r in mine],
                                                        weights=[r["tokens"] for r in mine])),
                         "kl_max": max(r["kl_max"] for r in mine)}
    import llama_cpp

    return {"run": str(run_dir), "steps": steps, "llama_cpp_python": llama_cpp.__version__,
            "torch": torch.__version__, "rows": rows, "summary": summary,
            "file_bytes": {kind: path.stat().st_size for kind, path in files.items()}}


def table(result: dict[str, Any]) -> str:
    lines = ["| GGUF | prompt | tokens | max abs logit diff | top-1 agree | mean KL | max KL | "
             "llama.cpp tokenizer = HF |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in sorted(result["rows"], key=lambda r: r["type"]):
        lines.append(f"| {r['type']} | {r['prompt'][:40]} | {r['tokens']} | {r['max_abs_diff']:.2e} | "
                     f"{r['top1_agree']:.0%} | {r['kl_mean']:.1e} | {r['kl_max']:.1e} | "
                     f"{'yes' if r['llama_cpp_tokenizer_same'] else 'no'} |")
    for kind, s in result["summary"].items():
        lines.append(f"\n{kind}: {s['positions']} positions, largest logit difference "
                     f"{s['max_abs_diff']:.2e}, top-1 agreement {s['top1_agree']:.1%}, "
                     f"largest KL {s['kl_max']:.1e} nats")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path,
                        help="a finished text run to export (default: train the chat demo)")
    parser.add_argument("--steps", type=int, default=20, help="chat demo steps when training one")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = run(args.run, args.steps, args.threads)
    write_results(args.out, result)
    print(table(result))


if __name__ == "__main__":
    main()
