"""Video data: clips written here with PyAV, read back with their captions, refused by name when
they cannot be used, cut to frame and size buckets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.data import videos
from lora_gui.data.video_batches import VideoGeometry, load_video_data, video_epoch_plan


def clip(path: Path, frames: int, size: tuple[int, int] = (32, 24), caption: str | None = "a clip",
         colour: tuple[int, int, int] = (200, 30, 30)) -> Path:
    """A clip whose frame i has a bright column at x = i (so the frames can be told apart)."""
    w, h = size
    arr = np.zeros((frames, h, w, 3), np.uint8)
    arr[:] = colour
    for i in range(frames):
        arr[i, :, i % w] = 255
    videos.write_clip(path, arr)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption, encoding="utf-8")
    return path


def test_folder_of_clips_with_captions_and_a_still(tmp_path):
    clip(tmp_path / "a.mp4", 9, caption="red motion")
    clip(tmp_path / "b.gif", 6, caption="a gif")
    clip(tmp_path / "c.webm", 5, caption=None)
    Image.new("RGB", (40, 30), (0, 0, 255)).save(tmp_path / "d.png")
    (tmp_path / "d.txt").write_text("a blue still", encoding="utf-8")
    items = videos.load_clips(tmp_path, min_frames=5)
    assert [(i.path.name, i.caption, i.frames, i.size) for i in items] == [
        ("a.mp4", "red motion", 9, (32, 24)), ("b.gif", "a gif", 6, (32, 24)),
        ("c.webm", "", 5, (32, 24)), ("d.png", "a blue still", 1, (40, 30))]
    assert items[3].still


def test_jsonl_of_path_and_caption(tmp_path):
    clip(tmp_path / "clips" / "x.mov", 5, caption=None)
    (tmp_path / "data.jsonl").write_text(json.dumps({"path": "clips/x.mov", "caption": "from jsonl"}) + "\n")
    [item] = videos.load_clips(tmp_path / "data.jsonl", min_frames=5)
    assert item.caption == "from jsonl" and item.frames == 5


@pytest.mark.parametrize("case", ["undecodable", "too_few", "not_utf8", "no_frames", "missing_in_jsonl"])
def test_a_bad_clip_is_refused_by_name(tmp_path, case):
    clip(tmp_path / "good.mp4", 9)
    if case == "undecodable":
        bad = tmp_path / "bad.mp4"
        bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)
    elif case == "too_few":
        bad = clip(tmp_path / "bad.mp4", 3)
    elif case == "not_utf8":
        clip(tmp_path / "bad.mp4", 9)
        bad = tmp_path / "bad.txt"
        bad.write_bytes(b"caf\xe9 au lait")
    elif case == "no_frames":
        import av

        bad = tmp_path / "bad.mp4"
        with av.open(str(bad), mode="w") as out:  # a header, no frame encoded
            stream = out.add_stream("mpeg4", rate=8)
            stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
            out.start_encoding()
    else:
        bad = tmp_path / "gone.mp4"
        (tmp_path / "list.jsonl").write_text(json.dumps({"path": "gone.mp4", "caption": "x"}) + "\n")
    source = tmp_path / "list.jsonl" if case == "missing_in_jsonl" else tmp_path
    with pytest.raises(videos.VideoDataError) as err:
        videos.load_clips(source, min_frames=5)
    assert bad.name in str(err.value)


def test_frame_buckets_and_cuts():
    assert [videos.frame_bucket(n, 17, 4) for n in (1, 4, 5, 8, 9, 16, 17, 40)] == [1, 1, 5, 5, 9, 13, 17, 17]
    assert [videos.frame_bucket(n, 49, 8) for n in (8, 9, 30, 60)] == [1, 9, 25, 49]
    assert videos.frame_indices(20, 5, "first") == [0, 1, 2, 3, 4]
    assert videos.frame_indices(20, 5, "spaced") == [0, 5, 10, 14, 19]
    with pytest.raises(videos.VideoDataError, match="4k\\+1"):
        videos.check_video_frames(16, 4)


def test_size_buckets_hold_the_target_and_the_grid():
    sizes = videos.size_buckets((832, 480), 16)
    assert (832, 480) in sizes and (480, 832) in sizes
    assert all(w % 16 == 0 and h % 16 == 0 and w * h <= 832 * 480 for w, h in sizes)


def test_clip_cut_to_its_bucket(tmp_path):
    path = clip(tmp_path / "a.mp4", 12, size=(64, 48))
    item = videos.ClipItem(path, "", (64, 48), 12)
    first = videos.load_clip(item, (32, 32, 5), "first")
    spaced = videos.load_clip(item, (32, 32, 5), "spaced")
    assert first.shape == (3, 5, 32, 32) and spaced.shape == (3, 5, 32, 32)
    assert float(first.min()) >= -1 and float(first.max()) <= 1
    assert not np.allclose(first[:, -1].numpy(), spaced[:, -1].numpy(), atol=0.1)  # frame 4 vs 11


def test_run_data_with_two_frame_buckets_and_resolution_as_wxh(tmp_path):
    for i, n in enumerate((5, 9, 9, 12)):
        clip(tmp_path / f"c{i}.mp4", n, size=(64, 32))
    cfg = apply_overrides(RunConfig(), {"task": "video", "data": str(tmp_path), "resolution": "64x32",
                                        "video_frames": 9, "eval_fraction": 0.0, "batch_size": 2})
    assert cfg.video_size == "64x32"
    data = load_video_data(cfg, VideoGeometry())
    assert sorted(data.buckets) == [(64, 32, 5), (64, 32, 9), (64, 32, 9), (64, 32, 9)]
    steps = video_epoch_plan(cfg, data.buckets, 0)
    assert sorted(len(s.indices) for s in steps) == [1, 1, 2]
    assert all(len({data.buckets[i] for i in s.indices}) == 1 for s in steps)


def test_windows_make_a_long_clip_several_clips(tmp_path):
    clip(tmp_path / "long.mp4", 20, size=(64, 32))
    clip(tmp_path / "short.mp4", 6, size=(64, 32))
    base = {"task": "video", "data": str(tmp_path), "resolution": "64x32", "video_frames": 9,
            "eval_fraction": 0.0}
    first = load_video_data(apply_overrides(RunConfig(), base), VideoGeometry())
    windows = load_video_data(apply_overrides(RunConfig(), {**base, "clip_frames": "windows"}),
                              VideoGeometry())
    assert [(i.path.name, i.start) for i in first.train] == [("long.mp4", 0), ("short.mp4", 0)]
    assert [(i.path.name, i.start) for i in windows.train] == [("long.mp4", 0), ("long.mp4", 9),
                                                               ("short.mp4", 0)]
    assert windows.buckets == [(64, 32, 9), (64, 32, 9), (64, 32, 5)]
    second = videos.load_clip(windows.train[1], windows.buckets[1], "windows")
    direct = videos.load_clip(videos.ClipItem(windows.train[1].path, "", (64, 32), 20), (64, 32, 18))
    assert np.allclose(second.numpy(), direct[:, 9:].numpy())  # frames 9-17 of the clip


def test_resolution_as_a_side_replaces_an_earlier_wxh():
    cfg = apply_overrides(RunConfig(), {"task": "video", "resolution": "832x480"})
    assert (cfg.video_size, cfg.resolution) == ("832x480", 640)
    side = apply_overrides(cfg, {"resolution": 480})
    assert side.video_size == "" and side.resolution == 480  # a video side need not be a multiple of 64
