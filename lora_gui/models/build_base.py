"""Builds the built-in base model under assets/base-model/ (run once; the output is committed).

``python -m lora_gui.models.build_base`` trains a byte-level BPE tokenizer on the bundled
pretraining corpus, then pretrains a small Llama (about 4.3M parameters) on it with plain
next-token prediction over concatenated documents. The fine-tuning corpus (comedies and
romances) is never seen here, so a LoRA trained on it has something real to learn.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from lora_gui.data.text import load_documents

log = logging.getLogger(__name__)

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def base_config(vocab_size: int) -> LlamaConfig:
    """The built-in model: 4 layers, 256 wide, 4 heads of 64, 2048 positions, tied embeddings."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style) trained on the given texts."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [SPECIAL_TOKENS[k] for k in ("pad_token", "bos_token", "eos_token", "unk_token")]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,  # ids 0..3 in this order: pad, bos, eos, unk
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=2048, **SPECIAL_TOKENS)


def pretrain(model: LlamaForCausalLM, ids: torch.Tensor, steps: int, batch: int, seq: int, lr: float,
             seed: int) -> list[float]:
    """Next-token pretraining on random windows of the concatenated token stream."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    losses = []
    model.train()
    start = time.time()
    for step in range(steps):
        offsets = torch.randint(0, len(ids) - seq - 1, (batch,), generator=gen)
        rows = torch.stack([ids[o : o + seq] for o in offsets.tolist()])
        loss = model(input_ids=rows, labels=rows).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 25 == 0 or step == steps - 1:
            log.info("step %d/%d loss %.3f (%.0f s)", step, steps, loss.item(), time.time() - start)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("assets/corpus/pretrain.txt"))
    parser.add_argument("--out", type=Path, default=Path("assets/base-model"))
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.manual_seed(args.seed)

    texts = [doc.text for doc in load_documents(args.corpus)]
    tokenizer = train_tokenizer(texts, args.vocab_size)
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream.extend(ids + [eos])
    log.info("%d documents, %d tokens", len(texts), len(stream))

    model = LlamaForCausalLM(base_config(len(tokenizer)))
    log.info("%.2fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)
    losses = pretrain(model, torch.tensor(stream), args.steps, args.batch, args.seq, args.lr, args.seed)

    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)  # safetensors
    tokenizer.save_pretrained(args.out)
    (args.out / "TRAINING.md").write_text(
        f"Built by `python -m lora_gui.models.build_base` ({args.steps} steps, batch {args.batch} x "
        f"{args.seq} tokens, lr {args.lr}, seed {args.seed}) on {args.corpus}.\n"
        f"Final pretraining loss (mean of last 20 steps): {sum(losses[-20:]) / 20:.3f}\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
