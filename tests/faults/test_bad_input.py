"""Fault suite, bad input: every case is refused with one clear message (exit 2, no traceback)
and the run already in the folder, its checkpoint and adapter, is still there and loads."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from PIL import Image

from lora_gui.data import images
from tests.faults.conftest import assert_checkpoint_loads, assert_clear_error, tiny_sets

LATIN1_CAFE = "un café noir\n".encode("latin-1")  # the example: not UTF-8


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


TEXT_FILES = {  # name: (file name, content, what the message must name)
    "empty": ("empty.txt", "", "empty.txt: data file is empty"),
    "blank lines only": ("blank.txt", "\n \n\t\n", "blank.txt: data file is empty"),
    "latin-1 text": ("latin.txt", b"fine line\n" + LATIN1_CAFE, "latin.txt:2: not valid UTF-8"),
    "latin-1 jsonl": ("latin.jsonl", b'{"text": "a"}\n{"text": "b"}\n{"text": "caf\xe9"}\n',
                      "latin.jsonl:3: not valid UTF-8"),
    "malformed jsonl": ("bad.jsonl", '{"text": "ok"}\n{"text": "unterminated}\n',
                        "bad.jsonl:2: malformed JSON"),
    "jsonl not an object": ("list.jsonl", '{"text": "ok"}\n[1, 2]\n', "list.jsonl:2: expected a JSON object"),
    "jsonl without text": ("notext.jsonl", '{"text": "ok"}\n{"oops": 1}\n', "notext.jsonl:2"),
    "csv without text column": ("cols.csv", "body\nhello\n", "cols.csv:2: cannot tell the data format"),
    "csv row without text": ("hole.csv", "label,text\n1,hello\n2\n",
                             "hole.csv:3: this row has no value for 'text'"),
    "unsupported extension": ("paper.pdf", "%PDF-1.4", "unsupported extension '.pdf'"),
}


@pytest.mark.parametrize("case", list(TEXT_FILES), ids=list(TEXT_FILES))
def test_bad_text_file_is_refused_and_the_old_run_survives(case, good_run, tmp_path, cli):
    name, content, needle = TEXT_FILES[case]
    bad = _write(tmp_path / name, content)
    code, err = cli("train", "--out", good_run, "--overwrite", *tiny_sets(bad, max_steps=2))
    assert_clear_error(code, err, needle)
    assert_checkpoint_loads(good_run, 2)
    assert (good_run / "adapter" / "adapter_config.json").is_file() and (good_run / "run.json").is_file()


@pytest.mark.parametrize(("kind", "needle"), [("missing", "data file not found"),
                                              ("folder", "is a folder")])
def test_missing_data_or_a_folder_is_refused(kind, needle, good_run, tmp_path, cli):
    target = tmp_path / "nowhere.txt"
    if kind == "folder":
        target = tmp_path / "adir.txt"
        target.mkdir()
    code, err = cli("train", "--out", good_run, "--overwrite", *tiny_sets(target, max_steps=2))
    assert_clear_error(code, err, str(target), needle)
    assert_checkpoint_loads(good_run, 2)


SETTINGS = {  # name: (extra CLI arguments, what the message must name)
    "lr out of range": (["--set", "lr=5"], "lr"),
    "batch_size not a number": (["--set", "batch_size=abc"], "batch_size"),
    "negative steps": (["--set", "max_steps=-3"], "max_steps"),
    "unknown setting": (["--set", "learning_speed=3"], "learning_speed"),
    "unknown choice": (["--set", "mode=fast"], "mode"),
    "set without =": (["--set", "lr"], "expected key=value"),
    "unknown preset": (["--preset", "no-such-preset"], "no-such-preset: preset not found"),
    "resolution off the grid": (["--set", "task=image", "--set", "resolution=700"],
                                "700 is not a multiple of 64"),
    "max_seq_len above the model": (["--set", "max_seq_len=100000"], "above the model's limit"),
    "missing model folder": (["--set", "model=/no/such/model"], "/no/such/model"),
}


@pytest.mark.parametrize("case", list(SETTINGS), ids=list(SETTINGS))
def test_bad_setting_or_preset_is_refused(case, good_run, corpus, cli):
    extra, needle = SETTINGS[case]
    code, err = cli("train", "--out", good_run, "--overwrite", *tiny_sets(corpus, max_steps=2), *extra)
    assert_clear_error(code, err, needle)
    assert_checkpoint_loads(good_run, 2)


PRESET_FILES = {
    "malformed yaml": (b"lr: [1, 2\n", "not valid YAML"),
    "latin-1 yaml": (b"# caf\xe9\nlr: 0.001\n", "not valid YAML"),
    "yaml list": (b"- lr\n- 0.1\n", "expected a mapping"),
}


@pytest.mark.parametrize("case", list(PRESET_FILES), ids=list(PRESET_FILES))
def test_bad_preset_file_is_refused_naming_it(case, good_run, tmp_path, cli):
    content, needle = PRESET_FILES[case]
    preset = _write(tmp_path / "mine.yaml", content)
    code, err = cli("train", "--out", good_run, "--overwrite", "--preset", preset)
    assert_clear_error(code, err, "mine.yaml", needle)
    assert_checkpoint_loads(good_run, 2)


def _png(path: Path, size=(640, 512), mode="RGB") -> Path:
    colour = {"RGB": (200, 30, 30), "L": 128, "RGBA": (10, 200, 30, 90), "CMYK": (0, 200, 30, 10),
              "P": 3}[mode]
    Image.new(mode, size, colour).save(path.with_suffix(".jpg" if mode == "CMYK" else ".png"))
    return path


def _image_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder


def _bad_folder(tmp_path: Path, case: str) -> Path:
    folder = _image_folder(tmp_path, case.replace(" ", "_"))
    if case == "missing folder":
        folder.rmdir()
    elif case == "corrupt images":
        (folder / "a.png").write_bytes(b"\x89PNG\r\n not really")
        (folder / "b.jpg").write_bytes(b"")
    elif case in ("latin-1 caption", "latin-1 metadata", "malformed metadata", "4000x16 only"):
        _png(folder / "a", (4000, 16) if case == "4000x16 only" else (640, 512))
        if case == "latin-1 caption":
            (folder / "a.txt").write_bytes(LATIN1_CAFE)
        elif case == "latin-1 metadata":
            (folder / "metadata.jsonl").write_bytes(b'{"file_name": "a.png", "text": "caf\xe9"}\n')
        elif case == "malformed metadata":
            (folder / "metadata.jsonl").write_text('{"file_name": "a.png", "text": }\n', encoding="utf-8")
    return folder


IMAGE_CASES = {
    "empty folder": "holds no image",
    "missing folder": "is not a folder of images",
    "corrupt images": "none of the 2 images",
    "latin-1 caption": "a.txt:1: not valid UTF-8",
    "latin-1 metadata": "metadata.jsonl:1: not valid UTF-8",
    "malformed metadata": "metadata.jsonl:1: expected a JSON object",
    "4000x16 only": "no image is large enough",
}


@pytest.mark.parametrize("case", list(IMAGE_CASES), ids=list(IMAGE_CASES))
def test_bad_image_folder_is_refused_and_the_old_run_survives(case, good_run, tmp_path, cli):
    folder = _bad_folder(tmp_path, case)
    code, err = cli("train", "--out", good_run, "--overwrite", "--set", "task=image",
                    "--set", f"data={folder}", "--set", "max_steps=1")
    assert_clear_error(code, err, IMAGE_CASES[case])
    if "caption" in case or "metadata" in case:
        assert str(folder) in err  # the message names the file, not only the folder
    assert_checkpoint_loads(good_run, 2)


@pytest.mark.parametrize("mode", ["L", "RGBA", "CMYK", "P"])
def test_grayscale_rgba_cmyk_palette_images_become_rgb_pixels(mode, tmp_path):
    folder = _image_folder(tmp_path, mode)
    _png(folder / "a", mode=mode)
    (item,) = images.load_image_folder(folder)
    pixels, _ = images.load_pixels(item, (512, 512))
    assert pixels.shape == (3, 512, 512) and pixels.dtype == torch.float32
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0


def test_a_4000x16_image_is_skipped_by_name_and_the_others_train(tmp_path, caplog):
    folder = _image_folder(tmp_path, "mixed")
    _png(folder / "sliver", (4000, 16))
    _png(folder / "fine", (640, 512))
    with caplog.at_level(logging.WARNING):
        items = images.load_image_folder(folder)
        kept, buckets = images.assign_buckets(items, images.make_buckets(512))
    assert [k.path.name for k in kept] == ["fine.png"] and len(buckets) == 1
    assert "sliver.png" in caplog.text


def test_caption_files_are_read_as_utf8_with_or_without_bom(tmp_path):
    folder = _image_folder(tmp_path, "captions")
    _png(folder / "a")
    _png(folder / "b")
    (folder / "a.txt").write_bytes("\ufeffun café noir".encode())
    (folder / "metadata.jsonl").write_text(json.dumps({"file_name": "b.png", "text": "thé vert"}) + "\n",
                                           encoding="utf-8")
    assert [i.caption for i in images.load_image_folder(folder)] == ["un café noir", "thé vert"]


def test_offload_beyond_free_host_memory_is_refused_with_both_figures(good_run, corpus, cli, monkeypatch):
    from lora_gui.memory.runtime import host

    monkeypatch.setattr(host, "host_available_bytes", lambda: 1000)  # 1 kB free
    switches = tiny_sets(corpus, max_steps=2, gradient_checkpointing="true", offload_checkpoints="true")
    code, err = cli("train", "--out", good_run, "--overwrite", *switches)
    assert_clear_error(code, err, "offloaded checkpoints", "GB of host memory; 0.00000100 GB is available")
    assert_checkpoint_loads(good_run, 2)  # the old run is kept
