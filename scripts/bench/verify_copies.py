"""What a verified local read must cost, without the tar reader: the three ways to hand out
only bytes that match their piece digest, against the unverified read.

On the shards of a profile (``loader_probe.py``'s, written once under ``--work``), each way
reads every file in ``--member``-byte members (150 KB: a medium sample) and:

- ``direct``: reads each member into its own object and drops it (``read_shard``'s way, no
  verification: the floor);
- ``piece-first``: reads each piece into a reused buffer a MiB at a time, hashes it, then
  copies each member out of it (the verified reader's way: a second copy, from a buffer
  bigger than the CPU's L2);
- ``hold``: reads each member into its own object, hashes it there, and holds the members
  until their piece is whole and checked (one copy, but a piece of memory held and freed
  at once, which the allocator gives back to the kernel and faults in again);
- ``piece-read``: only reads each piece into the reused buffer (no hash, no copy out): what
  any reader that checks a piece before handing out a byte of it pays at the least.

Each at piece sizes of 16 MiB (the manifests' default), 4 MiB and 1 MiB, each measurement in
a fresh process (glibc's allocator adapts to what a process freed before: a freed 16 MiB
buffer raises its trim threshold, and a way measured after another one would inherit it).
Rows: seconds for the profile's files (the best of 3 passes in each process), medians of
``--runs`` processes, interleaved; and the share of ``direct``.

    PYTHONPATH=. python scripts/bench/verify_copies.py --profile medium --runs 7
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
_WINDOW = 1 << 20


def direct(paths: list[str], member: int, piece: int) -> None:
    del piece
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        size, pos = os.fstat(fd).st_size, 0
        while pos < size:
            data = os.pread(fd, member, pos)
            pos += len(data)
            del data
        os.close(fd)


def piece_first(paths: list[str], member: int, piece: int) -> None:
    buf = memoryview(bytearray(piece))
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        size, lo = os.fstat(fd).st_size, 0
        while lo < size:
            n = min(piece, size - lo)
            h, got = xxhash.xxh3_128(), 0
            while got < n:
                k = os.preadv(fd, [buf[got : min(got + _WINDOW, n)]], lo + got)
                h.update(buf[got : got + k])
                got += k
            h.hexdigest()
            for p in range(0, n, member):
                out = bytes(buf[p : min(p + member, n)])
                del out
            lo += n
        os.close(fd)


def piece_read(paths: list[str], member: int, piece: int) -> None:
    del member
    buf = memoryview(bytearray(piece))
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        size, lo = os.fstat(fd).st_size, 0
        while lo < size:
            n, got = min(piece, size - lo), 0
            while got < n:
                got += os.preadv(fd, [buf[got : min(got + _WINDOW, n)]], lo + got)
            lo += n
        os.close(fd)


def hold(paths: list[str], member: int, piece: int) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        size, pos = os.fstat(fd).st_size, 0
        held: list[bytes] = []
        h, end = xxhash.xxh3_128(), min(piece, size)
        while pos < size:
            data = os.pread(fd, min(member, end - pos), pos)
            h.update(data)
            held.append(data)
            pos += len(data)
            if pos == end:  # the piece is whole: check it, hand its members out
                h.hexdigest()
                held = []
                h, end = xxhash.xxh3_128(), min(end + piece, size)
        os.close(fd)


WAYS: dict[str, Callable[[list[str], int, int], None]] = {
    "direct": direct,
    "piece-first": piece_first,
    "hold": hold,
    "piece-read": piece_read,
}


def child(way: str, paths: list[str], member: int, piece: int) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        WAYS[way](paths, member, piece)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        way, member, piece, *paths = sys.argv[2:]
        print(child(way, paths, int(member), int(piece)))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="medium", choices=["small", "medium"])
    p.add_argument("--work", default="/tmp/shardkit-loader-probe")
    p.add_argument("--member", type=int, default=150_000)
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    sys.path.insert(0, HERE)
    from loader_probe import make_data

    manifest = make_data(args.work, args.profile)
    paths = sorted(glob.glob(os.path.join(os.path.dirname(manifest), "*.tar")))
    cases = [("direct", 16 << 20)] + [
        (way, piece)
        for piece in (16 << 20, 4 << 20, 1 << 20)
        for way in ("piece-read", "piece-first", "hold")
    ]
    times: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    print(f"load average before: {os.getloadavg()}")
    for _ in range(args.runs):
        for way, piece in cases:
            cmd = [sys.executable, __file__, "--child", way, str(args.member), str(piece)]
            out = subprocess.run(cmd + paths, capture_output=True, text=True, check=True)
            times[(way, piece)].append(float(out.stdout))
    floor = statistics.median(times[("direct", 16 << 20)])
    mb = sum(os.path.getsize(x) for x in paths) / 1e6
    print(f"{args.profile}: {len(paths)} files, {mb:.0f} MB, members of {args.member} bytes")
    print("| way | piece | s (median) | share of direct |")
    print("|---|---|---|---|")
    for way, piece in cases:
        s = statistics.median(times[(way, piece)])
        label = "-" if way == "direct" else f"{piece >> 20} MiB"
        print(f"| {way} | {label} | {s:.4f} | {floor / s:.0%} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
