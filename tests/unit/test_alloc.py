"""kvstrata.protocol.alloc.untouched: a large buffer costs resident memory only where it is written."""

from __future__ import annotations

import os

from kvstrata.protocol.alloc import untouched

MIB = 1024 * 1024


def _rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_untouched_buffer_grows_rss_only_as_written():
    before = _rss()
    buf = untouched(256 * MIB)
    assert isinstance(buf, bytearray) and len(buf) == 256 * MIB
    assert _rss() - before < 16 * MIB  # zero-filling would have added 256 MiB
    buf[: 32 * MIB] = b"x" * (32 * MIB)
    assert buf[32 * MIB - 1] == ord("x")
    del buf


def test_small_sizes_are_plain_bytearrays():
    assert untouched(10) == bytearray(10)
    assert len(untouched(0)) == 0
