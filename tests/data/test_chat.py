"""Chat data: formats, answer-only masks on three template families, and bad input."""

from __future__ import annotations

import json
import logging

import pytest

from lora_gui.data.chat import Conversation, read_data
from lora_gui.data.chat_template import CHATML_TEMPLATE, ensure_chat_template, tokenize_conversation
from lora_gui.data.text import IGNORE_INDEX, DataError
from lora_gui.data.training_data import load_samples
from lora_gui.models.text import load_tokenizer
from tests.chat_templates import TEMPLATES, tokenizer_with

TWO_TURNS = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": "What is a wave?"},
             {"role": "assistant", "content": "A moving disturbance."},
             {"role": "user", "content": "And light?"},
             {"role": "assistant", "content": "Light is a wave, and a particle."}]


def trained_runs(tok, sample):
    """Decoded text of each maximal run of trained positions."""
    runs, current = [], []
    for token, label in zip(sample.input_ids, sample.labels):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(token)
        elif current:
            runs.append(tok.decode(current))
            current = []
    if current:
        runs.append(tok.decode(current))
    return runs


@pytest.mark.parametrize("family", ["llama3", "qwen2", "mistral"])
def test_trained_positions_are_the_answers_and_their_end_of_turn(builtin_model_dir, family):
    tok = tokenizer_with(builtin_model_dir, family)
    messages = TWO_TURNS[1:] if family == "mistral" else TWO_TURNS  # Mistral refuses system turns
    sample = tokenize_conversation(tok, Conversation(messages, "x.jsonl:1"), 512)
    eot = TEMPLATES[family][2]
    answers = [m["content"] + eot for m in messages if m["role"] == "assistant"]
    assert [r.strip() for r in trained_runs(tok, sample)] == answers


def test_chatml_default_uses_generation_masks_and_matches_offset_masking(builtin_model_dir):
    tok = load_tokenizer(str(builtin_model_dir))
    assert ensure_chat_template(tok, "auto") == ["<|im_start|>", "<|im_end|>"]
    assert tok.chat_template == CHATML_TEMPLATE
    conv = Conversation(TWO_TURNS, "x.jsonl:1")
    by_generation = tokenize_conversation(tok, conv, 512)
    tok.chat_template = CHATML_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    by_offsets = tokenize_conversation(tok, conv, 512)
    assert by_generation == by_offsets
    assert [r.strip() for r in trained_runs(tok, by_offsets)] == [
        "A moving disturbance.<|im_end|>", "Light is a wave, and a particle.<|im_end|>"]


def test_train_on_prompt_trains_every_token(builtin_model_dir):
    tok = tokenizer_with(builtin_model_dir, "qwen2")
    sample = tokenize_conversation(tok, Conversation(TWO_TURNS, "x:1"), 512, train_on_prompt=True)
    assert sample.labels == sample.input_ids


def test_truncation_past_every_answer_drops_the_conversation(builtin_model_dir):
    tok = tokenizer_with(builtin_model_dir, "qwen2")
    long = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "yes"}]
    assert tokenize_conversation(tok, Conversation(long, "x:1"), 32) is None


CONV = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
SAME = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]


def _write(path, records):
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif suffix == ".json":
        path.write_text(json.dumps(records, indent=1))
    elif suffix == ".csv":
        import csv

        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()}
                             for r in records)
    else:
        import datasets

        table = datasets.Dataset.from_list(records)
        table.to_parquet(str(path)) if suffix == ".parquet" else table.save_to_disk(str(path))
    return path


@pytest.mark.parametrize("name", ["a.jsonl", "a.json", "a.csv", "a.parquet", "saved"])
@pytest.mark.parametrize("record,fmt", [
    (CONV, "messages"),
    ({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]}, "sharegpt"),
    ({"instruction": "Hi", "input": "", "output": "Hello!"}, "alpaca"),
])
def test_each_format_in_each_file_type_reads_as_the_same_conversation(tmp_path, name, record, fmt):
    path = _write(tmp_path / name, [record, record])
    detected, convs = read_data(path)
    assert detected == fmt
    assert [c.messages for c in convs] == [SAME, SAME]
    assert read_data(path, fmt)[0] == fmt


def test_alpaca_input_and_system_and_text_formats(tmp_path):
    path = _write(tmp_path / "a.jsonl", [{"instruction": "Add", "input": "1 and 2", "output": "3",
                                          "system": "Math."}])
    assert read_data(path)[1][0].messages == [
        {"role": "system", "content": "Math."}, {"role": "user", "content": "Add\n\n1 and 2"},
        {"role": "assistant", "content": "3"}]
    fmt, docs = read_data(_write(tmp_path / "t.parquet", [{"text": "hello"}]))
    assert fmt == "text" and docs[0].text == "hello"


def test_tools_field_is_ignored_with_a_warning(tmp_path, caplog):
    path = _write(tmp_path / "a.jsonl", [{**CONV, "tools": [{"name": "x"}]}])
    with caplog.at_level(logging.WARNING):
        assert read_data(path)[1][0].messages == SAME
    assert "'tools' field is ignored" in caplog.text


@pytest.mark.parametrize("record,message", [
    ({"messages": [{"role": "user", "content": "Hi"}]}, "a.jsonl:2: the conversation has no assistant turn"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " "}]},
     "a.jsonl:2: assistant turn (message 2) is empty"),
    ({"messages": [{"role": "robot", "content": "Hi"}]}, "a.jsonl:2: message 1 has unknown role 'robot'"),
    ({"conversations": [{"from": "alien", "value": "Hi"}]},
     "a.jsonl:2: this record is not in the messages format of the first record"),
    ({"question": "Hi"}, "a.jsonl:2: this record is not in the messages format"),
])
def test_bad_conversations_name_file_and_line(tmp_path, record, message):
    path = _write(tmp_path / "a.jsonl", [CONV, record])
    with pytest.raises(DataError) as err:
        read_data(path)
    assert message in str(err.value).replace(str(tmp_path) + "/", "")


def test_data_format_that_does_not_match_the_file(tmp_path):
    path = _write(tmp_path / "a.jsonl", [CONV])
    with pytest.raises(DataError, match="data_format: 'alpaca' does not match .*a.jsonl:1"):
        read_data(path, "alpaca")
    txt = tmp_path / "a.txt"
    txt.write_text("plain text\n")
    with pytest.raises(DataError, match="data_format: 'messages' does not match"):
        load_samples(txt, None, data_format="messages", max_seq_len=64, eval_fraction=0, seed=0)


def test_unknown_sharegpt_speaker_and_unknown_keys(tmp_path):
    path = _write(tmp_path / "a.jsonl", [{"conversations": [{"from": "alien", "value": "Hi"}]}])
    with pytest.raises(DataError, match="a.jsonl:1: turn 1 has unknown 'from' 'alien'"):
        read_data(path)
    with pytest.raises(DataError, match="a.jsonl:1: cannot tell the data format"):
        read_data(_write(tmp_path / "a.jsonl", [{"question": "Hi"}]))


def test_json_list_errors_name_the_line(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[\n {"messages": []},\n {"messages": [{"role": "user", "content": "x"}]}\n]')
    with pytest.raises(DataError, match=r"a.json:2: 'messages' must be a non-empty list"):
        read_data(path)


@pytest.mark.parametrize("content,message", [
    ("label,text\n1,hello\n2\n", "a.csv:3: this row has no value for 'text': it has 1 cell where the "
                                 "header names 2 columns (label, text)"),
    ('prompt,response\nhi,"hello\nthere"\nbye\n', "a.csv:4: this row has no value for 'response'"),
    ("instruction,input,output\nAdd,1 and 2\n", "a.csv:2: this row has no value for 'output'"),
])
def test_csv_row_short_of_cells_names_file_line_and_column(tmp_path, content, message):
    path = tmp_path / "a.csv"
    path.write_text(content)
    with pytest.raises(DataError) as err:
        read_data(path)
    assert message in str(err.value).replace(str(tmp_path) + "/", "")
    assert "NoneType" not in str(err.value)


def test_csv_empty_cell_is_an_empty_value_and_a_table_null_is_named(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("label,text\n1,hello\n2,\n")  # an empty cell: the empty document is dropped
    assert [d.text for d in read_data(path)[1]] == ["hello"]
    table = _write(tmp_path / "t.parquet", [{"prompt": "Hi", "response": "Hello"},
                                            {"prompt": "Bye", "response": None}])
    with pytest.raises(DataError, match=r"t.parquet: row 2: no value for 'response'"):
        read_data(table)


def test_template_rejection_carries_its_message_and_line(builtin_model_dir, tmp_path):
    tok = tokenizer_with(builtin_model_dir, "mistral")
    path = _write(tmp_path / "a.jsonl", [CONV, {"messages": TWO_TURNS}])
    with pytest.raises(DataError, match=r"a.jsonl:2: the chat template rejected this conversation: "
                                        r"Conversation roles must alternate"):
        load_samples(path, tok, data_format="auto", max_seq_len=64, eval_fraction=0, seed=0)


def test_template_that_renders_nothing(builtin_model_dir, tmp_path):
    tok = load_tokenizer(str(builtin_model_dir))
    tok.chat_template = "{% for m in messages %}{% endfor %}"
    path = _write(tmp_path / "a.jsonl", [CONV])
    with pytest.raises(DataError, match="a.jsonl:1: the chat template renders this conversation as empty"):
        load_samples(path, tok, data_format="auto", max_seq_len=64, eval_fraction=0, seed=0)


def test_folder_not_written_by_datasets_is_refused(tmp_path):
    with pytest.raises(DataError, match="not one written by datasets' save_to_disk"):
        read_data(tmp_path)
