"""Hostile pass 36 on sample index version 3 (per-sample digests) and the reads that trust
it: a verified read never hands out a byte its digest did not check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardkit as sk
from shardkit import ChecksumError
from shardkit.cli import cli
from shardkit.format.layout import index_name
from shardkit.format.tario.index import parse_index
from tests.helpers.indexes import older_index


def _write(out: Path, samples: list[dict[str, object]]) -> tuple[Path, Path, list[int]]:
    """One shard of ``samples``: the manifest, the shard's path, the index's offsets."""
    with sk.ShardWriter(str(out)) as w:
        for s in samples:
            w.write(s)
    url = json.loads((out / "manifest.json").read_text())["shards"][0]["url"]
    index = parse_index((out / index_name(url)).read_bytes())
    assert index.version == 3
    return out / "manifest.json", out / url, [int(o) for o in index.offsets]


def _rename(shard: Path, at: int, old: bytes, new: bytes) -> None:
    """Change the name of the member whose header is at ``at`` (same length), its header's
    checksum made right again: a header that parses, with the shard's size unchanged."""
    data = bytearray(shard.read_bytes())
    assert data[at : at + len(old)] == old
    data[at : at + len(new)] = new
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + 512])
    shard.write_bytes(bytes(data))


def test_a_member_taken_from_the_next_samples_bytes_is_not_handed_out(tmp_path: Path) -> None:
    # sample 1's first header renamed to sample 0's key: the reader joins that member to
    # sample 0 and hands sample 0 out once it meets s1.b, before sample 1's bytes (3 MiB,
    # past the reader's buffer) are whole and checked: its member came from unchecked bytes
    manifest, shard, offsets = _write(
        tmp_path / "set",
        [
            {"__key__": "s0", "txt": b"zero"},
            {"__key__": "s1", "a": b"SECRET", "b": b"bb", "c": bytes(3 << 20)},
            {"__key__": "s2", "txt": b"two"},
        ],
    )
    _rename(shard, offsets[1], b"s1.a", b"s0.a")
    got: list[dict[str, object]] = []
    with pytest.raises(ChecksumError) as info:
        got.extend(sk.ShardDataset(str(manifest), shardshuffle=False))
    assert got == [] and info.value.url == str(shard) and info.value.offset == 0
    assert f"'s0' at byte 0 (its members up to byte {offsets[1] + 1024})" in str(info.value)


def test_verify_deep_names_an_index_the_manifest_does_not_vouch_for(tmp_path: Path) -> None:
    # the set's index put back as a version 2 one (as an older shardkit wrote it), the
    # manifest's index_checksum still the version 3 one's: every lookup refuses it, and the
    # deep check said OK
    manifest, _, _ = _write(tmp_path / "set", [{"__key__": f"s{i}", "txt": b"v"} for i in range(3)])
    entry = json.loads(manifest.read_text())["shards"][0]
    index = manifest.parent / entry["index"]
    index.write_bytes(older_index(index.read_bytes(), 2, entry["checksum"]))
    with pytest.raises(ChecksumError, match="not the one the manifest vouches for") as info:
        sk.IndexedShards(str(manifest))[1]
    assert info.value.url == str(index) and entry["index_checksum"] in str(info.value)
    result = CliRunner().invoke(cli, ["verify", "--deep", str(manifest)])
    assert result.exit_code == 1, result.output
    assert "differs from the manifest's index_checksum" in result.output


def test_verify_deep_checks_the_digests_of_samples_too_large_to_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the scan holds a sample up to 64 MiB to digest it (4 KiB here); a larger one left
    # every digest of the index unchecked: a wrong one the manifest vouched for passed
    import hashlib

    import shardkit.check.scan

    monkeypatch.setattr(shardkit.check.scan, "_HOLD", 4096)
    manifest, _, _ = _write(
        tmp_path / "set",
        [{"__key__": f"s{i}", "bin": bytes([i]) * (3000 + 3000 * (i == 1))} for i in range(4)],
    )
    assert _verify_deep(manifest) == (0, "")
    doc = json.loads(manifest.read_text())
    index_path = manifest.parent / doc["shards"][0]["index"]
    index = bytearray(index_path.read_bytes())
    index[-8] ^= 1  # the digest of sample 3 (after the large one)
    index_path.write_bytes(bytes(index))
    doc["shards"][0]["index_checksum"] = "sha256:" + hashlib.sha256(index).hexdigest()
    manifest.write_text(json.dumps(doc))
    code, problems = _verify_deep(manifest)
    assert code == 1 and "the digest of sample 3 differs from its bytes" in problems


def _verify_deep(manifest: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["verify", "--deep", str(manifest)])
    return result.exit_code, result.output if result.exit_code else ""
