"""Adopted manifests: remote origins widen a local manifest's reach, and nothing else's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardkit.errors import ManifestError
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.urls import resolve_url

ORIGIN = ("https://data.example/sets/a/",)


@pytest.mark.parametrize(
    "url",
    [
        "https://data.example/sets/a/x-000000.tar",
        "https://data.example/sets/a/sub/x.tar.gz",
    ],
)
def test_a_local_manifest_reaches_its_origins(url: str) -> None:
    assert resolve_url("/home/me/adopted", url, origins=ORIGIN) == url


@pytest.mark.parametrize(
    "url",
    [
        "https://data.example/sets/b/x.tar",  # beside the origin
        "https://data.example/sets/a/../b/x.tar",  # climbs out
        "https://data.example/sets/a/%2e%2e/b/x.tar",  # climbs out once a server decodes it
        "https://data.example/sets/a/x.tar?redirect=evil",
        "https://data.example/sets/ab/x.tar",  # a sibling sharing the prefix's letters
        "http://data.example/sets/a/x.tar",  # another scheme
        "file:///etc/passwd",
        "/etc/passwd",
        "pipe:cat /etc/passwd",
    ],
)
def test_nothing_else_is_reached(url: str) -> None:
    with pytest.raises(ManifestError):
        resolve_url("/home/me/adopted", url, origins=ORIGIN)


def test_a_remote_manifest_cannot_widen_its_reach() -> None:
    url = "https://data.example/sets/a/x-000000.tar"
    with pytest.raises(ManifestError, match="outside the manifest's base"):
        resolve_url("https://mirror.example/adopted", url, origins=ORIGIN)


def test_origins_round_trip_and_only_remote_prefixes_load(tmp_path: Path) -> None:
    entry = ShardEntry(ORIGIN[0] + "x.tar", 10, 1, "sha256:" + "0" * 64, "x.tar.idx")
    m = Manifest([entry], origins=ORIGIN, base=str(tmp_path))
    m.save(tmp_path / "manifest.json")
    back = Manifest.load(tmp_path / "manifest.json")
    assert back.origins == ORIGIN
    assert back.resolve(entry.url) == entry.url
    assert back.resolve("x.tar.idx") == str(tmp_path / "x.tar.idx")
    raw = json.loads((tmp_path / "manifest.json").read_text())
    for bad in (["file:///"], ["/"], "https://x/", [7]):
        raw["origins"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(raw))
        with pytest.raises(ManifestError, match="origins"):
            Manifest.load(tmp_path / "bad.json")
    served = Manifest.loads(
        json.dumps(raw | {"origins": list(ORIGIN)}), source="https://m.example/d/manifest.json"
    )
    with pytest.raises(ManifestError):
        served.resolve(entry.url)


@pytest.mark.parametrize("origin", ["http://", "https://", "s3://", "https:///sets/a/", "s3:///"])
def test_an_origin_must_name_a_host(tmp_path: Path, origin: str) -> None:
    """``"http://"`` alone passed the schema and granted every host (issue 20)."""
    from tests.helpers.readback import shardkit

    doc = {
        "format": "shardkit.manifest",
        "version": 1,
        "origins": [origin],
        "shards": [
            {
                "url": "https://evil.example/x.tar",
                "size": 1,
                "nsamples": 1,
                "checksum": "sha256:" + "0" * 64,
            }
        ],
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="names no host"):
        Manifest.load(path)
    r = shardkit("verify", path)
    assert r.returncode == 1 and "names no host" in r.stderr, r.stderr  # verify: unreadable
    assert "Traceback" not in r.stderr
    with pytest.raises(ManifestError):
        resolve_url("/home/me", "https://evil.example/x.tar", origins=(origin,))
