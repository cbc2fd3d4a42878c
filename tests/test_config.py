import pytest

from lora_gui.config import ConfigError, RunConfig, apply_overrides, diff_from_defaults, parse_set_args
from lora_gui.presets import list_presets, load_config, resolve_preset


def test_defaults_are_valid():
    RunConfig().validate()


@pytest.mark.parametrize("path", list_presets(), ids=lambda p: p.name)
def test_every_preset_loads_and_starts_with_a_comment(path):
    cfg = load_config(path)
    assert diff_from_defaults(cfg), f"{path} changes nothing"
    assert path.read_text(encoding="utf-8").startswith("#"), f"{path} must say what it is for"


def test_presets_hold_only_overrides():
    for path in list_presets():
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        defaults = RunConfig().to_dict()
        same = [k for k, v in data.items() if defaults[k] == v]
        assert not same, f"{path} repeats defaults: {same}"


def test_set_parses_types_and_flat_keys():
    cfg = load_config("text-demo", parse_set_args(
        ["model=Qwen/Qwen2.5-0.5B", "max_steps=200", "mode=traditional", "lr=3e-4",
         "gradient_checkpointing=true", "budget_gb=8", "lora_rank=4"]))
    assert cfg.model == "Qwen/Qwen2.5-0.5B" and cfg.max_steps == 200 and cfg.lr == 3e-4
    assert cfg.gradient_checkpointing is True and cfg.budget_gb == 8.0 and cfg.lora_rank == 4
    assert cfg.resolved_batching() == "fixed" and cfg.resolved_attn_backend() == "eager"


def test_required_flat_keys_exist():
    names = set(RunConfig().to_dict())
    for key in ("task", "model", "data", "mode", "max_seq_len", "batch_size", "max_steps", "epochs",
                "seed", "lr", "lora_rank", "budget_gb"):
        assert key in names


@pytest.mark.parametrize("pair, words", [
    ("max_seq_len=8", ["max_seq_len", "8", "16"]),
    ("lora_rnk=4", ["lora_rnk", "lora_rank"]),
    ("mode=fast", ["mode", "fast", "optimized"]),
    ("lr=abc", ["lr", "abc"]),
    ("budget_gb=-1", ["budget_gb", "-1"]),
    ("batch_size=2.5", ["batch_size", "2.5"]),
])
def test_bad_values_name_field_value_and_range(pair, words):
    with pytest.raises(ConfigError) as err:
        load_config(None, parse_set_args([pair]))
    for word in words:
        assert word in str(err.value)


def test_unknown_preset_key_names_file_and_suggests(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("# test\nbatch_sise: 4\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "bad.yaml" in str(err.value) and "batch_size" in str(err.value)


def test_missing_preset_lists_known():
    with pytest.raises(ConfigError) as err:
        resolve_preset("no-such-preset")
    assert "text-demo" in str(err.value)


def test_set_without_equals_is_refused():
    with pytest.raises(ConfigError, match="key=value"):
        parse_set_args(["lr"])


def test_apply_overrides_does_not_mutate():
    base = RunConfig()
    new = apply_overrides(base, {"lora_rank": 2})
    assert base.lora_rank == 8 and new.lora_rank == 2


def test_a_packed_row_holds_the_token_budget_only_where_each_document_is_attended_alone():
    cfg = apply_overrides(RunConfig(), {"batching": "packed", "max_seq_len": 1024, "token_budget": 4096})
    assert cfg.packed_row_tokens() == 4096  # sdpa: one causal call per document
    assert apply_overrides(cfg, {"attn_backend": "eager"}).packed_row_tokens() == 1024  # a dense mask
    assert apply_overrides(cfg, {"mode": "traditional"}).packed_row_tokens() == 1024
    assert apply_overrides(cfg, {"token_budget": 512}).packed_row_tokens() == 512
