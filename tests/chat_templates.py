"""Chat templates of three model families, as their tokenizers ship them (built in code)."""

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
TEMPLATES = {  # name: (template, its special tokens, end of turn)
    "llama3": (LLAMA3, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|eot_id|>"),
    "qwen2": (QWEN2, ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
    "mistral": (MISTRAL, [], "</s>"),
}


def tokenizer_with(base_dir, name):
    """The built-in tokenizer given one family's template and special tokens."""
    from lora_gui.models.text import load_tokenizer

    template, specials, _ = TEMPLATES[name]
    tok = load_tokenizer(str(base_dir))
    if specials:
        tok.add_special_tokens({"additional_special_tokens": specials})
    tok.chat_template = template
    return tok


def save_tiny_qwen2(out, base_dir):
    """A tiny Qwen2 (random weights, config in code) with a ChatML tokenizer, saved with
    save_pretrained into ``out``; returns out."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tokenizer_with(base_dir, "qwen2")
    tok.eos_token = "<|im_end|>"
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out
