"""A checkpoint that does not belong to the run is refused with a message; nothing is written."""

import pytest
import torch

from lora_gui.config import BUILTIN_MODEL_DIR, ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core.checkpoint import latest_checkpoint, read_checkpoint
from lora_gui.engine.core.resume import check_adapter, check_sampler
from lora_gui.engine.text.train import train_text
from lora_gui.models import text as text_models


def test_resume_after_the_data_changed_is_refused_and_nothing_is_written(tmp_path, small_corpus):
    cfg = apply_overrides(RunConfig(), {"data": str(small_corpus), "max_seq_len": 64, "batch_size": 4,
                                        "max_steps": 2, "eval_fraction": 0.1, "precision": "fp32",
                                        "monitor_hz": 0.0})
    out = tmp_path / "run"
    train_text(cfg, out, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    small_corpus.write_text(small_corpus.read_text() + "\n\na brand new document for the corpus\n")
    more = apply_overrides(cfg, {"max_steps": 4})
    with pytest.raises(ConfigError, match=r"checkpoint from an incompatible run: train_samples 36 then, "
                                          r"37 now.*data file changed.*nothing was changed"):
        train_text(more, out, resume=True, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    state = read_checkpoint(latest_checkpoint(out))["trainer"]
    assert state["sampler"]["train_samples"] == 36 and state["world_size"] == 1


def test_sampler_state_of_old_checkpoints_is_not_checked(tmp_path):
    check_sampler(tmp_path, None, {"seed": 1})  # written before the sampler state existed
    with pytest.raises(ConfigError, match="seed 0 then, 1 now"):
        check_sampler(tmp_path, {"seed": 0}, {"seed": 1})


def test_adapter_of_another_lora_config_is_refused(tmp_path):
    model = text_models.attach_lora(text_models.load_base_model(str(BUILTIN_MODEL_DIR), "sdpa"),
                                    apply_overrides(RunConfig(), {"lora_rank": 8}))
    from peft import get_peft_model_state_dict

    good = get_peft_model_state_dict(model)
    check_adapter(tmp_path, good, model)
    wrong = {k: torch.zeros(4, *v.shape[1:]) if "lora_A" in k else v for k, v in good.items()}
    with pytest.raises(ConfigError, match=r"another model or LoRA config.*lora_A.weight is "
                                          r"\(4, \d+\), this model needs \(8, \d+\)"):
        check_adapter(tmp_path, wrong, model)
    with pytest.raises(ConfigError, match="LoRA tensors missing"):
        check_adapter(tmp_path, dict(list(good.items())[:3]), model)
