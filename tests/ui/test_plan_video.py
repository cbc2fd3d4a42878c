"""The Plan tab for video runs: its answer is `plan --json`'s for the same settings (the video
demo's pipeline and real clips; a bundled Wan config at a small shape), "Longest that fits" is
`video_limits` for the CLI's settings, each bad field comes back as an error naming it, and the
fields shown follow the preset and the model."""

from __future__ import annotations

import json

import pytest

from lora_gui.presets import load_config
from lora_gui.ui.tabs import longest_handlers, plan_handlers
from lora_gui.ui.tabs import plan_video_handlers as video
from lora_gui.units import gb

# a Wan 2.1 1.3B clip small enough for a busy 2-core CPU: 64 x 32 px, 5 frames (2 latent frames)
WAN = {"model": "wan2.1-t2v-1.3b", "resolution": "64x32", "video_frames": 5, "batch_size": 1,
       "blocks_to_swap": 2}


def _cli_json(capsys, *args: str) -> dict:
    from lora_gui.cli import main

    capsys.readouterr()
    assert main(["plan", "--device", "cpu", "--budget-gb", "24", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _spy(monkeypatch, module, name: str) -> list:
    """Calls of ``module.name`` (the real function runs): [(args, kwargs, result)]."""
    real, seen = getattr(module, name), []

    def spy(*args, **kwargs):
        seen.append((args, kwargs, real(*args, **kwargs)))
        return seen[-1][2]

    monkeypatch.setattr(module, name, spy)
    return seen


def _tab_plan(monkeypatch, preset: str, model: str, **video_fields):
    import lora_gui.memory.predict as predict_module

    seen = _spy(monkeypatch, predict_module, "predict")
    answer = plan_handlers.plan(preset, model, 0, 0, 24, "cpu", False, **video_fields)
    assert not answer[1].startswith("Error"), answer[1]
    assert len(seen) == 1  # one plan: the CLI's call, nothing of its own
    return answer, seen[0][2]


@pytest.mark.slow
def test_the_video_demo_plan_is_the_clis(monkeypatch, capsys):
    """video-demo on the CPU under 24 GB: the peak the tab shows is `plan --json`'s, and the
    text under it is what `plan` prints (its video_plan_lines), a bucket row per clip bucket."""
    cli = _cli_json(capsys, "--preset", "video-demo")
    (figure, text, buckets, cards), pred = _tab_plan(monkeypatch, "video-demo", "builtin:video",
                                                     video_resolution="32x32", video_frames=9, batch_size=4)
    assert pred.peak_bytes == cli["peak_bytes"] and cli["fits"] is True
    assert text.startswith("**Fits** — the video run's largest micro-batch: 4 clip(s) of 32x32x9")
    assert (f"Predicted peak: **{gb(cli['peak_bytes'])}** against the 24.00 GB budget "
            "(source: predicted, cpu)") in text
    # the lines `plan` prints
    assert "Predicted peak of the video run on cpu (source: predicted, builtin:video" in text
    assert buckets["data"] == [list(row) for row in pred.bucket_batches] == [["32x32x9", 4]]
    assert cards == [] and len(figure.data) >= 3  # the breakdown's bars


@pytest.mark.slow
def test_a_bundled_wan_config_plans_one_clip_as_the_cli_with_its_block_swap_host_memory(monkeypatch, capsys):
    """A bundled shape with a text preset picked: the task becomes video as `--set task=video`
    makes it; the same peak and host bytes as `plan --json`, the host memory named in GB."""
    cli = _cli_json(capsys, "--preset", "text-demo", "--set", "task=video",
                    *(f"--set={k}={v}" for k, v in WAN.items()))
    fields = {"video_resolution": WAN["resolution"], "video_frames": WAN["video_frames"],
              "blocks_to_swap": WAN["blocks_to_swap"], "batch_size": 1}
    (_, text, buckets, _), pred = _tab_plan(monkeypatch, "text-demo", WAN["model"], **fields)
    host = pred.step.info["host_bytes"]
    assert pred.peak_bytes == cli["peak_bytes"] and host == cli["host_bytes"] > 0
    assert f"Host memory (RAM) block swap needs: **{gb(host)}**" in text
    assert "block swap: the last 2 transformer blocks' frozen weights in host memory" in text
    assert "bundled config (shapes only)" in text and buckets["data"] == [["64x32x5", 1]]
    # less host memory than the swapped blocks need: refused as `plan --host-gb` refuses it
    _, text, _, _ = plan_handlers.plan("text-demo", WAN["model"], 0, 0, 24, "cpu", False, host_gb=host / 2e9,
                                       **fields)
    assert text == (f"Error: the host-side tensors of this run (swapped video blocks) need {gb(host)} of "
                    f"host memory; {gb(int(host / 2))} is available"), text


@pytest.mark.slow
def test_longest_that_fits_is_video_limits_for_the_clis_settings(monkeypatch):
    """Both inverse answers come from `video_limits` (as `plan --longest`) with the settings the
    CLI resolves for the same fields and budget, and the tab shows both figures in GB."""
    from lora_gui.memory.predict import longest_video
    from lora_gui.memory.predict.report import resolve_question

    seen = _spy(monkeypatch, longest_video, "video_limits")
    text = longest_handlers.plan_tab("video-demo", "builtin:video", 0.004, "cpu", False, "none", "auto", None,
                                     8, 4, video_resolution="32x32", video_frames=9)
    assert len(seen) == 1, text
    (cfg, budget, device), _, result = seen[0]
    cli = resolve_question(load_config("video-demo"), budget_gb=0.004, device="cpu",
                           budget_from="VRAM budget")
    assert cfg == cli.cfg and budget == cli.judged_against.bytes and device == "cpu"
    size = result["largest_size_at_frames"]
    assert result["frames"] > 9 and size["size"]
    assert f"- {result['note']} ({gb(result['peak_bytes_at_longest'])}, predicted)" in text
    assert f"- {size['note']} ({gb(size['peak_bytes_at_largest'])}, predicted)" in text


@pytest.mark.parametrize("fields, words", [
    ({"video_resolution": "832x48O"}, "Error: resolution: '832x48o' is not a side (512) or WxH (832x480)"),
    ({"video_resolution": "big"}, "Error: resolution: 'big' is not a side (512) or WxH (832x480)"),
    ({"video_frames": 6}, "Error: video_frames: 6 is not 4k+1 frames for this model; use 5 or 9"),
    ({"video_frames": 4.5}, "Error: video_frames: 4.5 is not a whole number"),
    ({"blocks_to_swap": "two"}, "Error: blocks_to_swap: 'two' is not a number"),
    ({"video_resolution": "72x32"},
     "Error: resolution: 72x32 is not a multiple of wan2.1-t2v-1.3b's 16 px grid"),
    ({"quantization": "nf4"},
     "Error: quantization: nf4 is for text runs; a video run stores its base in fp8"),
    ({"quantization": "fp8"}, "Error: quantization: fp8 needs gradient_checkpointing: true on a video run"),
    ({"video_window": "2,4"}, "Error: video_window: '2,4' is not three whole numbers"),
])
def test_a_bad_field_comes_back_as_an_error_naming_it(fields, words):
    """Refused before any trace: the tab's error names the field, in the settings' own words."""
    settings = {"video_resolution": "64x32", "video_frames": 5, **fields}
    quantization = settings.pop("quantization", "none")
    _, text, buckets, cards = plan_handlers.plan("text-demo", WAN["model"], 0, 0, 24, "cpu", False,
                                                 quantization, **settings)
    assert text.startswith(words), text
    assert buckets == [] and cards == []
    longest = longest_handlers.plan_tab("text-demo", WAN["model"], 24, "cpu", False, quantization,
                                        video_resolution=settings["video_resolution"],
                                        video_frames=settings["video_frames"],
                                        blocks_to_swap=settings.get("blocks_to_swap", 0),
                                        video_window=settings.get("video_window", ""))
    assert longest.startswith(words), longest


def test_more_blocks_to_swap_than_the_model_has_or_a_host_memory_that_is_no_size_names_the_field():
    _, text, _, _ = plan_handlers.plan("video-demo", "builtin:video", 0, 0, 24, "cpu", False,
                                       video_resolution="32x32", video_frames=9, blocks_to_swap=5)
    assert text == ("Error: blocks_to_swap: 5 is not possible for this model, which has 4 transformer "
                    "blocks; set 0 (off) up to 4")
    _, text, _, _ = plan_handlers.plan("video-demo", "builtin:video", 0, 0, 24, "cpu", False, host_gb=-1.0,
                                       video_resolution="32x32", video_frames=9)
    assert text == "Error: host memory: -1.0 GB is not a size (0 or more GB)"


def test_ltx_frames_are_on_its_8k_plus_1_grid_and_a_text_model_is_no_video_model():
    _, text, _, _ = plan_handlers.plan("text-demo", "ltx-video-2b", 0, 0, 24, "cpu", False,
                                       video_resolution="64x64", video_frames=5)
    assert text == "Error: video_frames: 5 is not 8k+1 frames for this model; use 1 or 9"
    _, text, _, _ = plan_handlers.plan("video-demo", "builtin", 0, 0, 24, "cpu", False,
                                       video_resolution="32x32", video_frames=9)
    assert text.startswith("Error: model: builtin is not a video model"), text


def test_the_fields_follow_the_preset_and_the_model():
    """A video preset shows the clip fields (resolution as the trainers write it, frames, block
    swap, window) and the video quantization choices, fills its own model, and hides the length;
    a text preset hides them again and leaves a video model; a bundled video config picked as
    the model shows them with any preset."""
    fields = (*video.VIDEO_FIELDS,)
    for preset, model in (("video-demo", "builtin:video"), ("ltx-demo", "builtin:ltx")):
        out = plan_handlers.preset_settings(preset, "builtin")
        length, side, quantization, filled, size, *rest = (out[0], out[1], out[3], out[7], out[8], *out[9:])
        assert length["visible"] is False and side["visible"] is False
        assert filled == model and size == {"__type__": "update", "visible": True, "value": "32x32"}
        assert [r["value"] for r in rest] == [getattr(load_config(preset), n) for n in fields] == [9, 0, ""]
        assert all(r["visible"] for r in rest) and quantization["choices"] == ["none", "fp8"]
    text = plan_handlers.preset_settings("text-demo", "builtin:video")
    assert text[0]["visible"] is True and text[7] == "builtin"
    assert not any(u["visible"] for u in text[8:]) and text[3]["choices"] == ["none", "nf4", "int8"]
    image = plan_handlers.preset_settings("image-512", "builtin")
    assert image[1]["visible"] is True and not image[8]["visible"] and image[7] == "builtin"
    for model in ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-ti2v-5b", "ltx-video-2b"):
        assert video.task_for("text-demo", model) == "video"
        updates = video.mode_updates(video.task_for("text-demo", model), "nf4")
        assert [u["visible"] for u in updates[:-1]] == [False, False, True, True, True, True]
        assert updates[-1]["choices"] == ["none", "fp8"] and updates[-1]["value"] == "none"
    assert video.task_for("text-demo", "sdxl-unet") == "image"
    assert video.task_for("text-demo", "builtin") == "text"
    assert video.mode_updates("text", "nf4")[-1]["value"] == "nf4"


@pytest.mark.slow
def test_the_train_tabs_longest_answers_a_video_run_with_both_limits(monkeypatch):
    """The Train tab's "Longest that fits" on a video form: both of video_limits' answers (it
    raised on the text search's result before), nothing filled into the form."""
    from lora_gui.memory.predict import longest_video

    seen = _spy(monkeypatch, longest_video, "video_limits")
    filled, text = longest_handlers.answer(load_config("video-demo"), 0.003, "cpu")
    assert filled == {} and len(seen) == 1, text
    result = seen[0][2]
    assert text.startswith("**Video run, budget 0.00300 GB, cpu**")
    assert f"- {result['largest_size_at_frames']['note']}" in text and f"- {result['note']}" in text
