"""Writers into an object store (moto's S3 server on 127.0.0.1) keep what is there as a local
folder does: a finished set is not replaced without resume/overwrite, a second writer of a
prefix is refused while the first writes, a missing bucket is one line naming it, and a url
is written exactly as the key it names or refused, its credentials never said."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.cli import main
from shardkit.errors import ConfigError, ShardkitError, WriterError
from shardkit.format.manifest.model import Manifest
from tests.helpers.readback import write_jsonl
from tests.helpers.stores import Store, moto_store

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3() -> Iterator[Store]:
    with moto_store() as s:
        yield s


@pytest.fixture
def store(s3: Store) -> Iterator[Store]:
    yield s3
    s3.clear()


def _write(url: str, n: int, **kw: object) -> None:
    with sk.ShardWriter(url, **kw) as w:  # type: ignore[arg-type]
        for i in range(n):
            w.write({"__key__": f"k{i:03d}", "txt": f"sample {i}"})


def _samples(store: Store, prefix: str) -> int:
    return Manifest.loads(store.get(f"{prefix}/manifest.json")).total_samples


def test_a_finished_set_in_a_prefix_is_not_replaced(store: Store) -> None:
    _write(store.url("ds/"), 5)
    with pytest.raises(ConfigError, match=r"already holds a data set .*overwrite=True"):
        _write(store.url("ds/"), 1)
    assert _samples(store, "ds") == 5
    _write(store.url("ds/"), 1, overwrite=True)  # told: replaced
    assert _samples(store, "ds") == 1


def test_a_second_writer_of_a_prefix_is_refused_and_the_first_survives(store: Store) -> None:
    refused: list[BaseException] = []

    def second() -> None:
        try:
            _write(store.url("two/"), 2)
        except ShardkitError as exc:
            refused.append(exc)

    with sk.ShardWriter(store.url("two/")) as w:
        w.write({"__key__": "first", "txt": "mine"})
        t = threading.Thread(target=second)  # another job (here a thread) into one prefix
        t.start()
        t.join()
    assert len(refused) == 1 and isinstance(refused[0], WriterError)
    assert "another thread of this process" in str(refused[0])
    assert _samples(store, "two") == 1
    assert not [k for k in store.names() if ".lock-" in k]  # let go when it closed


def test_a_missing_bucket_is_one_line_naming_it(store: Store) -> None:
    with pytest.raises(WriterError) as info:
        _write("s3://no-such-bucket-here/x/", 1)
    said = str(info.value)
    assert "s3://no-such-bucket-here" in said and "NoSuchBucket" in said and "\n" not in said


def test_a_url_naming_another_key_is_refused_before_anything_is_written(store: Store) -> None:
    _write(store.url("exp/"), 2)
    before = store.names()
    for url in ("exp#2/", "exp?v=2/", "a/../exp/", "/exp/"):
        with pytest.raises(ConfigError):
            _write(f"s3://{store.bucket}/{url}", 1, overwrite=True)
    assert store.names() == before  # exp/ is whole: nothing deleted, nothing written


def test_build_into_a_url_with_credentials_never_says_them(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", [{"i": i} for i in range(3)])
    for out in (f"s3://AKIAKEY:SeCrEt123@{store.bucket}/x/", f"s3://{store.bucket}/exp#2/"):
        with pytest.raises(SystemExit) as ended:
            main(["build", str(src), "-o", out, "--overwrite"])
        said = capsys.readouterr()
        assert ended.value.code == 2 and "SeCrEt123" not in said.out + said.err, said.err
    assert store.names() == []
    with pytest.raises(SystemExit) as ended:  # the same build at a plain url works
        main(["build", str(src), "-o", store.url("x/"), "--no-progress"])
    assert ended.value.code == 0 and _samples(store, "x") == 3
