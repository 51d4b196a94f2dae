"""A missing Azure container is one line naming it, for a reader and a writer (the SDK's
text is a ten-line dump of the response's XML), against Azurite on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardkit.cache import make_opener
from shardkit.errors import FetchError
from shardkit.io.stores import open_store
from tests.helpers.stores import Store, azurite

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    with azurite() as s:
        yield s


def _one_line_naming_it(exc: FetchError) -> None:
    text = str(exc)
    assert "\n" not in text and "<?xml" not in text, text
    assert "'no-such-container' does not exist" in text, text
    assert exc.status == 404


def test_a_reader_of_a_missing_container(store: Store) -> None:
    with pytest.raises(FetchError) as info:
        make_opener().read("az://no-such-container/ds/data-000000.tar")
    _one_line_naming_it(info.value)


def test_a_writer_into_a_missing_container(store: Store) -> None:
    with pytest.raises(FetchError) as info:
        open_store("az://no-such-container/ds/")
    _one_line_naming_it(info.value)
    got, prefix = open_store(store.url("ds/"))  # the one that exists opens
    assert (got.bucket, prefix) == (store.bucket, "ds/")
