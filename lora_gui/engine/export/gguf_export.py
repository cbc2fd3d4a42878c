"""GGUF for llama.cpp, Ollama and LM Studio, written with the ``gguf`` package only.

The merged model (base + LoRA) is written as one GGUF file (f16, bf16 or q8_0) with its
tokenizer (byte-level BPE: tokens, types, merges, special ids) and chat template; the adapter
alone as a GGUF LoRA (``<tensor>.lora_a`` / ``.lora_b``, ``adapter.lora.alpha``) when the run
added no tokens; and an Ollama ``Modelfile``. Layout changes follow llama.cpp's
convert_hf_to_gguf.py: tensor names from gguf's TensorNameMap; Llama / Mistral q and k rows
permuted from the Hugging Face rotary half-split to llama.cpp's interleaved pairs (Qwen2 keeps
the NeoX layout: no permutation); 1-D tensors (norms, biases) stay float32; a tied output head
is not written (llama.cpp reuses token_embd). Every written file is read back with gguf's
GGUFReader and compared with what was meant (:mod:`lora_gui.engine.export.gguf_check`).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lora_gui.errors import UserError

log = logging.getLogger(__name__)

GGUF_TYPES = ("f16", "bf16", "q8_0")
# Hugging Face architecture -> (llama.cpp architecture, q/k rows permuted for llama.cpp's rope)
ARCHITECTURES = {"LlamaForCausalLM": ("llama", True), "MistralForCausalLM": ("llama", True),
                 "Qwen2ForCausalLM": ("qwen2", False)}
# the pre-tokenizer split regexes llama.cpp implements, by tokenizer.ggml.pre name
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_BY_SPLIT = {QWEN2_SPLIT: "qwen2", LLAMA3_SPLIT: "llama-bpe"}


class GgufError(UserError, ValueError):
    """The run cannot be written as GGUF; the message names why. Nothing was written."""


def qtype(kind: str) -> Any:
    import gguf

    return {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16,
            "q8_0": gguf.GGMLQuantizationType.Q8_0}[kind]


def file_type(kind: str) -> Any:
    import gguf

    return {"f16": gguf.LlamaFileType.MOSTLY_F16, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind]


def architecture(config: dict[str, Any], where: str) -> tuple[str, bool]:
    """(llama.cpp architecture, permute q/k) of a model config; refuses others by name."""
    names = config.get("architectures") or [config.get("model_type", "unknown")]
    if names[0] not in ARCHITECTURES:
        raise GgufError(f"{where}: GGUF export does not support the {names[0]} architecture "
                        f"(supported: {', '.join(ARCHITECTURES)})")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise GgufError(f"{where}: GGUF export does not support rope_type {kind!r} (only default rope)")
    if config.get("mlp_bias"):
        raise GgufError(f"{where}: GGUF export does not support MLP biases (mlp_bias: true)")
    return ARCHITECTURES[names[0]]


def pre_tokenizer(tokenizer_json: dict[str, Any], where: str) -> str:
    """tokenizer.ggml.pre of a byte-level BPE tokenizer, read from its pre-tokenizer; a
    tokenizer llama.cpp would split differently is refused by name."""
    model = tokenizer_json.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        kind = "SentencePiece-style BPE (byte fallback)" if model.get("byte_fallback") else model.get("type")
        raise GgufError(f"{where}: GGUF export supports byte-level BPE tokenizers (GPT-2, Llama 3, "
                        f"Qwen2 style); this one is {kind}")
    pre = tokenizer_json.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"):
        return "gpt-2"
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if len(parts) == 2 and parts[0].get("type") == "Split" and parts[1].get("type") == "ByteLevel" \
            and not parts[1].get("use_regex", True):
        name = PRE_BY_SPLIT.get(parts[0].get("pattern", {}).get("Regex", ""))
        if name:
            return name
    raise GgufError(f"{where}: its pre-tokenizer is not one llama.cpp implements here (GPT-2, Llama 3 "
                    "or Qwen2 splitting); GGUF export refused")


def permute(weights: torch.Tensor, n_head: int) -> torch.Tensor:
    """Rows of q or k from Hugging Face's rotary layout (first half, second half of each head)
    to llama.cpp's (pairs interleaved): convert_hf_to_gguf.py's LlamaModel.permute."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def gguf_layout(state: dict[str, torch.Tensor], config: dict[str, Any], permute_qk: bool,
                arch: str) -> dict[str, np.ndarray]:
    """The merged model's tensors under their GGUF names in GGUF's layout, float32."""
    import gguf

    names = gguf.get_tensor_name_map(_model_arch(arch), config["num_hidden_layers"])
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    out: dict[str, np.ndarray] = {}
    for hf_name, tensor in state.items():
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # llama.cpp uses token_embd for a tied output head
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise GgufError(f"tensor {hf_name}: has no GGUF name for the {arch} architecture")
        data = tensor.detach().to(torch.float32)
        if permute_qk and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            data = permute(data, n_head)
        elif permute_qk and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            data = permute(data, n_kv)
        out[name] = data.contiguous().numpy()
    return out


def _model_arch(arch: str) -> Any:
    import gguf

    return {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}[arch]


def encode(name: str, data: np.ndarray, kind: str) -> tuple[np.ndarray, Any]:
    """A tensor as written: 1-D and norm weights float32 (as llama.cpp's converter keeps them),
    others in ``kind``; q8_0 falls back to f16 for rows that are not a multiple of 32 values."""
    import gguf

    if data.ndim <= 1 or name.endswith("_norm.weight"):
        return data.astype(np.float32), None
    if kind == "f16":
        return data.astype(np.float16), None
    try:
        return gguf.quants.quantize(data, qtype(kind)), qtype(kind)
    except gguf.quants.QuantError:  # a row length q8_0 cannot block
        return data.astype(np.float16), None


def vocabulary(tokenizer: Any, n_vocab: int) -> tuple[list[str], list[int]]:
    """Token strings and types for ids 0..n_vocab-1 (convert_hf_to_gguf.py's get_vocab_base):
    added special tokens (or ones spelled like <|...|>) are CONTROL, other added tokens
    USER_DEFINED, ids without a token UNUSED padding."""
    import gguf

    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            special = decoder[i].special or (token.startswith("<|") and token.endswith("|>"))
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def write_model(path: Path, state: dict[str, torch.Tensor], config: dict[str, Any], tokenizer: Any,
                tokenizer_dir: Path, kind: str, name: str) -> dict[str, np.ndarray]:
    """Writes the merged model's GGUF; returns the float32 tensors meant (GGUF names/layout)."""
    import gguf

    arch, permute_qk = architecture(config, name)
    tokenizer_json = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    pre = pre_tokenizer(tokenizer_json, name)
    tensors = gguf_layout(state, config, permute_qk, arch)
    writer = gguf.GGUFWriter(str(path), arch)
    _hyperparameters(writer, config, arch, kind, name)
    tokens, types = vocabulary(tokenizer, config["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(tokenizer_dir, load_merges=True, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)
    for tensor_name, data in tensors.items():
        encoded, raw = encode(tensor_name, data, kind)
        writer.add_tensor(tensor_name, encoded, raw_dtype=raw)
    _finish(writer)
    return tensors


def _hyperparameters(writer: Any, config: dict[str, Any], arch: str, kind: str, name: str) -> None:
    """The keys llama.cpp reads for Llama / Qwen2 (convert_hf_to_gguf.py's TextModel)."""
    n_head = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    rope = config.get("rope_parameters") or {}
    writer.add_name(name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(config.get("num_key_value_heads") or n_head)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_file_type(file_type(kind))
    if arch == "llama":
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim)


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


def adapter_refusal(adapter_config: dict[str, Any], added_tokens: bool) -> str | None:
    """Why this adapter cannot be a GGUF LoRA (None: it can)."""
    if adapter_config.get("peft_type", "LORA") != "LORA":
        return f"a {adapter_config.get('peft_type')} adapter is not a LoRA"
    if adapter_config.get("use_dora"):
        return "DoRA adapters have no GGUF LoRA form"
    if adapter_config.get("rank_pattern") or adapter_config.get("alpha_pattern"):
        return "per-module ranks or alphas have no GGUF LoRA form (one alpha per file)"
    if added_tokens:
        return "the run added tokens to the vocabulary (a GGUF LoRA cannot add embedding rows)"
    return None


def adapter_alpha(adapter_config: dict[str, Any]) -> float:
    """llama.cpp scales a LoRA by alpha / rank; rank-stabilised LoRA scales by alpha / sqrt(rank),
    so its GGUF alpha is alpha x sqrt(rank)."""
    alpha, rank = float(adapter_config["lora_alpha"]), int(adapter_config["r"])
    return alpha * math.sqrt(rank) if adapter_config.get("use_rslora") else alpha


def lora_layout(weights: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, np.ndarray]:
    """peft's lora_A / lora_B as GGUF ``<name>.lora_a`` (rank x in) / ``.lora_b`` (out x rank);
    q and k's B rows permuted as the base weight's rows are (A is untouched)."""
    import gguf

    arch, permute_qk = architecture(config, "adapter")
    names = gguf.get_tensor_name_map(_model_arch(arch), config["num_hidden_layers"])
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    out: dict[str, np.ndarray] = {}
    for key, tensor in weights.items():
        module, _, part = key.removeprefix("base_model.model.").rpartition(".lora_")
        name = names.get_name(module + ".weight", try_suffixes=(".weight",))
        if name is None or part not in ("A.weight", "B.weight"):
            raise GgufError(f"adapter tensor {key}: has no GGUF LoRA name")
        data = tensor.detach().to(torch.float32)
        if permute_qk and part == "B.weight" and module.endswith(("q_proj", "k_proj")):
            data = permute(data, n_head if module.endswith("q_proj") else n_kv)
        out[f"{name}.lora_{part[0].lower()}"] = data.contiguous().numpy()
    return out


def write_adapter(path: Path, weights: dict[str, torch.Tensor], adapter_config: dict[str, Any],
                  config: dict[str, Any], kind: str, name: str) -> dict[str, np.ndarray]:
    """Writes the adapter alone as a GGUF LoRA (f16 or bf16; q8_0 asks write f16); returns
    the float32 tensors meant."""
    import gguf

    arch, _ = architecture(config, name)
    tensors = lora_layout(weights, config)
    kind = "f16" if kind == "q8_0" else kind  # rank-wide rows of B rarely block by 32
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, adapter_alpha(adapter_config))
    writer.add_file_type(file_type(kind))
    for tensor_name, data in tensors.items():
        encoded, raw = encode(tensor_name, data, kind)
        writer.add_tensor(tensor_name, encoded, raw_dtype=raw)
    _finish(writer)
    return tensors


CHATML_OLLAMA = ('{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}'
                 '{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}'
                 '<|im_start|>assistant\n{{ .Response }}<|im_end|>\n')


def modelfile(model_file: str, chat_template: str | None, adapter_file: str | None) -> str:
    """An Ollama Modelfile for the merged GGUF (``ollama create NAME -f Modelfile``)."""
    lines = ["# Ollama: ollama create my-model -f Modelfile && ollama run my-model",
             f"FROM ./{model_file}"]
    if chat_template and "<|im_start|>" in chat_template:
        lines += [f'TEMPLATE """{CHATML_OLLAMA}"""', 'PARAMETER stop "<|im_end|>"']
    elif chat_template:
        lines.append("# chat template: Ollama reads it from the GGUF's tokenizer.chat_template")
    else:
        lines.append('TEMPLATE """{{ .Prompt }}"""  # a text-completion run: no chat template')
    if adapter_file:
        lines.append(f"# the adapter alone: FROM <the base model's GGUF> then ADAPTER ./{adapter_file}")
    return "\n".join(lines) + "\n"
