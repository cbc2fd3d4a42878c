"""Image folders, captions, aspect buckets, resize + crop, and the bad input the issue lists."""

import json
import logging
import math
import types

import pytest
from PIL import Image

from lora_gui.config import ConfigError
from lora_gui.data import images
from lora_gui.presets import load_config


def _png(path, size=(640, 480), colour=(200, 30, 30)):
    Image.new("RGB", size, colour).save(path)
    return path


@pytest.mark.parametrize("res", [512, 768, 1024, 1536])
def test_buckets_are_64_multiples_of_about_equal_area(res):
    buckets = images.make_buckets(res, max_ratio=2.0)
    assert (res, res) in buckets
    for w, h in buckets:
        assert w % 64 == 0 and h % 64 == 0
        assert w * h <= res * res
        assert w * h >= 0.85 * res * res  # the 64 grid costs at most a few percent of the area
        assert max(w, h) / min(w, h) <= 2.0
    assert any(w / h > 1.5 for w, h in buckets) and any(h / w > 1.5 for w, h in buckets)


def test_ratio_limit_is_configurable():
    wide = max(w / h for w, h in images.make_buckets(512, max_ratio=4.0))
    narrow = max(w / h for w, h in images.make_buckets(512, max_ratio=1.5))
    assert narrow <= 1.5 < 3.0 < wide


def test_nearest_bucket_and_crop_keep_the_aspect_and_report_the_corner():
    buckets = images.make_buckets(512)
    assert images.nearest_bucket((1920, 1080), buckets) == (640, 384)
    assert images.nearest_bucket((1000, 1000), buckets) == (512, 512)
    img = Image.new("RGB", (1000, 500))
    out, (top, left) = images.resize_crop(img, (640, 384))
    assert out.size == (640, 384)
    assert top == 0 and left == (768 - 640) // 2  # scaled to 768x384 first, centred horizontally


def test_no_upscale_only_uses_buckets_inside_the_image():
    buckets = images.make_buckets(512)
    assert images.nearest_bucket((300, 300), buckets, no_upscale=True) is None
    w, h = images.nearest_bucket((600, 500), buckets, no_upscale=True)
    assert w <= 600 and h <= 500


def test_captions_from_txt_and_metadata_jsonl_and_missing_ones_warned_once(tmp_path, caplog):
    _png(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("a red square\n")
    _png(tmp_path / "b.png")
    _png(tmp_path / "c.png")
    _png(tmp_path / "d.png")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "b.png", "text": "from meta"}) + "\n")
    with caplog.at_level(logging.WARNING):
        items = images.load_image_folder(tmp_path)
    assert [i.caption for i in items] == ["a red square", "from meta", "", ""]
    warnings = [r.getMessage() for r in caplog.records if "no caption" in r.getMessage()]
    assert len(warnings) == 1 and "2 of 4 images" in warnings[0]


def test_truncated_and_unreadable_images_are_skipped_by_name(tmp_path, caplog):
    _png(tmp_path / "good.png")
    full = (tmp_path / "good.png").read_bytes()
    (tmp_path / "truncated.png").write_bytes(full[: len(full) // 2])
    (tmp_path / "garbage.jpg").write_bytes(b"not an image at all")
    with caplog.at_level(logging.WARNING):
        items = images.load_image_folder(tmp_path)
    assert [i.path.name for i in items] == ["good.png"]
    text = caplog.text
    assert "truncated.png" in text and "garbage.jpg" in text


def test_no_readable_image_is_a_clear_error(tmp_path):
    (tmp_path / "x.png").write_bytes(b"broken")
    with pytest.raises(images.ImageDataError, match="none of the 1 images"):
        images.load_image_folder(tmp_path)
    with pytest.raises(images.ImageDataError, match="holds no image"):
        images.load_image_folder(_empty(tmp_path))
    with pytest.raises(images.ImageDataError, match="is not a folder"):
        images.load_image_folder(tmp_path / "missing")


def _empty(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def test_images_smaller_than_the_smallest_bucket_are_skipped(tmp_path, caplog):
    big = images.ImageItem(_png(tmp_path / "big.png", (1024, 1024)), "", (1024, 1024))
    tiny = images.ImageItem(_png(tmp_path / "tiny.png", (100, 80)), "", (100, 80))
    buckets = images.make_buckets(512)
    with caplog.at_level(logging.WARNING):
        kept, chosen = images.assign_buckets([big, tiny], buckets)
    assert [k.path.name for k in kept] == ["big.png"] and chosen == [(512, 512)]
    assert "tiny.png" in caplog.text and "smaller than the smallest usable bucket" in caplog.text
    with pytest.raises(images.ImageDataError, match="no image is large enough"):
        images.assign_buckets([tiny], buckets, no_upscale=True)


@pytest.mark.parametrize(("value", "message"), [(700, "700 is not a multiple of 64"),
                                                (32, "32 is out of range"),
                                                (1600, "1600 is out of range")])
def test_resolution_outside_64_1536_or_off_grid_is_refused(value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, {"task": "image", "resolution": value})
    with pytest.raises(images.ImageDataError, match=f"{value}"):
        images.check_resolution(value)


def test_pixels_are_in_the_vae_range_and_bucket_shaped(tmp_path):
    item = images.ImageItem(_png(tmp_path / "p.png", (1216, 832), (255, 0, 0)), "", (1216, 832))
    px, corner = images.load_pixels(item, (576, 448))
    assert px.shape == (3, 448, 576)
    assert math.isclose(px[0].mean().item(), 1.0, abs_tol=1e-3) and px[1].max().item() <= -0.99
    assert corner[0] == 0 and corner[1] >= 0


def _ram_and_disk_caches(items, buckets, tmp_path):
    """The built-in model's RAM and disk caches of ``items``, built."""
    import torch

    from lora_gui.engine.image.inputs import InputSource
    from lora_gui.models.diffusion import load_image_model, resolve_pipeline_source

    model = load_image_model(resolve_pipeline_source("builtin"))
    cpu = torch.device("cpu")
    ram = InputSource(model, items, buckets, "ram", cpu)
    disk = InputSource(model, items, buckets, "disk", cpu, tmp_path / "cache")
    ram.build_cache()
    disk.build_cache()
    return ram, disk


def test_disk_and_ram_caches_give_the_same_inputs(tmp_path):
    import torch

    from lora_gui.data.build_images import build

    items = images.load_image_folder(build(tmp_path / "pics", count=2)[0].parent)
    ram, disk = _ram_and_disk_caches(items, [(512, 512), (512, 512)], tmp_path)
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 2
    a, b = ram.batch((0, 1), torch.float32), disk.batch((0, 1), torch.float32)
    assert a.latents.shape == (2, 4, 64, 64) and a.hidden.shape[:2] == (2, 77)
    assert torch.equal(a.latents, b.latents) and torch.equal(a.hidden, b.hidden)


def test_the_ram_cache_holds_each_caption_once(tmp_path):
    """Images sharing a caption (one instance prompt) share its cached embeddings: the same
    tensors (not copies) and the same values as encoding it for each image; the run's plan
    counts each distinct caption once."""
    import dataclasses

    import torch

    from lora_gui.data.build_images import build
    from lora_gui.memory.predict.image_run import distinct_captions

    items = images.load_image_folder(build(tmp_path / "pics", count=3)[0].parent)
    items = [dataclasses.replace(item, caption="a photo of sks star") for item in items[:2]] + items[2:]
    ram, disk = _ram_and_disk_caches(items, [(256, 256)] * 3, tmp_path)
    assert ram._ram[0].hidden is ram._ram[1].hidden and ram._ram[2].hidden is not ram._ram[0].hidden
    assert not torch.equal(ram._ram[0].latents, ram._ram[1].latents)  # the pictures differ
    a, b = ram.batch((0, 1, 2), torch.float32), disk.batch((0, 1, 2), torch.float32)
    assert torch.equal(a.hidden, b.hidden) and torch.equal(a.latents, b.latents)
    assert distinct_captions(types.SimpleNamespace(train=items)) == 2


def test_a_short_run_plans_only_the_micro_batches_it_trains():
    """The image planner traces the largest micro-batch of the steps the run executes: with
    ``max_steps`` below an epoch, buckets no executed step reaches are left out, and a bucket's
    micro-batch is what its executed steps hold (dealt over the processes)."""
    from lora_gui.config import RunConfig, apply_overrides
    from lora_gui.data.image_batches import epoch_plan, executed_bucket_sizes

    buckets = [(512, 512)] * 5 + [(768, 512)] * 3 + [(512, 768)]
    cfg = apply_overrides(RunConfig(), {"task": "image", "batch_size": 4, "max_steps": 1, "seed": 3})
    first = epoch_plan(cfg, buckets, 0)[0].micro_batches[0]
    sizes = executed_bucket_sizes(cfg, buckets)
    assert sizes == {buckets[first.indices[0]]: len(first.indices)}
    whole = executed_bucket_sizes(apply_overrides(cfg, {"max_steps": 0, "epochs": 1}), buckets)
    assert whole == {(512, 512): 4, (768, 512): 3, (512, 768): 1}
    assert executed_bucket_sizes(apply_overrides(cfg, {"max_steps": 0, "epochs": 1}), buckets, 2) == {
        (512, 512): 2, (768, 512): 2, (512, 768): 1}
