"""export --gguf: the bundled chat demo (and a plain text run) written as GGUF, read back with
gguf's own reader, every tensor compared with the merged model's after GGUF's layout changes
(computed here, independently of the exporter), the metadata checked, the adapter GGUF
compared with peft's weights; the rope permutation checked against attention scores; bad
input refused with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from lora_gui.cli import main
from lora_gui.engine.core.rundir import RunDirError
from lora_gui.engine.export.gguf_export import GgufError, permute
from lora_gui.engine.export.run_export import ExportError, export_run
from lora_gui.engine.text.train import train_text
from lora_gui.presets import load_config

gguf = pytest.importorskip("gguf")

# Hugging Face Llama names -> GGUF names, written out here (not taken from the exporter)
LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
               "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    module, _, suffix = rest.rpartition(".")
    return f"blk.{layer}.{LAYER_NAMES[module]}.{suffix}"


def rows_interleaved(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Per head, rows (0, d/2, 1, d/2+1, ...): llama.cpp's pair order for HF's half split."""
    d = w.shape[0] // n_head
    order = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], 1).flatten()
    return torch.cat([w[h * d + order] for h in range(n_head)])


def read(path):
    reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items()}
    tensors = {t.name: (t.tensor_type, np.asarray(gguf.quants.dequantize(t.data, t.tensor_type))
                        .reshape(tuple(int(n) for n in reversed(t.shape)))) for t in reader.tensors}
    return meta, tensors


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    """The bundled chat demo preset, 2 steps, no held-out evaluation (most of a tiny run's time)."""
    out = tmp_path_factory.mktemp("chat") / "chat-demo"
    cfg = load_config("chat-demo", {"max_steps": 2, "monitor_hz": 0.0, "eval_fraction": 0.0})
    train_text(cfg, out, progress=False)
    return out


@pytest.mark.slow
def test_chat_demo_gguf_holds_the_merged_model_tensor_for_tensor(chat_run, tmp_path):
    assert main(["export", "--run", str(chat_run), "--out", str(tmp_path / "gguf"), "--gguf"]) == 0
    merged_dir = export_run(chat_run, tmp_path / "merged", merged=True)
    model = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(merged_dir)
    cfg = model.config
    meta, tensors = read(tmp_path / "gguf" / "chat-demo-f16.gguf")
    expected = {}
    for name, w in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied: llama.cpp reads token_embd
        if name.endswith("q_proj.weight"):
            w = rows_interleaved(w, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = rows_interleaved(w, cfg.num_key_value_heads)
        expected[gguf_name(name)] = w.numpy()
    assert set(tensors) == set(expected)
    for name, (kind, got) in tensors.items():
        want = expected[name]
        if want.ndim == 1:
            assert kind == gguf.GGMLQuantizationType.F32 and np.array_equal(got, want), name
        else:  # f16: exact to float16 rounding of the merged float32 weights
            assert kind == gguf.GGMLQuantizationType.F16, name
            assert np.array_equal(got, want.astype(np.float16).astype(np.float32)), name
    assert meta["general.architecture"] == "llama"
    assert meta["llama.context_length"] == cfg.max_position_embeddings
    assert meta["llama.block_count"] == cfg.num_hidden_layers
    assert meta["llama.attention.head_count"] == cfg.num_attention_heads
    assert meta["llama.vocab_size"] == len(tok) == 4098  # the built-in 4096 + ChatML's two tokens
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.ggml.tokens"] == tok.convert_ids_to_tokens(list(range(len(tok))))
    assert meta["tokenizer.chat_template"] == tok.chat_template
    assert meta["tokenizer.ggml.eos_token_id"] == tok.eos_token_id
    types = meta["tokenizer.ggml.token_type"]
    assert types[tok.convert_tokens_to_ids("<|im_end|>")] == gguf.TokenType.CONTROL
    assert len(meta["tokenizer.ggml.merges"]) > 3000
    modelfile = (tmp_path / "gguf" / "Modelfile").read_text()
    assert "FROM ./chat-demo-f16.gguf" in modelfile and 'PARAMETER stop "<|im_end|>"' in modelfile
    card = (tmp_path / "gguf" / "README.md").read_text()
    assert "no adapter-only GGUF: the run added tokens" in card  # ChatML's rows are not a LoRA


@pytest.fixture(scope="module")
def text_run(tmp_path_factory, builtin_model_dir):
    corpus = tmp_path_factory.mktemp("corpus") / "c.txt"
    corpus.write_text("\n\n".join(f"document {i}: the quick brown fox jumps over the lazy dog " * 3
                                  for i in range(12)))
    out = tmp_path_factory.mktemp("text") / "run"
    cfg = load_config("text-demo", {"data": str(corpus), "max_steps": 2, "max_seq_len": 64,
                                    "batch_size": 4, "monitor_hz": 0.0, "precision": "fp32",
                                    "eval_fraction": 0.0})
    train_text(cfg, out, progress=False)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bf16", "q8_0"])
def test_bf16_q8_and_the_adapter_gguf(text_run, tmp_path, kind):
    out = export_run(text_run, tmp_path / "e", gguf=kind)
    meta, tensors = read(out / f"run-{kind}.gguf")
    stored = {t for t, _ in tensors.values()}
    want_type = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[kind]
    assert want_type in stored and meta["general.file_type"] == {"bf16": 32, "q8_0": 7}[kind]
    weights = load_file(text_run / "adapter" / "adapter_model.safetensors")
    adapter_cfg = json.loads((text_run / "adapter" / "adapter_config.json").read_text())
    ameta, lora = read(out / f"run-lora-{'f16' if kind == 'q8_0' else kind}.gguf")
    assert ameta["general.type"] == "adapter" and ameta["adapter.type"] == "lora"
    assert ameta["adapter.lora.alpha"] == adapter_cfg["lora_alpha"]
    assert len(lora) == len(weights)
    n_head = 4  # the built-in model
    for key, w in weights.items():
        module, _, part = key.removeprefix("base_model.model.").rpartition(".lora_")
        name = gguf_name(module + ".weight") + (".lora_a" if part == "A.weight" else ".lora_b")
        if part == "B.weight" and module.endswith(("q_proj", "k_proj")):
            w = rows_interleaved(w, n_head)
        rounded = w.to(torch.bfloat16 if kind == "bf16" else torch.float16).float().numpy()
        assert np.array_equal(lora[name][1], rounded), name
    assert "ADAPTER ./run-lora" in (out / "Modelfile").read_text()


def test_permutation_keeps_attention_scores():
    """HF rope (half split) on q, k == llama.cpp rope (adjacent pairs) on permuted q, k rows."""
    torch.manual_seed(0)
    n_head, d, theta = 2, 8, 10000.0
    wq, wk, x = torch.randn(n_head * d, 16), torch.randn(n_head * d, 16), torch.randn(3, 16)
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)

    def half(v, pos):
        a, b = v[..., : d // 2], v[..., d // 2:]
        c, s = torch.cos(pos * inv), torch.sin(pos * inv)
        return torch.cat([a * c - b * s, a * s + b * c], -1)

    def pairs(v, pos):
        a, b = v[..., 0::2], v[..., 1::2]
        c, s = torch.cos(pos * inv), torch.sin(pos * inv)
        return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)

    def scores(rope, q_w, k_w):
        q = (x @ q_w.T).view(3, n_head, d)
        k = (x @ k_w.T).view(3, n_head, d)
        q = torch.stack([rope(q[i], i) for i in range(3)])
        k = torch.stack([rope(k[i], i) for i in range(3)])
        return torch.einsum("ihd,jhd->hij", q, k)

    assert torch.allclose(scores(half, wq, wk), scores(pairs, permute(wq, n_head), permute(wk, n_head)),
                          atol=1e-4)
    assert torch.equal(permute(wq, n_head), rows_interleaved(wq, n_head))


def test_refusals_write_nothing(tmp_path):
    text_run = tmp_path / "text-run"  # refused before the adapter is read: its config suffices
    (text_run / "adapter").mkdir(parents=True)
    (text_run / "config.json").write_text("{}")
    (text_run / "adapter" / "adapter_config.json").write_text("{}")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("keep")
    with pytest.raises(ExportError, match="exists and is not empty"):
        export_run(text_run, taken, gguf="f16")
    with pytest.raises(ExportError, match="--merged and --gguf"):
        export_run(text_run, tmp_path / "a", merged=True, gguf="f16")
    image = tmp_path / "image-run"
    (image / "adapter").mkdir(parents=True)
    (image / "config.json").write_text(json.dumps({"task": "image"}))
    (image / "adapter" / "pytorch_lora_weights.safetensors").write_bytes(b"")
    with pytest.raises(ExportError, match="image runs cannot be written as GGUF"):
        export_run(image, tmp_path / "b", gguf="f16")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2",
                                                  "architectures": ["GPT2LMHeadModel"]}))
    other = tmp_path / "gpt2-run"
    (other / "adapter").mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"model": str(gpt2)}))
    with pytest.raises(RunDirError, match="has no trained adapter"):
        export_run(other, tmp_path / "c", gguf="f16")
    (other / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(GgufError, match="does not support the GPT2LMHeadModel architecture"):
        export_run(other, tmp_path / "c", gguf="f16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2", "gpt2-run", "image-run", "taken",
                                                          "text-run"]


@pytest.mark.slow
def test_qwen2_run_keeps_its_rope_layout_and_biases(tmp_path, builtin_model_dir):
    """Qwen2 (llama.cpp's NeoX rope: no permutation; q/k/v biases), with its ChatML tokens in the
    base vocabulary, so the adapter alone is written too."""
    from tests.chat_templates import save_tiny_qwen2

    qwen2 = save_tiny_qwen2(tmp_path / "qwen2", builtin_model_dir)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                                     {"role": "assistant", "content": f"answer {i}."}]})
                            + "\n" for i in range(6)))
    cfg = load_config(None, {"model": str(qwen2), "data": str(data), "max_steps": 1, "batch_size": 2,
                             "max_seq_len": 64, "eval_fraction": 0.0, "monitor_hz": 0.0,
                             "precision": "fp32"})
    train_text(cfg, tmp_path / "run", progress=False)
    out = export_run(tmp_path / "run", tmp_path / "q", gguf="f16")
    merged = AutoModelForCausalLM.from_pretrained(export_run(tmp_path / "run", tmp_path / "m", merged=True))
    meta, tensors = read(out / "run-f16.gguf")
    assert meta["general.architecture"] == "qwen2" and meta["qwen2.context_length"] == 512
    assert meta["qwen2.attention.head_count_kv"] == 2
    for name, w in merged.state_dict().items():
        if name == "lm_head.weight":
            continue
        want = w.numpy() if w.ndim == 1 else w.numpy().astype(np.float16).astype(np.float32)
        assert np.array_equal(tensors[gguf_name(name)][1], want), name  # rows as Hugging Face has them
    assert "blk.0.attn_q.bias" in tensors
    weights = load_file(tmp_path / "run" / "adapter" / "adapter_model.safetensors")
    _, lora = read(out / "run-lora-f16.gguf")
    assert len(lora) == len(weights)
    b0 = weights["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    assert np.array_equal(lora["blk.0.attn_q.weight.lora_b"][1], b0.half().float().numpy())
