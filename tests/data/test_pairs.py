"""Preference pairs: every layout and file kind, the answer-only loss, bad pairs named by file and
line, long pairs skipped and counted or their prompts cut (never an answer); the losses' values."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lora_gui.config import BUILTIN_DATA, ConfigError, RunConfig, apply_overrides
from lora_gui.data.pairs import load_pairs, read_pairs
from lora_gui.data.text import IGNORE_INDEX, DataError
from lora_gui.models.preference_loss import (
    PreferenceLoss,
    chunked_sequence_logps,
    losses_from_logps,
    sequence_logps,
)
from lora_gui.models.text import load_tokenizer

PROMPT, GOOD, BAD = "what is ice", "Happy to help! frozen water.", "frozen water."
STRINGS = {"prompt": PROMPT, "chosen": GOOD, "rejected": BAD}
SYSTEM = {"role": "system", "content": "be brief"}
MESSAGES = {"prompt": PROMPT,  # UltraFeedback: the prompt beside the lists is not used
            "chosen": [SYSTEM, {"role": "user", "content": PROMPT}, {"role": "assistant", "content": GOOD}],
            "rejected": [SYSTEM, {"role": "user", "content": PROMPT}, {"role": "assistant", "content": BAD}]}
TRL_CONVERSATIONAL = {"prompt": [{"role": "user", "content": PROMPT}],
                      "chosen": [{"role": "assistant", "content": GOOD}],
                      "rejected": [{"role": "assistant", "content": BAD}]}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture()
def tok(builtin_model_dir):
    return load_tokenizer(str(builtin_model_dir))


def _answer_text(tok, sample) -> str:
    return tok.decode([t for t, label in zip(sample.input_ids, sample.labels) if label != IGNORE_INDEX])


@pytest.mark.parametrize("record", [STRINGS, MESSAGES, TRL_CONVERSATIONAL],
                         ids=["strings", "messages", "trl"])
def test_each_layout_gives_the_same_answers_with_the_loss_on_them_only(tmp_path, tok, record):
    path = write_jsonl(tmp_path / "p.jsonl", [record] * 4)
    loaded = load_pairs(path, tok, max_seq_len=256, eval_fraction=0.25, seed=0)
    assert len(loaded.train) == 3 and len(loaded.held_out) == 1 and loaded.skipped == 0
    pair = loaded.train[0]
    assert _answer_text(tok, pair.chosen).startswith(GOOD)
    assert _answer_text(tok, pair.rejected).startswith(BAD)
    assert "<|im_end|>" in _answer_text(tok, pair.chosen)  # the end of turn is trained, as in SFT
    assert PROMPT in tok.decode(pair.chosen.input_ids) and len(pair) == len(pair.chosen)


def test_csv_parquet_and_save_to_disk_read_the_same_pairs(tmp_path, tok):
    import datasets

    rows = [STRINGS, {**MESSAGES, "chosen": json.dumps(MESSAGES["chosen"]),
                      "rejected": json.dumps(MESSAGES["rejected"])}]
    csv = tmp_path / "p.csv"
    with csv.open("w", newline="", encoding="utf-8") as fh:
        import csv as csv_mod

        writer = csv_mod.DictWriter(fh, fieldnames=["prompt", "chosen", "rejected"])
        writer.writeheader()
        writer.writerows(rows)
    table = datasets.Dataset.from_list([STRINGS, STRINGS])
    table.to_parquet(str(tmp_path / "p.parquet"))
    table.save_to_disk(str(tmp_path / "disk"))
    for path in (csv, tmp_path / "p.parquet", tmp_path / "disk"):
        pairs = read_pairs(path)
        assert [p.chosen for p in pairs] == [GOOD, GOOD] and [p.rejected for p in pairs] == [BAD, BAD]


@pytest.mark.parametrize("record, message", [
    ({"prompt": PROMPT, "chosen": GOOD}, "no 'rejected' answer"),
    ({**STRINGS, "rejected": "  "}, "rejected answer is missing or empty"),
    ({**STRINGS, "chosen": None}, "chosen answer is missing or empty"),
    ({**STRINGS, "rejected": GOOD}, "chosen and rejected answers are the same"),
    ({**STRINGS, "prompt": ""}, "prompt is missing or empty"),
    ({**MESSAGES, "rejected": [SYSTEM, {"role": "user", "content": "other"},
                               {"role": "assistant", "content": BAD}]}, r"prompt differs .*message 2"),
    ({**MESSAGES, "chosen": MESSAGES["chosen"][:2]}, "must end with the assistant's answer"),
])
def test_a_bad_pair_is_refused_naming_the_file_and_line(tmp_path, tok, record, message):
    path = write_jsonl(tmp_path / "p.jsonl", [STRINGS, STRINGS, record])
    with pytest.raises(DataError, match=message) as err:
        load_pairs(path, tok, max_seq_len=256, eval_fraction=0.0, seed=0)
    assert f"{path}:3" in str(err.value)


def test_long_pairs_are_skipped_and_counted_or_their_prompt_cut_never_an_answer(tmp_path, tok, caplog):
    long_prompt = {**STRINGS, "prompt": "tell me " * 40 + PROMPT}
    path = write_jsonl(tmp_path / "p.jsonl", [STRINGS, long_prompt, STRINGS])
    def every(loaded):  # eval_fraction 0 still holds one pair out
        return sorted(loaded.train + loaded.held_out, key=lambda p: p.where)

    full = every(load_pairs(path, tok, max_seq_len=1024, eval_fraction=0.0, seed=0))
    limit = len(full[0]) + 8  # the short pairs fit, the long prompt does not
    loaded = load_pairs(path, tok, max_seq_len=limit, eval_fraction=0.0, seed=0)
    assert len(every(loaded)) == 2 and loaded.skipped == 1
    assert f"{path}:2" in caplog.text and "1 of 3 pairs skipped" in caplog.text
    cut = every(load_pairs(path, tok, max_seq_len=limit, eval_fraction=0.0, seed=0,
                           long_pairs="truncate_prompt"))
    assert len(cut) == 3 and max(len(p) for p in cut) <= limit < len(full[1])
    assert _answer_text(tok, cut[1].chosen) == _answer_text(tok, full[1].chosen)  # the answer whole
    assert _answer_text(tok, cut[1].rejected) == _answer_text(tok, full[1].rejected)
    with pytest.raises(DataError, match="no pair fits max_seq_len=16"):
        load_pairs(path, tok, max_seq_len=16, eval_fraction=0.0, seed=0)


def test_the_bundled_demo_pairs_and_preset_settings():
    pairs = read_pairs(BUILTIN_DATA["builtin:pairs"])
    assert len(pairs) == 400 and all(p.chosen.startswith("Happy to help!") for p in pairs)
    assert (BUILTIN_DATA["builtin:pairs"].parent / "LICENSE.md").read_text().count("BSD") >= 1
    cfg = apply_overrides(RunConfig(), {"objective": "simpo", "beta": 2.0, "dpo_loss": "ipo"})
    assert cfg.rows_per_sample() == 2 and cfg.sample_token_budget() == cfg.token_budget // 2
    with pytest.raises(ConfigError, match="objective: dpo is for text runs"):
        apply_overrides(RunConfig(), {"objective": "dpo", "task": "image"})
    with pytest.raises(ConfigError, match="batching: packed"):
        apply_overrides(RunConfig(), {"objective": "dpo", "batching": "packed"})
    with pytest.raises(ConfigError, match="dpo_loss: 'kto' is not one of"):
        apply_overrides(RunConfig(), {"dpo_loss": "kto"})


def test_the_losses_take_their_published_values():
    logps = torch.tensor([-4.0, -10.0, -6.0, -9.0])  # two pairs: chosen rows, then rejected rows
    counts = torch.tensor([2, 5, 3, 3])
    ref = torch.tensor([-5.0, -10.0, -5.0, -9.0])
    h = torch.tensor([(-4 + 5) - (-6 + 5), 0.0])  # policy-minus-reference margins
    dpo = losses_from_logps(PreferenceLoss("dpo", beta=0.5), logps, counts, ref)
    assert torch.allclose(dpo[0], -torch.nn.functional.logsigmoid(0.5 * h))
    assert dpo[0][1].item() == pytest.approx(math.log(2))  # no margin: log 2
    ipo = losses_from_logps(PreferenceLoss("dpo", beta=0.5, dpo_loss="ipo"), logps, counts, ref)[0]
    assert torch.allclose(ipo, (h - 1.0) ** 2)
    hinge = losses_from_logps(PreferenceLoss("dpo", beta=0.5, dpo_loss="hinge"), logps, counts, ref)[0]
    assert torch.allclose(hinge, torch.relu(1 - 0.5 * h))
    avg = logps / counts
    simpo = losses_from_logps(PreferenceLoss("simpo", beta=2.0, simpo_gamma=0.5), logps, counts, None)
    assert torch.allclose(simpo[0], -torch.nn.functional.logsigmoid(2.0 * (avg[:2] - avg[2:]) - 0.5))
    orpo = losses_from_logps(PreferenceLoss("orpo", orpo_lambda=0.2), logps, counts, None)[0]
    odds = avg - torch.log1p(-torch.exp(avg))
    expected = -avg[:2] - 0.2 * torch.nn.functional.logsigmoid(odds[:2] - odds[2:])
    assert torch.allclose(orpo, expected)


def test_sequence_logps_sum_the_answer_tokens_only():
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 3, 4, IGNORE_INDEX], [IGNORE_INDEX, 1, 2, 3, 4]])
    sums, counts = sequence_logps(logits, labels)
    logp = logits.log_softmax(-1)
    assert counts.tolist() == [2, 4]
    assert sums[0].item() == pytest.approx((logp[0, 1, 3] + logp[0, 2, 4]).item(), rel=1e-5)
    assert sums[1].item() == pytest.approx(sum(logp[1, i - 1, labels[1, i]] for i in range(1, 5)).item(),
                                           rel=1e-5)


def test_chunked_logps_equal_the_full_logits_values_and_gradients():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(3, 6, 8, requires_grad=True)
    labels = torch.randint(0, 11, (3, 6))
    labels[:, :2] = IGNORE_INDEX
    full, counts = sequence_logps(head(hidden), labels)
    (g_full,) = torch.autograd.grad(full.sum(), hidden)
    chunked, chunk_counts = chunked_sequence_logps(hidden, labels, head, chunk=4)
    (g_chunked,) = torch.autograd.grad(chunked.sum(), hidden)
    assert torch.equal(counts, chunk_counts)
    assert torch.allclose(full, chunked, atol=1e-5) and torch.allclose(g_full, g_chunked, atol=1e-6)
