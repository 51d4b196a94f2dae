"""Hostile urls: one parser for every remote url (``shardkit.urls.parse_url``) takes a url
exactly as the key it names or refuses it, and no credential ever reaches a message."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import ConfigError, redact
from shardkit.urls import OBJECT_SCHEMES, parse_url

SCHEMES = (*OBJECT_SCHEMES, "hf", "http", "https")
# the characters that make urls go wrong, and plain ones
_ALPHABET = st.sampled_from([*"ab0/._-#?@:%2e \\\t\nxyz", "%2e%2e", "..", "//", "é"])
_TEXT = st.lists(_ALPHABET, max_size=12).map("".join)
_SECRET = st.tuples(  # a secret key's characters, '/', '#', '?', ':' and '@' among them
    st.sampled_from("ABCDEFGHwxyz"),
    st.text(alphabet=st.sampled_from("ABCDEFGHwxyz0189/+#?:@"), min_size=5, max_size=19),
).map("".join)


def _segments(key: str) -> list[str]:
    return key.split("/")


@settings(max_examples=25, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), bucket=_TEXT, key=_TEXT)
def test_a_url_is_its_key_or_refused(scheme: str, bucket: str, key: str) -> None:
    url = f"{scheme}://{bucket}/{key}"
    try:
        u = parse_url(url)
    except ConfigError as exc:
        assert "refusing url" in str(exc)
        return
    assert u.url == url  # taken exactly as written, nothing dropped or normalised
    assert "#" not in u.url
    if scheme in ("http", "https"):
        assert "\\" not in u.url  # some servers read it as '/' (an object key may hold it)
    assert all(s not in (".", "..") for s in _segments(u.key))
    assert "" not in _segments(u.key)[:-1]  # no '//': only a trailing '/' (a prefix)
    if scheme in OBJECT_SCHEMES:
        assert "/" not in u.bucket and "?" not in u.key  # the key is all after the bucket


@pytest.mark.parametrize(
    "url",
    [
        "s3://b/exp#2/",  # would write to (and an overwrite delete) exp/
        "s3://b/exp?x=1/",
        "gs://b/a/../b",
        "az://c/a/%2e%2e/b",
        "s3://b//x",
        "s3://b/a//",
        "http://h/a/../b",
        "https://h/a#frag",
        "https://h/a\\b",
        "s3://b/a\nb",  # urlsplit drops newlines: another key
        "s3:///key",
        "ftp://h/x",
    ],
)
def test_urls_naming_another_place_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="refusing url"):
        parse_url(url)


@settings(max_examples=25, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), user=st.sampled_from(["", "AKIA1", "user"]), pw=_SECRET)
def test_credentials_never_reach_a_message(scheme: str, user: str, pw: str) -> None:
    url = f"{scheme}://{user}:{pw}@bucket-1/a/b.tar"
    with pytest.raises(ConfigError) as info:
        parse_url(url)
    text = f"{info.value} {info.value!r} {info.value.args}"
    assert pw not in text, text
    assert pw not in redact(url)
    assert pw not in redact(f"cannot read {url}: 403")


def test_the_parts_of_a_url() -> None:
    u = parse_url("s3://my-bucket/exp/data-000001.tar")
    assert (u.scheme, u.bucket, u.key, u.host) == ("s3", "my-bucket", "exp/data-000001.tar", "")
    assert not u.is_prefix
    p = parse_url("gs://b/exp/")
    assert p.is_prefix and p.join("x.tar").url == "gs://b/exp/x.tar"
    assert parse_url("az://c/exp").join("x.tar").key == "exp/x.tar"
    with pytest.raises(ConfigError):
        p.join("../y.tar")
    h = parse_url("HTTPS://Data.Example:443/d/x.tar?X-Amz-Signature=abc")
    assert (h.scheme, h.host, h.key, h.query) == (
        "https",
        "Data.Example:443",
        "d/x.tar",
        "X-Amz-Signature=abc",
    )
    assert h.location() == "https://data.example:443/d/x.tar?X-Amz-Signature=abc"
    assert "abc" not in str(h)
    with pytest.raises(ConfigError, match="names no object"):
        parse_url("s3://b/exp/", need_key=True)
