"""The manifest: JSON/CSV load and save, its schema, validation, urls, braces, merge."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from shardkit import ConfigError, Manifest, ManifestError, ShardEntry, ShardWriter
from shardkit.urls import expand_braces, resolve_url
from tests.helpers.data import make_samples

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "manifests" / "manifest.schema.json").read_text())
SHA = "sha256:" + "ab" * 32


def _valid() -> dict[str, Any]:
    return {
        "format": "shardkit.manifest",
        "version": 1,
        "checksum_algorithm": "sha256",
        "total_samples": 5,
        "total_bytes": 3072,
        "fields": {"txt": {"count": 5, "bytes": 50}},
        "created": {"tool": "test"},
        "shards": [
            {"url": "a.tar", "size": 1024, "nsamples": 2, "checksum": SHA, "index": "a.tar.idx"},
            {"url": "sub/b.tar", "size": 2048, "nsamples": 3, "checksum": "sha256:" + "0" * 64},
        ],
    }


def test_schema_is_valid_and_accepts_what_the_writer_writes(tmp_path: Path) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    with ShardWriter(tmp_path, maxcount=2, part=(1, 3), checksum="xxh3_128") as w:
        for s in make_samples(5):
            w.write(s)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    jsonschema.validate(raw, SCHEMA)
    m = Manifest.from_dict(raw)
    assert m.part == {"index": 1, "count": 3} and m.total_samples == 5
    jsonschema.validate(_valid(), SCHEMA)


def test_example_manifest_is_valid() -> None:
    path = ROOT / "manifests" / "example.manifest.json"
    raw = json.loads(path.read_text())
    jsonschema.validate(raw, SCHEMA)
    m = Manifest.load(path)
    assert m.total_samples == raw["total_samples"] and m.base == str(path.parent)


def _mutate(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(_valid())
    target: Any = raw
    for p in path[:-1]:
        target = target[p]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


_DELETE = object()

# (what to change, value, entry, field, also refused by the JSON Schema)
MALFORMED = [
    (("format",), "webdataset", None, "format", True),
    (("version",), 2, None, "version", True),
    (("version",), True, None, "version", True),
    (("checksum_algorithm",), 5, None, "checksum_algorithm", True),
    (("checksum_algorithm",), "crc32", None, "checksum_algorithm", True),
    (("created",), "yesterday", None, "created", True),
    (("fields",), [], None, "fields", True),
    (("fields", "txt"), 3, None, "fields", True),
    (("fields", "txt", "count"), -1, None, "fields", True),
    (("part",), {"index": 2, "count": 2}, None, "part", False),
    (("part",), {"index": True, "count": 2}, None, "part", True),
    (("total_samples",), 6, None, "total_samples", False),
    (("total_bytes",), "3072", None, "total_bytes", True),
    (("shards",), {}, None, "shards", True),
    (("shards", 1), "b.tar", 1, None, True),
    (("shards", 1, "size"), -1, 1, "size", True),
    (("shards", 1, "size"), True, 1, "size", True),
    (("shards", 1, "size"), 2048.0, 1, "size", False),  # JSON Schema: 2048.0 is an integer
    (("shards", 1, "nsamples"), _DELETE, 1, "nsamples", True),
    (("shards", 0, "url"), "", 0, "url", True),
    (("shards", 0, "url"), "a\0.tar", 0, "url", True),
    (("shards", 1, "url"), "a.tar", 1, "url", False),
    (("shards", 1, "checksum"), "sha256:xyz", 1, "checksum", True),
    (("shards", 1, "checksum"), "sha256:" + "0" * 63, 1, "checksum", False),
    (("shards", 1, "checksum"), "md5:" + "0" * 32, 1, "checksum", False),
    (("shards", 0, "index"), 7, 0, "index", True),
    (("shards", 0, "index_checksum"), "sha256:xyz", 0, "index_checksum", True),
    (("shards", 1, "index_checksum"), "sha256:" + "0" * 64, 1, "index_checksum", False),
    (("shards", 0, "extra"), 1, 0, None, True),
    (("surprise",), 1, None, None, True),
]


@pytest.mark.parametrize(
    ("where", "value", "entry", "field", "schema_too"),
    MALFORMED,
    ids=[f"{'.'.join(map(str, m[0]))}={m[1]!r}"[:40] for m in MALFORMED],
)
def test_malformed_manifest_names_entry_and_field(
    where: tuple[Any, ...], value: Any, entry: int | None, field: str | None, schema_too: bool
) -> None:
    raw = _mutate(where, value)
    with pytest.raises(ManifestError) as info:
        Manifest.from_dict(raw, source="/data/m.json")
    err = info.value
    assert (err.entry, err.field, err.path) == (entry, field, "/data/m.json"), str(err)
    assert "/data/m.json" in str(err)
    if entry is not None:
        assert f"entry {entry}" in str(err)
    if schema_too:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(raw, SCHEMA)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"format": ', "line 1 column"),
        ("[" * 100_000 + "]" * 100_000, "nested|JSON"),
        ("[]", "top level"),
        (b"\xff\xfe{}", "UTF-8"),
    ],
)
def test_unreadable_json(text: str | bytes, match: str) -> None:
    with pytest.raises(ManifestError, match=match):
        Manifest.loads(text, source="m.json")


def test_json_and_csv_save_load_roundtrip(tmp_path: Path) -> None:
    m = Manifest.from_dict(_valid())
    m.save(tmp_path / "manifest.json")
    back = Manifest.load(tmp_path / "manifest.json")
    assert back.shards == m.shards and back.fields == m.fields
    assert back.base == str(tmp_path)
    csv = Manifest.load(tmp_path / "manifest.csv")
    assert [(s.url, s.size, s.nsamples, s.checksum) for s in csv.shards] == [
        (s.url, s.size, s.nsamples, s.checksum) for s in m.shards
    ]
    assert csv.total_samples == 5 and csv.checksum_algorithm == "sha256"
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize(
    ("text", "entry", "field", "line"),
    [
        ("url,size\n", None, None, 1),
        ("url,size,nsamples,checksum\na.tar,1,2\n", 0, None, 2),
        (f"url,size,nsamples,checksum\na.tar,1,2,{SHA}\n\nb.tar,x,2,{SHA}\n", 1, "size", 4),
        (f"url,size,nsamples,checksum\na.tar,1,-2,{SHA}\n", 0, "nsamples", 2),
        ("url,size,nsamples,checksum\na.tar,1,2,sha256:00\n", 0, "checksum", 2),
        (f"url,size,nsamples,checksum\na.tar,1,2,{SHA}\na.tar,1,2,{SHA}\n", 1, "url", 3),
        (f"url,size,nsamples,checksum\n{'u' * 200_000},1,2,{SHA}\n", None, None, 2),
    ],
)
def test_bad_csv_names_line(text: str, entry: int | None, field: str | None, line: int) -> None:
    with pytest.raises(ManifestError) as info:
        Manifest.loads(text, source="/d/manifest.csv")
    assert (info.value.entry, info.value.field) == (entry, field), str(info.value)
    assert f"line {line}" in str(info.value)


def test_entry_to_dict_and_facts() -> None:
    e = ShardEntry("a.tar", 10, 2, SHA)
    assert e.to_dict() == {"url": "a.tar", "size": 10, "nsamples": 2, "checksum": SHA}
    m = Manifest.from_dict(_valid())
    assert (len(m), m.total_samples, m.total_bytes) == (2, 5, 3072)
    assert [s.url for s in m] == ["a.tar", "sub/b.tar"]


# -- urls ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("base", "url", "want"),
    [
        ("/data/set", "a.tar", "/data/set/a.tar"),
        ("/data/set", "sub/../b.tar", "/data/set/b.tar"),
        ("/data/set", "/data/set/c.tar", "/data/set/c.tar"),
        ("/data/set", "file:///data/set/d%20e.tar", "/data/set/d e.tar"),
        ("https://h.example/d", "x.tar", "https://h.example/d/x.tar"),
        ("https://h.example/d", "https://h.example/d/y.tar", "https://h.example/d/y.tar"),
        ("s3://bucket/pre", "s.tar", "s3://bucket/pre/s.tar"),
        (None, "whatever.tar", "whatever.tar"),
    ],
)
def test_resolve_url(base: str | None, url: str, want: str) -> None:
    assert resolve_url(base, url) == want


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("/data/set", "pipe:curl http://x | cat"),
        (None, "pipe:rm -rf /"),
        ("/data/set", "../other/a.tar"),
        ("/data/set", "../set2/a.tar"),
        ("/data/set", "/etc/passwd"),
        ("/data/set", "file:///etc/passwd"),
        ("/data/set", "https://evil.example/a.tar"),
        ("https://h.example/d", "../x.tar"),
        ("https://h.example/d", "//evil.example/x.tar"),
        ("https://h.example/d", "https://evil.example/d/x.tar"),
        ("https://h.example/d", "%2e%2e/secret.tar"),
        ("https://h.example/d", "sub/%2E%2E/%2e%2e/secret.tar"),
    ],
)
def test_resolve_url_refuses_commands_and_escapes(base: str | None, url: str) -> None:
    with pytest.raises(ManifestError, match="refusing") as info:
        resolve_url(base, url)
    assert info.value.field == "url"
    assert resolve_url(base, url, allow_unsafe_urls=True)


def test_manifest_resolve_uses_its_location(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text(json.dumps(_valid()))
    m = Manifest.load(tmp_path / "m.json")
    assert m.resolve("sub/b.tar") == str(tmp_path / "sub" / "b.tar")
    with pytest.raises(ManifestError):
        m.resolve("../escape.tar")


@pytest.mark.parametrize(
    ("pattern", "want"),
    [
        ("data-{000..002}.tar", ["data-000.tar", "data-001.tar", "data-002.tar"]),
        ("d{8..10}.tar", ["d8.tar", "d9.tar", "d10.tar"]),
        ("a{0..1}/b{00..01}", ["a0/b00", "a0/b01", "a1/b00", "a1/b01"]),
        ("plain.tar", ["plain.tar"]),
    ],
)
def test_expand_braces(pattern: str, want: list[str]) -> None:
    assert expand_braces(pattern) == want


@pytest.mark.parametrize("bad", ["d{1..}.tar", "d{3..1}.tar", "d{a..b}", "d{0..99999999999}.tar"])
def test_expand_braces_refuses(bad: str) -> None:
    with pytest.raises(ConfigError):
        expand_braces(bad)


# -- merge -----------------------------------------------------------------------------
def _part(out: Path, i: int, n: int, start: int, count: int, **kw: Any) -> Manifest:
    with ShardWriter(
        out, maxcount=2, part=(i, n), start_index=start, manifest=f"part-{i}.json", **kw
    ) as w:
        for s in make_samples(count, start=start * 100):
            w.write(s)
    return Manifest.load(out / f"part-{i}.json")


def test_merge_partial_manifests(tmp_path: Path) -> None:
    p1 = _part(tmp_path, 1, 2, 10, 3)
    p0 = _part(tmp_path, 0, 2, 0, 4)
    merged = Manifest.merge([p1, p0])
    assert [s.url for s in merged.shards] == [
        "data-000000.tar",
        "data-000001.tar",
        "data-000010.tar",
        "data-000011.tar",
    ]
    assert merged.total_samples == 7 and merged.part is None
    assert merged.fields["json"]["count"] == 7
    assert "incomplete" not in merged.created
    merged.save(tmp_path / "manifest.json")
    jsonschema.validate(json.loads((tmp_path / "manifest.json").read_text()), SCHEMA)


def test_merge_refuses_mixtures(tmp_path: Path) -> None:
    p0 = _part(tmp_path / "a", 0, 2, 0, 2)
    p0b = _part(tmp_path / "a", 0, 2, 5, 2, overwrite=True)  # the same part again, replaced
    p1x = _part(tmp_path / "b", 1, 2, 0, 2, checksum="xxh3_128")
    p1of3 = _part(tmp_path / "c", 1, 3, 0, 2)
    with pytest.raises(ManifestError, match="repeat"):
        Manifest.merge([p0, p0b])
    with pytest.raises(ManifestError, match="algorithm"):
        Manifest.merge([p0, p1x])
    with pytest.raises(ManifestError, match="partition"):
        Manifest.merge([p0, p1of3])
    with pytest.raises(ConfigError):
        Manifest.merge([])
    assert "1 of 2" in Manifest.merge([p0]).created["incomplete"]


def test_a_part_writer_is_refused_only_the_name_it_writes_first(tmp_path: Path) -> None:
    # parts share a folder, each its own numbers (the Slurm pattern); a part whose first
    # shard's name another set holds would replace it, so it is refused, naming the shard
    _part(tmp_path, 1, 2, 10, 3)
    _part(tmp_path, 0, 2, 0, 4)
    before = (tmp_path / "data-000010.tar").read_bytes()
    with pytest.raises(ConfigError, match=r"data-000010\.tar"):
        _part(tmp_path, 2, 3, 10, 1)
    assert (tmp_path / "data-000010.tar").read_bytes() == before
