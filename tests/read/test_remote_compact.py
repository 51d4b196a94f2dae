"""The compact form of a remote manifest: equal to the local one's, built once per node in
the cache dir (else the user's), never used for bytes the server no longer gives."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from shardkit.cache import make_opener, opener_for
from shardkit.errors import ManifestError
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig
from shardkit.io.config import IoConfig
from shardkit.read.catalog import Catalog, open_catalog
from shardkit.read.remote_compact import form_dir
from shardkit.read.shards import CompactShards, load_catalog
from tests.helpers.servers import RangeServer
from tests.helpers.strategies import manifests

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("served")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[RangeServer]:
    with RangeServer(root) as srv:
        yield srv


def _remote(url: str, io: IoConfig) -> Catalog:
    catalog = open_catalog(url, opener_for(io), io=io)
    assert isinstance(catalog.shards, CompactShards)
    return catalog


def _form(catalog: Catalog) -> str:
    assert isinstance(catalog.shards, CompactShards)
    return catalog.shards.compact.path


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(manifests())
def test_the_remote_form_equals_the_local_form_and_the_json(
    root: Path, server: RangeServer, tmp_path: Path, m: Manifest
) -> None:
    name = f"m{os.urandom(4).hex()}"
    (root / name).mkdir()
    m.save(str(root / name / "manifest.json"), csv_too=False)
    url = server.url(f"{name}/manifest.json")
    for io in (
        IoConfig(),
        IoConfig(cache=CacheConfig(cache_dir=str(tmp_path / name))),
    ):  # user's dir, node cache
        remote = _remote(url, io)
        parsed = Catalog(load_catalog(url, make_opener()))
        local = open_catalog(str(root / name / "manifest.json"), make_opener())
        assert list(remote.shards) == list(parsed.shards)
        assert remote.counts.tolist() == parsed.counts.tolist() == local.counts.tolist()
        assert remote.digest == parsed.digest == local.digest
        assert [s.ref.pieces for s in remote.shards] == [s.ref.pieces for s in local.shards]
        again = pickle.loads(pickle.dumps(remote))  # a worker maps the same form
        assert list(again.shards) == list(parsed.shards) and again.digest == remote.digest


def test_one_manifest_request_per_node_and_a_changed_manifest_is_seen(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    first = make_shards([3, 4, 5], subdir="d")
    path = Path(str(first.base)) / "manifest.json"
    with RangeServer(first.base) as srv:
        url = srv.url("manifest.json")
        node = IoConfig(cache=CacheConfig(cache_dir=str(tmp_path / "node")))
        for _ in range(3):  # three processes of one node
            assert _remote(url, node).total == 12
        assert len(srv.requests("/manifest.json")) == 1
        # changed on the server: within manifest_ttl the node's copy stands (as the
        # node's JSON copy does); past it, the new bytes are seen and the form rebuilt
        Manifest(shards=first.shards[:2]).save(str(path), csv_too=False)
        assert _remote(url, node).total == 12
        stale = IoConfig(cache=CacheConfig(cache_dir=node.cache.cache_dir, manifest_ttl=0))
        assert _remote(url, stale).total == 7
        assert _remote(url, node).total == 7  # the rebuilt form, no request
        # without a cache dir every process asks, and maps the form where the bytes match
        srv.clear_log()
        mine = IoConfig()
        assert _remote(url, mine).total == 7
        Manifest(shards=first.shards[1:]).save(str(path), csv_too=False)
        assert _remote(url, mine).total == 9
        assert len(srv.requests("/manifest.json")) == 2
        assert len(os.listdir(form_dir(None))) >= 1


def test_a_damaged_or_foreign_form_is_rebuilt(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    first = make_shards([3, 4, 5], subdir="d")
    other = make_shards([1, 1], subdir="e")
    with RangeServer(tmp_path) as srv:
        a, b = srv.url("d/manifest.json"), srv.url("e/manifest.json")
        node = IoConfig(cache=CacheConfig(cache_dir=str(tmp_path / "node"), manifest_ttl=0))
        fa = Path(_form(_remote(a, node)))
        fb = Path(_form(_remote(b, node)))
        assert sorted(Path(form_dir(node.cache.cache_dir)).glob("*.cols")) == sorted([fa, fb])
        raw = bytearray(fa.read_bytes())
        raw[-70] ^= 0xFF
        fa.write_bytes(bytes(raw))
        assert _remote(a, node).total == 12  # damaged: rebuilt
        fa.write_bytes(fb.read_bytes())  # another url's form under this url's name
        assert _remote(a, node).counts.tolist() == [3, 4, 5]
        assert first.total_samples == 12 and other.total_samples == 2


def test_a_worker_refuses_a_form_that_changed_under_it(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    first = make_shards([3, 4, 5], subdir="d")
    with RangeServer(first.base) as srv:
        url = srv.url("manifest.json")
        node = IoConfig(cache=CacheConfig(cache_dir=str(tmp_path / "node"), manifest_ttl=0))
        parent = _remote(url, node)
        blob = pickle.dumps(parent)
        Manifest(shards=first.shards[:1]).save(str(Path(str(first.base)) / "manifest.json"))
        assert _remote(url, node).total == 3  # the node rebuilt the form
        with pytest.raises(ManifestError, match="changed while it was read"):
            pickle.loads(blob)
