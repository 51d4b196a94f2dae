"""``sk.build(fn, inputs, out)`` (parallel, deterministic, resumable after SIGKILL), images
in the writer (PIL and arrays), ``build --resize/--reencode`` and ``decode("torchrgb")``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import shardkit as sk
from shardkit.errors import ConfigError, WriterError
from shardkit.format.manifest.model import Manifest, incomplete_reason
from shardkit.write.build.plan import auto_workers
from shardkit.write.inputs.sources import Unit
from tests.helpers.buildfn import fails_on_seven, three_samples
from tests.helpers.readback import assert_whole, keys_of, read_samples, shard_digests, shardkit

pytestmark = pytest.mark.integration

Image = pytest.importorskip("PIL.Image")
ROOT = Path(__file__).resolve().parents[2]


def _plain(samples: list[dict[str, object]]) -> list[tuple[tuple[str, object], ...]]:
    return [
        tuple(sorted((k, bytes(v) if k != "__key__" else v) for k, v in s.items())) for s in samples
    ]  # type: ignore[arg-type]


def test_build_from_a_function_with_two_workers_equals_one(tmp_path: Path) -> None:
    one = sk.build(three_samples, range(30), tmp_path / "one", maxcount=7)
    two = sk.build(three_samples, range(30), tmp_path / "two", maxcount=7, workers=2)
    assert one.workers == 1 and two.workers == 2
    a = read_samples(one.manifest_path)
    b = read_samples(two.manifest_path)
    assert len(a) == 90 and _plain(a) == _plain(b)  # same samples, same order
    assert keys_of(a)[:3] == ["in000/0", "in000/1", "00000000/000002"]
    assert set(one.manifest.fields) == {"tokens.npy", "cls", "json"}
    again = sk.build(three_samples, range(30), tmp_path / "again", maxcount=7, workers=2)
    assert shard_digests(again.manifest_path) == shard_digests(two.manifest_path)
    assert shardkit("verify", two.manifest_path).returncode == 0
    with pytest.raises(ConfigError, match="top level of a module"):
        sk.build(lambda i: iter([{"txt": str(i)}]), range(4), tmp_path / "lam", workers=2)


def test_build_function_errors_skip_with_a_report(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seven is bad"):
        sk.build(fails_on_seven, range(10), tmp_path / "strict")
    res = sk.build(fails_on_seven, range(10), tmp_path / "out", on_error="skip")
    assert res.manifest.total_samples == 27
    report = tmp_path / "out" / "manifest.errors.jsonl"
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert rows == [{"source": "7", "input": 7, "reason": "ValueError: seven is bad"}]


_SCRIPT = """
import sys
import shardkit as sk
from tests.helpers.buildfn import slow_three_samples

if __name__ == "__main__":
    sk.build(slow_three_samples, range(60), sys.argv[1], workers=2, maxcount=6,
             resume=len(sys.argv) > 2, progress=False)
"""


def _run_script(script: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, str(script), *args], cwd=ROOT, env=env, start_new_session=True
    )


def _shards_in(work: Path) -> int:
    n = 0
    for w in work.glob("w*"):
        with contextlib.suppress(Exception):  # not written yet
            n += len(Manifest.load(w / "manifest.json"))
    return n


def test_build_from_a_function_resumes_after_sigkill(tmp_path: Path) -> None:
    script = tmp_path / "make.py"
    script.write_text(_SCRIPT)
    ref = _run_script(script, str(tmp_path / "ref"))
    assert ref.wait(timeout=120) == 0
    out = tmp_path / "out"
    proc = _run_script(script, str(out))
    deadline = time.monotonic() + 120
    while _shards_in(out / ".data.work") < 2:
        assert proc.poll() is None, "the build ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the main process and its workers
    proc.wait()
    said = incomplete_reason(Manifest.load(out / "manifest.json"))  # unfinished, and says so
    assert said is not None and "--resume" in said
    done = _run_script(script, str(out), "--resume")
    assert done.wait(timeout=120) == 0
    assert shard_digests(out / "manifest.json") == shard_digests(tmp_path / "ref" / "manifest.json")
    assert assert_whole(out / "manifest.json").total_samples == 180


def test_writer_encodes_pil_images_and_arrays_and_decode_gives_them_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (10, 12), dtype=np.uint8)
    smooth = np.tile(np.linspace(0, 255, 64, dtype=np.uint8), (48, 1))
    photo = Image.fromarray(np.stack([smooth] * 3, axis=-1))
    with sk.ShardWriter(tmp_path / "out", image_quality=95) as w:
        w.write({"__key__": "a", "png": rgb, "mask.png": gray, "jpg": photo})
        with pytest.raises(WriterError, match=r"'b'.*'png'.*uint8"):
            w.write({"__key__": "b", "png": rgb.astype(np.float32)})
    with sk.ShardWriter(tmp_path / "low", image_quality=20) as w:
        w.write({"__key__": "a", "jpg": photo})
    raw = read_samples(tmp_path / "out" / "manifest.json")[0]
    assert bytes(raw["png"][:4]) == b"\x89PNG" and bytes(raw["jpg"][:2]) == b"\xff\xd8"
    low = read_samples(tmp_path / "low" / "manifest.json")[0]
    assert len(low["jpg"]) < len(raw["jpg"])
    manifest = str(tmp_path / "out" / "manifest.json")
    (s,) = list(sk.ShardDataset(manifest, shardshuffle=False).decode("rgb8"))
    assert np.array_equal(s["png"], rgb)  # png is lossless
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(raw["mask.png"]))), gray)
    assert np.abs(s["jpg"].astype(int) - np.asarray(photo).astype(int)).mean() < 3
    (t,) = list(sk.ShardDataset(manifest, shardshuffle=False).decode("torchrgb"))
    import torch

    assert isinstance(t["png"], torch.Tensor) and t["png"].dtype == torch.float32
    assert tuple(t["png"].shape) == (3, 24, 32)
    assert torch.allclose(t["png"], torch.from_numpy(rgb.transpose(2, 0, 1) / 255.0).float())


def test_build_resize_and_reencode_an_image_folder(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    rng = np.random.default_rng(1)
    for i, (h, w) in enumerate([(60, 100), (30, 40), (200, 50)]):
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        img.save(src / f"im{i}.png" if i != 1 else src / f"im{i}.JPG")
        (src / f"im{i}.json").write_text(json.dumps({"i": i}))
    out = tmp_path / "out"
    r = shardkit("build", src, "-o", out, "--resize", "50", "--reencode", "jpg", "--quality", "80")
    assert r.returncode == 0, r.stderr
    assert set(Manifest.load(out / "manifest.json").fields) == {"jpg", "json"}
    sizes = []
    for s in read_samples(out / "manifest.json"):
        assert bytes(s["jpg"][:2]) == b"\xff\xd8"
        sizes.append(Image.open(io.BytesIO(s["jpg"])).size)
    assert sizes == [(50, 30), (40, 30), (12, 50)]  # aspect kept, small ones untouched
    bad = shardkit("build", src, "-o", tmp_path / "bad", "--reencode", "gif")
    assert bad.returncode == 2


def test_auto_workers_grow_with_the_input() -> None:
    def units(total: int) -> list[Unit]:
        return [Unit("jsonl", f"/x/{i}", total // 10, str(i)) for i in range(10)]

    assert auto_workers(units(10 << 20)) == 1  # a 2,000-image folder: no spawn costs
    assert auto_workers(units(600 << 20)) == min(os.cpu_count() or 1, 2)
    assert auto_workers(units(100 << 30)) == (os.cpu_count() or 1)
