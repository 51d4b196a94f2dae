"""Per-sample digests (sample index version 3): a verified lookup hashes the sample it
hands out, not the piece around it; one changed byte in the sample (member data, a header)
is a ChecksumError naming the shard, the sample and its offset, with a version 3 index and
with the older ones (checked by pieces); digests are trusted only from an index the
manifest vouches for; indexes that `manifest from-shards` writes carry the same digests."""

from __future__ import annotations

import io
import itertools
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit.cache import make_opener, opener_for
from shardkit.check.summary import manifest_from_shards
from shardkit.check.verify import verify
from shardkit.errors import ChecksumError
from shardkit.format.layout import index_name
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import parse_index, sample_digest
from shardkit.io import load_manifest
from shardkit.io.config import IoConfig
from shardkit.read.catalog import open_catalog
from shardkit.read.lookup import Lookups
from shardkit.read.piece_opener import piece_verified
from tests.helpers.indexes import as_version, put_index
from tests.helpers.readback import read_samples

MakeShards = Callable[..., Manifest]
PIECE = 32 << 10  # ~10 KB samples: 3 a piece


def _lookups(manifest: Path) -> Lookups:
    io_cfg = IoConfig()
    opener = piece_verified(opener_for(io_cfg))
    return Lookups(open_catalog(str(manifest), opener, io=io_cfg), opener, io_cfg.limits)


def _set(make_shards: MakeShards, version: int) -> tuple[Path, Manifest, list[int]]:
    """One shard of 8 samples (indexes as ``version`` wrote them); its sample offsets."""
    m = make_shards([8], tokens=2000, piece_size=PIECE)
    manifest = Path(str(m.base)) / "manifest.json"
    offsets = parse_index((Path(str(m.base)) / index_name(m.shards[0].url)).read_bytes())
    as_version(manifest, version)
    return manifest, m, offsets.offsets.tolist()


def _flip(m: Manifest, at: int) -> None:
    with open(Path(str(m.base)) / m.shards[0].url, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x20]))


COUNTS = {"samples": 0.0, "bytes": 0.0}
# where in sample 5 a byte changes: its first header's name (the key), the tokens member's data
WHERE = {"header": 3, "member": 1024 + 512 + 700}


@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("version", [3, 2, 1])
def test_a_changed_byte_of_a_sample_is_refused_naming_shard_and_sample(
    make_shards: MakeShards, version: int, where: str
) -> None:
    manifest, m, offsets = _set(make_shards, version)
    _flip(m, offsets[5] + WHERE[where])
    with pytest.raises(ChecksumError) as info:
        _lookups(manifest).sample(0, 5, dict(COUNTS))
    text = str(info.value)
    assert m.shards[0].url in text and f"sample 5 (bytes {offsets[5]}..{offsets[6]})" in text
    assert info.value.offset == offsets[5]
    piece = (offsets[5] + WHERE[where]) // PIECE
    why = "digest in the sample index" if version == 3 else f"piece {piece} "
    assert why in text, text


@pytest.mark.parametrize("version", [3, 2])
def test_a_verified_lookup_hashes_its_sample_not_the_piece_around_it(
    make_shards: MakeShards, version: int
) -> None:
    """Samples j and j + 1 share piece k; j + 1's bytes changed: with digests sample j is
    checked and handed out alone; by pieces the whole piece is refused."""
    manifest, m, offsets = _set(make_shards, version)
    j = next(j for j in range(7) if offsets[j] // PIECE == (offsets[j + 2] - 1) // PIECE)
    k = offsets[j] // PIECE
    want = read_samples(m)[j]
    _flip(m, offsets[j + 1] + WHERE["member"])
    lookups = _lookups(manifest)
    if version == 2:
        with pytest.raises(ChecksumError, match=f"piece {k} "):
            lookups.sample(0, j, dict(COUNTS))
        return
    got = lookups.sample(0, j, dict(COUNTS))
    assert got.pop("__url__").endswith(m.shards[0].url) and got == want
    assert lookups.stats()["piece_bytes"] == 0  # no piece read, none kept
    with pytest.raises(ChecksumError, match=f"sample {j + 1} "):
        lookups.sample(0, j + 1, dict(COUNTS))


def test_every_index_version_gives_the_same_samples(make_shards: MakeShards) -> None:
    m = make_shards([5, 3], tokens=500, piece_size=PIECE)
    manifest = Path(str(m.base)) / "manifest.json"
    want = read_samples(m)
    where = [(s, j) for s, e in enumerate(m.shards) for j in range(e.nsamples)]
    for version in (3, 2, 1):
        as_version(manifest, version)
        lookups = _lookups(manifest)
        got = [lookups.sample(s, j, dict(COUNTS)) for s, j in where]
        urls = [g.pop("__url__") for g in got]
        assert all(u.endswith(m.shards[s].url) for u, (s, _) in zip(urls, where, strict=True))
        assert got == want


def test_digests_are_trusted_only_from_an_index_the_manifest_vouches_for(
    make_shards: MakeShards,
) -> None:
    """An index with a changed digest: refused where the manifest gives its checksum;
    where it gives none, the digests are not used (the pieces are checked: the right
    sample); vouched for after the change, the lookup fails rather than hand anything out."""
    manifest, m, _ = _set(make_shards, 3)
    path = Path(str(m.base)) / index_name(m.shards[0].url)
    data = bytearray(path.read_bytes())
    data[-8 * (8 - 2)] ^= 1  # sample 2's digest
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumError):  # the index differs from its index_checksum
        _lookups(manifest).sample(0, 2, dict(COUNTS))
    put_index(manifest, 0, bytes(data), with_checksum=False)
    assert _lookups(manifest).sample(0, 2, dict(COUNTS))["__key__"] == "sample-00000002"
    put_index(manifest, 0, bytes(data), with_checksum=True)
    with pytest.raises(ChecksumError, match="sample 2"):
        _lookups(manifest).sample(0, 2, dict(COUNTS))


def _foreign_shard(path: Path) -> None:
    """A tar as tarfile writes it: pax headers (a float mtime), a leading directory."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        d = tarfile.TarInfo("d")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for i in range(4):
            for field in ("txt", "cls"):
                body = f"{i}.{field} ".encode() * (300 * (i + 1))
                info = tarfile.TarInfo(f"d/s{i}.{field}")
                info.size, info.mtime = len(body), 1.5
                tar.addfile(info, io.BytesIO(body))


def test_from_shards_writes_the_digests_of_the_samples_bytes(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    m = make_shards([6], tokens=300)
    base = Path(str(m.base))
    written = (base / index_name(m.shards[0].url)).read_bytes()
    (base / index_name(m.shards[0].url)).unlink()
    manifest_from_shards(str(base), piece_size=None)  # writes the index again
    assert parse_index((base / index_name(m.shards[0].url)).read_bytes()).digests.tolist() == (
        parse_index(written).digests.tolist()  # the writer's, from a scan of the bytes
    )
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    _foreign_shard(foreign / "f-000000.tar")
    found, where = manifest_from_shards(str(foreign), piece_size=None)
    found.save(where)
    raw = (foreign / "f-000000.tar").read_bytes()
    idx = parse_index((foreign / index_name("f-000000.tar")).read_bytes())
    assert idx.version == 3 and idx.digests is not None
    bounds = idx.offsets.tolist()
    assert idx.digests.tolist() == [sample_digest(raw[a:b]) for a, b in itertools.pairwise(bounds)]
    damaged = bytearray(raw)
    damaged[bounds[2] + 1024 + 100] ^= 1  # in sample 2's first member's data
    (foreign / "f-000000.tar").write_bytes(bytes(damaged))
    lookups = _lookups(Path(where))
    assert lookups.sample(0, 1, dict(COUNTS))["__key__"] == "d/s1"
    with pytest.raises(ChecksumError, match="sample 2"):
        lookups.sample(0, 2, dict(COUNTS))


def test_verify_deep_checks_each_digest_against_the_samples_bytes(
    make_shards: MakeShards,
) -> None:
    manifest, m, _ = _set(make_shards, 3)
    assert verify(load_manifest(str(manifest)), level="deep", opener=make_opener()).ok
    path = Path(str(m.base)) / index_name(m.shards[0].url)
    data = bytearray(path.read_bytes())
    data[-8 * (8 - 2)] ^= 1  # sample 2's digest, the index vouched for as it is now
    put_index(manifest, 0, bytes(data), with_checksum=True)
    report = verify(load_manifest(str(manifest)), level="deep", opener=make_opener())
    assert [(p.kind, p.message) for p in report.problems] == [
        ("index", "sample index: the digest of sample 2 differs from its bytes")
    ]
