"""Tar conformance: every member's bytes as Python's tarfile gives them, on archives written
here by GNU tar (every format, sparse files in each sparse version), bsdtar, pzstd and
tarfile, and on hand-made headers; what is skipped is counted and logged, what is refused
is named. Also through ``shardkit build``, ``manifest from-shards``, ``verify --deep`` and
``ShardDataset``. The corpus is built by :mod:`tests.helpers.tarcorpus`.
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit import ShardDataset, ShardFormatError, ShardWriter, WriterError, read_shard
from shardkit.cli import cli
from shardkit.format.tario.reader import TarReader, iter_members
from tests.helpers import hostile, tarcorpus
from tests.helpers.readback import read_samples, shardkit
from tests.helpers.tarcorpus import as_samples, tarfile_files

pytestmark = pytest.mark.integration


def _members(data: bytes, policy: str = "strict") -> list[tuple[str, bytes]]:
    return list(iter_members(io.BytesIO(data), url="c.tar", policy=policy))


def _conforms(data: bytes, policy: str = "strict") -> list[tuple[str, bytes]]:
    """Assert shardkit reads ``data`` as tarfile does, member by member and as samples."""
    want = tarfile_files(data)
    assert _members(data, policy) == want
    got = list(read_shard(io.BytesIO(data), url="c.tar", policy=policy))
    assert got == as_samples(want)
    return want


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("tree")
    return root, tarcorpus.source_tree(root)


GNU_FORMATS = [
    ("posix", []),
    ("posix", ["--sparse", "--sparse-version=0.0"]),
    ("posix", ["--sparse", "--sparse-version=0.1"]),
    ("posix", ["--sparse", "--sparse-version=1.0"]),
    ("gnu", ["--sparse"]),
    ("oldgnu", ["--sparse"]),
    ("ustar", []),
    ("v7", []),
]


@pytest.mark.parametrize(("fmt", "flags"), GNU_FORMATS, ids=[" ".join(x) for _, x in GNU_FORMATS])
def test_gnu_tar_formats_read_as_tarfile_reads_them(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, fmt: str, flags: list[str]
) -> None:
    src, files = tree
    names = sorted(n for n in files if fmt not in ("v7", "ustar") or len(n) < 99)
    data = tarcorpus.gnu_tar(src, tmp_path / "t.tar", f"--format={fmt}", *flags, names=names)
    got = dict(_conforms(data))
    assert got == {n: files[n] for n in names}  # sparse files expanded, never stored bytes
    assert not any("GNUSparseFile" in n for n in got)
    if "--sparse" in flags and fmt != "ustar":  # stored sparse: the archive is smaller
        assert len(data) < len(files["sp/many.bin"]) // 2


def test_tar_of_a_folder_as_dot_reads_with_normal_names(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    """``tar -C dir -cf s.tar .``: members ``./a/s0001.txt`` and directories ``./a/``."""
    src, files = tree
    data = tarcorpus.gnu_tar(src, tmp_path / "dot.tar", "--format=gnu", "--sparse")
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert "./a/s0001.txt" in tf.getnames() and tf.getmember("./a").isdir()
    assert dict(_conforms(data)) == files
    reader = TarReader(io.BytesIO(data))
    assert len(list(reader.samples())) == len(as_samples(sorted(files.items())))
    assert reader.skipped["directory"] == 5  # ., a, deep, sp, ключ: each passed over


@pytest.mark.parametrize("fmt", ["pax", "ustar"])
def test_bsdtar_archives_read_as_tarfile_reads_them(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, fmt: str
) -> None:
    src, files = tree
    data = tarcorpus.bsdtar(src, tmp_path / "b.tar", fmt)
    got = dict(_conforms(data))
    assert {n: v for n, v in files.items() if fmt == "pax" or len(n) < 99} == got


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_tarfile_formats_with_dot_and_doubled_slashes(fmt: int) -> None:
    files = [("./k1.txt", b"a"), ("./k1.json", b"{}"), ("d//k2.txt", b"b"), ("d/./k2.bin", b"c")]
    data = tarcorpus.tarfile_bytes(files, fmt)
    assert _conforms(data) == [
        ("k1.txt", b"a"),
        ("k1.json", b"{}"),
        ("d/k2.txt", b"b"),
        ("d/k2.bin", b"c"),
    ]


@pytest.mark.parametrize("maker", ["pzstd", "python"])
def test_pzstd_tar_zst_reads(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, maker: str
) -> None:
    """pzstd writes a skippable frame (its frame's size) before every zstd frame; the
    Python writer of that layout cuts many frames (pzstd cuts them only past megabytes)."""
    src, _ = tree
    raw = tarcorpus.gnu_tar(src, tmp_path / "raw.tar", "--format=posix", "--sparse")
    path = tmp_path / "p.tar.zst"
    if maker == "pzstd":
        packed = tarcorpus.pzstd(raw, path)
    else:
        packed = tarcorpus.pzstd_layout(raw, path, frame=10_000)
        assert packed.count(bytes.fromhex("28b52ffd")) > 10
    assert packed[:4] == bytes.fromhex("502a4d18")
    assert list(read_shard(path)) == as_samples(tarfile_files(raw))


def test_signed_checksums_and_a_one_block_end() -> None:
    files = [("caf\u00e9/k.txt", b"x" * 700), ("\u00fc.bin", b"y")]
    data = tarcorpus.tarfile_bytes(files, tarfile.GNU_FORMAT)
    signed = tarcorpus.signed_checksums(data)
    assert signed != data
    assert _conforms(signed) == files
    short = tarcorpus.one_block_end(data)
    assert short.endswith(b"\0" * 512) and not short.endswith(b"\0" * 1024)
    assert _conforms(short) == files


def test_solaris_x_header_is_a_pax_header() -> None:
    name = "d/" + "n" * 120 + ".txt"
    data = tarcorpus.retyped(
        tarcorpus.tarfile_bytes([(name, b"long")], tarfile.PAX_FORMAT), b"x", b"X"
    )
    assert data[156:157] == b"X"
    assert _conforms(data) == [(name, b"long")]


def test_volume_label_acl_and_dumpdir_are_skipped_counted_and_logged(
    tree: tuple[Path, dict[str, bytes]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src, files = tree
    names = ["a", "b.bin"]
    snapshot = tmp_path / "snap"
    data = tarcorpus.gnu_tar(
        src, tmp_path / "v.tar", "--format=gnu", "-V", "my label",
        f"--listed-incremental={snapshot}", names=names,
    )  # fmt: skip
    acl = hostile.header("k.txt", 9, typeflag=b"A") + hostile.pad(b"user::rw-")
    data = acl + data
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert {m.type for m in tf} >= {b"V", b"D", b"A"}
    # not compared with tarfile: it reads the atime GNU tar's incremental mode stores at
    # byte 345 of a GNU header as a ustar prefix ('15301334371/a/s0001.txt'); GNU tar does not
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        got = dict(_members(data))
    assert got == {n: files[n] for n in files if n.startswith("a/") or n == "b.bin"}
    reader = TarReader(io.BytesIO(data))
    list(reader.samples())
    assert {
        k: reader.skipped[k] for k in ("volume label", "Solaris ACL", "GNU dump directory")
    } == {
        "volume label": 1,
        "Solaris ACL": 1,
        "GNU dump directory": 1,
    }
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "skipped volume label member" in logged and "byte 0" in logged


def _special_tree(root: Path) -> bytes:
    """A folder with a file, a symbolic link, a hard link and a FIFO, tarred by GNU tar."""
    (root / "s.txt").write_bytes(b"real")
    (root / "s.json").write_bytes(b"{}")
    os.symlink("/etc/passwd", root / "l.txt")
    os.link(root / "s.txt", root / "h.txt")
    os.mkfifo(root / "f.txt")
    return tarcorpus.gnu_tar(root, root.parent / "special.tar", "--format=posix")


def test_links_and_fifos_are_refused_by_default_and_skipped_when_lenient(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "src").mkdir()
    data = _special_tree(tmp_path / "src")
    device = hostile.header("dev.txt", typeflag=b"3")
    data = device + data
    with pytest.raises(ShardFormatError, match="character device") as info:
        list(read_shard(io.BytesIO(data), url="special.tar"))
    assert info.value.offset == 0 and "tar_policy='lenient'" in str(info.value)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        files = _conforms(data, "lenient")
    # GNU tar stores the first of two linked names (h.txt) and the other as a hard link
    assert files == [("h.txt", b"real"), ("s.json", b"{}")]
    reader = TarReader(io.BytesIO(data), policy="lenient")
    list(reader.samples())
    kinds = ("character device", "symbolic link", "hard link", "FIFO")
    assert {k: reader.skipped[k] for k in kinds} == dict.fromkeys(kinds, 1)
    assert sum("skipped" in r.getMessage() for r in caplog.records) >= 4


def test_unknown_types_are_refused_by_default_and_their_data_skipped_when_lenient() -> None:
    data = (
        hostile.member("a.txt", b"a")
        + hostile.header("q.txt", 700, typeflag=b"Q")
        + hostile.pad(b"q" * 700)
        + hostile.member("b.txt", b"b")
        + hostile.EOA
    )
    with pytest.raises(ShardFormatError, match="type 'Q'") as info:
        list(read_shard(io.BytesIO(data)))
    assert info.value.offset == 1024
    assert _conforms(data, "lenient") == [("a.txt", b"a"), ("b.txt", b"b")]


@pytest.mark.parametrize("typeflag", [b"5", b"1"])
def test_a_directory_or_link_size_is_never_data(typeflag: bytes) -> None:
    """tarfile, GNU tar and bsdtar agree: these carry no data, whatever the size field."""
    data = (
        hostile.header("d", 1024, typeflag=typeflag, linkname=b"x.txt")
        + hostile.member("a.txt", b"hidden?")
        + hostile.member("b.txt", b"b")
        + hostile.EOA
    )
    assert _conforms(data, "lenient") == [("a.txt", b"hidden?"), ("b.txt", b"b")]


def test_old_style_directory_entries_give_nothing() -> None:
    data = hostile.member("d/", b"", typeflag=b"\0") + hostile.member("d/k.txt", b"k") + hostile.EOA
    assert _conforms(data) == [("d/k.txt", b"k")]


def test_non_utf8_names_read_as_surrogate_escapes(tmp_path: Path) -> None:
    """An EUC-JP name (as webdataset reads it, through tarfile): surrogate escapes."""
    src = tmp_path / "src"
    src.mkdir()
    raw = "\u65e5\u672c\u8a9e".encode("euc-jp")
    (src / os.fsdecode(raw + b".txt")).write_bytes(b"nihongo")
    data = tarcorpus.gnu_tar(
        src, tmp_path / "e.tar", "--format=gnu", names=[os.fsdecode(raw + b".txt")]
    )
    (sample,) = list(read_shard(io.BytesIO(data)))
    assert sample == {"__key__": raw.decode("utf-8", "surrogateescape"), "txt": b"nihongo"}
    assert os.fsencode(str(sample["__key__"])) == raw
    _conforms(data)
    with ShardWriter(tmp_path / "out") as w, pytest.raises(WriterError, match="UTF-8"):
        w.write(sample)


def test_shard_writer_takes_dot_slash_keys_as_the_reader_gives_them(tmp_path: Path) -> None:
    with ShardWriter(tmp_path) as w:
        w.write({"__key__": "./a/k", "txt": b"x"})
    assert read_samples(tmp_path / "manifest.json") == [{"__key__": "a/k", "txt": b"x"}]


def _shard_dir(root: Path) -> list[dict[str, object]]:
    """Four foreign shards (sparse, ``./`` names, old GNU sparse, pzstd); their samples."""
    root.mkdir()
    src = []
    for i in range(4):  # keys of their own: a build refuses a key twice in a shard
        tarcorpus.source_tree(root.parent / f"src{i}" / f"u{i}")
        src.append(root.parent / f"src{i}")
    made = [
        tarcorpus.gnu_tar(src[0], root / "a-posix.tar", "--format=posix", "--sparse"),
        tarcorpus.gnu_tar(src[1], root / "b-dot.tar", "--format=gnu"),
        tarcorpus.gnu_tar(src[2], root / "c-oldgnu.tar", "--format=oldgnu", "--sparse"),
    ]
    raw = tarcorpus.gnu_tar(src[3], root.parent / "d.tar", "--format=posix", "--sparse")
    tarcorpus.pzstd(raw, root / "d-pzstd.tar.zst")
    (root / "d-pzstd.tar").unlink()
    return [s for data in [*made, raw] for s in as_samples(tarfile_files(data))]


def test_build_verify_and_dataset_agree_on_foreign_shards(tmp_path: Path) -> None:
    want = _shard_dir(tmp_path / "in")
    built = shardkit("build", tmp_path / "in", "-o", tmp_path / "out")
    assert built.returncode == 0, built.stderr
    assert read_samples(tmp_path / "out" / "manifest.json") == want
    adopted = shardkit("manifest", "from-shards", tmp_path / "in")
    assert adopted.returncode == 0, adopted.stderr
    checked = shardkit("verify", "--deep", tmp_path / "in" / "manifest.json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert read_samples(tmp_path / "in" / "manifest.json") == want
    got = [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
           for s in ShardDataset(str(tmp_path / "in" / "manifest.json"), seed=0)]  # fmt: skip
    key = lambda s: (str(s["__key__"]), sorted(s))  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)


def test_adopting_a_shard_names_the_member_it_refuses(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    data = _special_tree(tmp_path / "src")
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "special.tar").write_bytes(data)
    made = shardkit("manifest", "from-shards", shards)
    assert made.returncode == 1, made.stdout + made.stderr
    assert "special.tar at byte 1536" in made.stderr and "FIFO" in made.stderr, made.stderr


@pytest.mark.parametrize("layout", tarcorpus.extended_layouts(), ids=lambda x: x.name)
def test_extended_headers_read_as_every_reader_reads_them_or_refused(
    tmp_path: Path, layout: tarcorpus.Layout
) -> None:
    """Pax sizes on members a reader skips, GNU long names and pax paths stacked: read as
    tarfile, webdataset and GNU tar all read them, or refused naming why (they disagree,
    or the policy refuses the member) at the member's first header."""
    path = tmp_path / "x.tar"
    path.write_bytes(layout.data)
    want = tarfile_files(layout.data)
    names = [name for name, _ in want]
    if layout.refused is None:
        assert tarcorpus.listed_files("tar", path) == names
        _conforms(layout.data, layout.policy)
        assert tarcorpus.webdataset_samples(path) == as_samples(want)
        return
    with pytest.raises(ShardFormatError, match=layout.refused) as info:
        list(read_shard(path, policy=layout.policy))
    assert info.value.offset == 0 and info.value.url == str(path)
    try:
        _members(layout.data, "lenient")
    except ShardFormatError:  # refused under every policy: only where readers disagree
        assert names != tarcorpus.listed_files("tar", path) or names != tarcorpus.listed_files(
            "bsdtar", path
        )


def test_extended_header_layouts_through_the_cli_and_the_dataset(tmp_path: Path) -> None:
    """The member a pax size hides (on a volume label) reaches no entry point: adopted by
    ``manifest from-shards``, checked by ``verify --deep`` and read by ``ShardDataset`` as
    tarfile and webdataset read it; a layout the readers disagree on is refused by name."""
    layouts = {x.name: x for x in tarcorpus.extended_layouts()}
    read, refused = tmp_path / "read", tmp_path / "refused"
    read.mkdir()
    refused.mkdir()
    data = layouts["pax size on type V"].data
    (read / "a.tar").write_bytes(data)
    (refused / "b.tar").write_bytes(layouts["two long names"].data)
    runner = CliRunner()
    made = runner.invoke(cli, ["manifest", "from-shards", str(read)])
    assert made.exit_code == 0, made.output
    checked = runner.invoke(cli, ["verify", "--deep", str(read / "manifest.json")])
    assert checked.exit_code == 0, checked.output
    want = as_samples(tarfile_files(data))
    assert [s["__key__"] for s in want] == ["a"]  # not the hidden "h"
    got = ShardDataset(str(read / "manifest.json"), seed=0)
    assert [{k: v for k, v in s.items() if k in ("__key__", "txt")} for s in got] == want
    assert tarcorpus.webdataset_samples(read / "a.tar") == want
    no = runner.invoke(cli, ["manifest", "from-shards", str(refused)])
    assert no.exit_code == 1 and isinstance(no.exception, ShardFormatError), no.output
    assert "b.tar at byte 0" in str(no.exception) and "'l1.txt' as tarfile" in str(no.exception)
