import json

import pytest

from lora_gui.data.text import (
    IGNORE_INDEX,
    DataError,
    Document,
    load_documents,
    split_documents,
    tokenize_documents,
)
from lora_gui.models.text import load_tokenizer


def test_txt_blocks(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("one\nline two\n\n\nthree\n\n", encoding="utf-8")
    assert [d.text for d in load_documents(p)] == ["one\nline two", "three"]


def test_jsonl_text_and_prompt_response(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text(json.dumps({"text": "hello"}) + "\n\n" + json.dumps({"prompt": "Q", "response": "A"}) + "\n")
    assert load_documents(p) == [Document("hello"), Document("A", prompt="Q")]


def test_csv_text_column(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text('id,text\n1,"hello, world"\n2,second\n', encoding="utf-8")
    assert [d.text for d in load_documents(p)] == ["hello, world", "second"]


@pytest.mark.parametrize("name, content, words", [
    ("missing.txt", None, ["missing.txt", "not found"]),
    ("empty.txt", b"  \n\n", ["empty.txt", "empty"]),
    ("latin.txt", "ok line\ncaf\xe9\n".encode("latin-1"), ["latin.txt:2", "UTF-8"]),
    ("bad.jsonl", b'{"text": "a"}\n{"text": \n', ["bad.jsonl:2", "malformed JSON"]),
    ("fields.jsonl", b'{"text": "a"}\n{"prompt": "p"}\n', ["fields.jsonl:2", "prompt", "response"]),
    ("list.jsonl", b'[1, 2]\n', ["list.jsonl:1", "object"]),
    ("nocol.csv", b"body\nx\n", ["nocol.csv:1", "'text' column"]),
    ("data.parquet", b"x", ["data.parquet", "unsupported"]),
])
def test_bad_files_name_file_and_line(tmp_path, name, content, words):
    p = tmp_path / name
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(DataError) as err:
        load_documents(p)
    for word in words:
        assert word in str(err.value)


def test_split_is_reproducible_and_disjoint():
    docs = [Document(str(i)) for i in range(100)]
    a_train, a_eval = split_documents(docs, 0.1, seed=3)
    b_train, b_eval = split_documents(docs, 0.1, seed=3)
    assert a_eval == b_eval and len(a_eval) == 10 and len(a_train) == 90
    assert not set(d.text for d in a_train) & set(d.text for d in a_eval)
    assert split_documents(docs, 0.1, seed=4)[1] != a_eval


def test_prompt_tokens_carry_no_loss(builtin_model_dir):
    tok = load_tokenizer(str(builtin_model_dir))
    [sample] = tokenize_documents([Document("the answer", prompt="the question")], tok, 64)
    n_prompt = 1 + len(tok("the question", add_special_tokens=False)["input_ids"])
    assert sample.labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert sample.labels[n_prompt:] == sample.input_ids[n_prompt:]
    assert sample.input_ids[-1] == tok.eos_token_id


def test_truncation_to_max_seq_len(builtin_model_dir):
    tok = load_tokenizer(str(builtin_model_dir))
    [sample] = tokenize_documents([Document("word " * 500)], tok, 32)
    assert len(sample.input_ids) == 32 == len(sample.labels)
