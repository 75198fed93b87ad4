"""Unit tests for kvstrata.protocol.parser.RequestParser (sans-IO).

Commands are fed as byte streams, either with ``feed()`` or through the ``asyncio.BufferedProtocol`` path
(``get_buffer()`` / ``buffer_updated()``), in fragments of every size, and must come out byte-identical and in
order. Malformed input must raise ``ProtocolError`` with Redis's text, checked against limits before anything
is allocated.

The regression tests at the end pin down parser bugs that were found and fixed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvstrata.errors import ProtocolError
from kvstrata.protocol.parser import RequestParser

THR = 64 * 1024  # the default large_threshold
KB = 1024
PROPERTY = settings(max_examples=200, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL_PROPERTY = settings(max_examples=150, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------


def mbulk(*args: bytes) -> bytes:
    """One command as a canonical RESP multibulk frame."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


def payload(size: int, seed: int) -> bytes:
    """Random bytes (they contain CR, LF, '*' and '$' often enough)."""
    return random.Random(seed).randbytes(size)


class Recorder:
    """An ``allocate`` callback that records each requested size and the buffer it returned."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.buffers: list[bytearray] = []

    def __call__(self, n: int) -> bytearray:
        self.sizes.append(n)
        buf = bytearray(n)
        self.buffers.append(buf)
        return buf

    def owns(self, obj: object) -> bool:
        return any(obj is b for b in self.buffers)


def large_spans(stream_parts: Sequence[tuple[bytes, Sequence[bytes]] | bytes], threshold: int) -> list[tuple[int, int]]:
    """(header_end, value_end) of every multibulk argument of at least ``threshold`` bytes in the stream.

    ``stream_parts`` is the list of frames in order: ``(frame_bytes, args)`` for a multibulk frame, or plain
    bytes for anything else (inline lines).
    """
    spans = []
    offset = 0
    for part in stream_parts:
        if isinstance(part, bytes):
            offset += len(part)
            continue
        frame, args = part
        pos = offset + len(b"*%d\r\n" % len(args))
        for a in args:
            header_end = pos + len(b"$%d\r\n" % len(a))
            value_end = header_end + len(a)
            if len(a) >= threshold:
                spans.append((header_end, value_end))
            pos = value_end + 2
        assert pos == offset + len(frame)
        offset += len(frame)
    return spans


def chunk_ends(total: int, sizes: Sequence[int], spans: Sequence[tuple[int, int]] = ()) -> list[int]:
    """End offsets of the chunks: ``sizes`` cycled (each at least 1)."""
    ends = []
    pos = 0
    i = 0
    while pos < total:
        n = max(1, sizes[i % len(sizes)]) if sizes else total
        i += 1
        end = min(total, pos + n)
        ends.append(end)
        pos = end
    return ends


def feed_stream(p: RequestParser, data: bytes, sizes: Sequence[int], spans: Sequence[tuple[int, int]] = ()) -> None:
    pos = 0
    for end in chunk_ends(len(data), sizes, spans):
        p.feed(data[pos:end])
        pos = end


def buffered_stream(
    p: RequestParser, data: bytes, sizes: Sequence[int], spans: Sequence[tuple[int, int]] = ()
) -> None:
    """Deliver like asyncio.BufferedProtocol: each chunk goes into get_buffer() (which may be smaller than the
    chunk: deliver what fits and ask again)."""
    pos = 0
    for end in chunk_ends(len(data), sizes, spans):
        while pos < end:
            buf = p.get_buffer()
            assert len(buf) > 0, "get_buffer() returned an empty buffer"
            n = min(len(buf), end - pos)
            buf[:n] = data[pos : pos + n]
            p.buffer_updated(n)
            pos += n


def run(data: bytes, sizes: Sequence[int] = (), *, mode: str = "feed", **kw) -> list[list[bytes]]:
    p = RequestParser(**kw)
    (feed_stream if mode == "feed" else buffered_stream)(p, data, sizes)
    return [[bytes(a) for a in cmd] for cmd in p.commands()]


def outcome(data: bytes, sizes: Sequence[int] = (), **kw) -> tuple:
    """("ok", commands) or ("error", message, commands parsed before the error)."""
    p = RequestParser(**kw)
    try:
        feed_stream(p, data, sizes)
    except ProtocolError as exc:
        return ("error", exc.message, [[bytes(a) for a in c] for c in p.commands()])
    return ("ok", [[bytes(a) for a in c] for c in p.commands()])


def err(text: str) -> str:
    return f"ERR Protocol error: {text}"


# ----------------------------------------------------------------------------------------------------------------
# Well-formed input
# ----------------------------------------------------------------------------------------------------------------


def test_single_command_whole_chunk():
    p = RequestParser()
    p.feed(mbulk(b"SET", b"k", b"v"))
    assert p.commands() == [[b"SET", b"k", b"v"]]
    assert p.commands() == []  # taken


def test_pipeline_in_one_chunk_keeps_order():
    cmds = [[b"SET", b"k%d" % i, b"v" * i] for i in range(50)]
    assert run(b"".join(mbulk(*c) for c in cmds)) == cmds


@pytest.mark.parametrize("mode", ["feed", "buffered"])
def test_pipeline_byte_by_byte(mode):
    cmds = [[b"PING"], [b"SET", b"a", b""], [b"ECHO", b"\r\n*3\r\n$"], [b"GET", b"a"]]
    assert run(b"".join(mbulk(*c) for c in cmds), [1], mode=mode) == cmds


def test_commands_accumulate_until_taken():
    p = RequestParser()
    p.feed(mbulk(b"A"))
    p.feed(mbulk(b"B"))
    assert p.commands() == [[b"A"], [b"B"]]


@pytest.mark.parametrize("frame", [b"*0\r\n", b"*-1\r\n", b"\r\n", b"\n", b"   \r\n"])
def test_empty_requests_produce_no_command(frame):
    assert run(frame + mbulk(b"PING")) == [[b"PING"]]
    assert run(frame + mbulk(b"PING"), [1]) == [[b"PING"]]


def test_empty_and_binary_arguments():
    args = [b"", b"\x00", b"\r\n", b"$3\r\n", b"*1\r\n", bytes(range(256))]
    assert run(mbulk(*args)) == [args]
    assert run(mbulk(*args), [3]) == [args]


def test_inline_commands():
    data = b'SET k "hello world"\r\nGET k\nPING\r\n' + mbulk(b"ECHO", b"x") + b"  ECHO  'a b'  \r\n"
    expected = [[b"SET", b"k", b"hello world"], [b"GET", b"k"], [b"PING"], [b"ECHO", b"x"], [b"ECHO", b"a b"]]
    assert run(data) == expected
    assert run(data, [1]) == expected
    assert run(data, [1], mode="buffered") == expected


def test_inline_escapes_reach_the_command():
    assert run(b'ECHO "\\x41\\n\\t\\"q\\\\" \'it\\\'s\'\r\n') == [[b"ECHO", b'A\n\t"q\\', b"it's"]]


def test_inline_line_of_exactly_64k_is_accepted():
    line = b"x" * (64 * KB)
    p = RequestParser()
    p.feed(line)  # 64 KiB without a newline: still waiting, no error
    p.feed(b"\r\n")
    assert p.commands() == [[line]]


def test_multibulk_after_inline_goes_back_to_normal_parsing():
    p = RequestParser()
    p.feed(b"PING\r\n")
    p.feed(mbulk(b"SET", b"a", b"b"))
    p.feed(mbulk(b"GET", b"a")[:5])
    p.feed(mbulk(b"GET", b"a")[5:])
    assert p.commands() == [[b"PING"], [b"SET", b"a", b"b"], [b"GET", b"a"]]
    assert p.pending_bytes == 0


def test_pending_bytes_counts_partial_input():
    p = RequestParser()
    frame = mbulk(b"SET", b"key", b"value")
    p.feed(frame[:10])
    assert 0 < p.pending_bytes <= 10
    p.feed(frame[10:])
    assert p.pending_bytes == 0


# ----------------------------------------------------------------------------------------------------------------
# Large bulk values: thresholds, allocation and zero-copy receive
# ----------------------------------------------------------------------------------------------------------------

BOUNDARY_SIZES = [0, 1, THR - 1, THR, THR + 1, 300 * KB]


CHUNKINGS = {"whole": (), "7": (7,), "4096": (4096,), "thr-3": (THR - 3,), "thr+20": (THR + 20,),
             "mixed": (1, 100, 70000)}
# 7-byte chunks of a 300 KB value would be ~43,000 feeds: that size is covered by the other chunkings.
SIZE_CHUNKINGS = [pytest.param(size, sizes, id=f"{name}-{size}") for name, sizes in CHUNKINGS.items()
                  for size in BOUNDARY_SIZES if not (sizes == (7,) and size > THR + 1)]


@pytest.mark.parametrize(("size", "sizes"), SIZE_CHUNKINGS)
@pytest.mark.parametrize("mode", ["feed", "buffered"])
def test_boundary_value_sizes_roundtrip(size, sizes, mode):
    value = payload(size, size)
    cmds = [[b"SET", b"key", value], [b"GET", b"key"]]
    frames = [(mbulk(*c), c) for c in cmds]
    data = b"".join(f for f, _ in frames)
    spans = large_spans(frames, THR)
    rec = Recorder()
    p = RequestParser(allocate=rec)
    (feed_stream if mode == "feed" else buffered_stream)(p, data, sizes, spans)
    got = p.commands()
    assert [[bytes(a) for a in c] for c in got] == cmds
    assert p.pending_bytes == 0
    for size_requested in rec.sizes:
        assert size_requested == size >= THR
    arg = got[0][2]
    if isinstance(arg, bytearray):
        assert rec.owns(arg)
    if size < THR:
        assert rec.sizes == []


@pytest.mark.parametrize("size,allocates", [(THR - 1, False), (THR, True), (THR + 1, True)])
def test_allocate_used_from_threshold_when_value_is_incomplete(size, allocates):
    rec = Recorder()
    p = RequestParser(allocate=rec)
    value = payload(size, 1)
    frame = mbulk(b"SET", b"k", value)
    p.feed(frame[: len(frame) - 100])
    assert rec.sizes == ([size] if allocates else [])
    p.feed(frame[len(frame) - 100 :])
    cmd = p.commands()[0]
    assert cmd[2] == value
    if allocates:
        assert cmd[2] is rec.buffers[0]


def test_large_bulk_lands_in_allocated_buffer_via_feed():
    rec = Recorder()
    p = RequestParser(allocate=rec)
    value = payload(200 * KB, 2)
    frame = mbulk(b"SET", b"k", value)
    header_end = frame.index(b"\r\n", len(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n")) + 2
    p.feed(frame[:header_end])  # the header alone
    assert rec.sizes == [len(value)]
    p.feed(frame[header_end : header_end + 1000])
    p.feed(frame[header_end + 1000 :])
    (cmd,) = p.commands()
    assert cmd[:2] == [b"SET", b"k"]
    assert cmd[2] is rec.buffers[0]
    assert cmd[2] == value


def test_large_bulk_lands_in_allocated_buffer_via_get_buffer():
    rec = Recorder()
    p = RequestParser(allocate=rec)
    value = payload(300 * KB, 3)
    frame = mbulk(b"SET", b"k", value) + mbulk(b"PING")
    first = 5000
    buf = p.get_buffer()
    buf[:first] = frame[:first]
    p.buffer_updated(first)
    assert rec.sizes == [len(value)]
    # While the value is being received, get_buffer() is a view of the allocated buffer, exactly the rest of it.
    target = p.get_buffer()
    assert target.obj is rec.buffers[0]
    value_start = frame.index(value[:64])
    assert len(target) == len(value) - (first - value_start)
    pos = first
    while pos < len(frame):
        buf = p.get_buffer()
        n = min(len(buf), len(frame) - pos, 100_000)
        buf[:n] = frame[pos : pos + n]
        p.buffer_updated(n)
        pos += n
    cmds = p.commands()
    assert cmds == [[b"SET", b"k", value], [b"PING"]]
    assert cmds[0][2] is rec.buffers[0]
    assert p.get_buffer().obj is not rec.buffers[0]


def test_value_received_into_target_may_end_exactly_at_a_chunk_boundary():
    # The header arrived earlier, so the value is being received into its own buffer; the chunk that completes
    # it ends right before the CRLF, and the CRLF comes separately.
    for mode in ("feed", "buffered"):
        value = payload(THR * 2, 4)
        frame = mbulk(b"SET", b"k", value)
        value_end = len(frame) - 2
        p = RequestParser()
        if mode == "feed":
            for a, b in [(0, 100), (100, value_end), (value_end, value_end + 1), (value_end + 1, len(frame))]:
                p.feed(frame[a:b])
        else:
            for a, b in [(0, 100), (100, value_end), (value_end, value_end + 1), (value_end + 1, len(frame))]:
                pos = a
                while pos < b:
                    buf = p.get_buffer()
                    assert len(buf) > 0
                    n = min(len(buf), b - pos)
                    buf[:n] = frame[pos : pos + n]
                    p.buffer_updated(n)
                    pos += n
        assert p.commands() == [[b"SET", b"k", value]], mode


def test_feed_chunk_ending_exactly_at_end_of_large_value():
    # Header and whole value in one chunk, CRLF in the next: through feed() this works (through get_buffer() it
    # does not, see test_get_buffer_not_empty_when_chunk_ends_at_end_of_large_value).
    rec = Recorder()
    value = payload(THR, 8)
    frame = mbulk(b"SET", b"k", value)
    p = RequestParser(allocate=rec)
    p.feed(frame[:-2])
    p.feed(frame[-2:])
    assert p.commands() == [[b"SET", b"k", value]]


def test_several_large_values_in_one_command():
    rec = Recorder()
    values = [payload(THR + i, i) for i in range(3)]
    frame = mbulk(b"MSET", b"a", values[0], b"b", values[1], b"c", values[2])
    p = RequestParser(allocate=rec)
    feed_stream(p, frame, [30_000], large_spans([(frame, [b"MSET", b"a", values[0], b"b", values[1], b"c",
                                                         values[2]])], THR))
    (cmd,) = p.commands()
    assert cmd == [b"MSET", b"a", values[0], b"b", values[1], b"c", values[2]]
    for v in (cmd[2], cmd[4], cmd[6]):
        assert rec.owns(v)


# ----------------------------------------------------------------------------------------------------------------
# Property tests
# ----------------------------------------------------------------------------------------------------------------

special_sizes = st.sampled_from([0, 1, 2, THR - 1, THR, THR + 1, 300 * KB])
arg_sizes = st.one_of(special_sizes, st.integers(0, 64), st.integers(0, 300 * KB))
commands_st = st.lists(st.lists(st.tuples(arg_sizes, st.integers(0, 2**32)), min_size=1, max_size=4),
                       min_size=1, max_size=4)
chunk_sizes_st = st.lists(st.one_of(st.integers(1, 16), st.integers(1, 4096), st.integers(1, 400 * KB)),
                          min_size=0, max_size=12)


def _build(cmd_specs) -> tuple[list[list[bytes]], list[tuple[bytes, list[bytes]]]]:
    cmds = [[payload(size, seed) for size, seed in spec] for spec in cmd_specs]
    # Bound the work per example (a few MB at most).
    total = sum(len(a) for c in cmds for a in c)
    if total > 1_500_000:
        cmds = [[a[:1000] if len(a) > 1000 else a for a in c] for c in cmds]
    return cmds, [(mbulk(*c), c) for c in cmds]


@PROPERTY
@given(cmd_specs=commands_st, sizes=chunk_sizes_st, mode=st.sampled_from(["feed", "buffered"]))
def test_random_commands_any_fragmentation_roundtrip(cmd_specs, sizes, mode):
    cmds, frames = _build(cmd_specs)
    data = b"".join(f for f, _ in frames)
    spans = large_spans(frames, THR)
    rec = Recorder()
    p = RequestParser(allocate=rec)
    if mode == "feed":
        feed_stream(p, data, sizes, spans)
    else:
        buffered_stream(p, data, sizes, spans)
    got = p.commands()
    assert [[bytes(a) for a in c] for c in got] == cmds
    assert p.pending_bytes == 0
    for c in got:
        for a in c:
            assert type(a) in (bytes, bytearray)
            if type(a) is bytearray:
                # A bytearray argument is a large value received into the allocate() buffer.
                assert rec.owns(a)
                assert len(a) >= THR
    assert all(n >= THR for n in rec.sizes)
    event(f"large args: {min(len(spans), 3)}{'+' if len(spans) >= 3 else ''}")
    event(f"received into allocate() buffers: {bool(rec.sizes)}")


@SMALL_PROPERTY
@given(
    cmds=st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=5), min_size=1, max_size=6),
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    threshold=st.integers(1, 20),
    mode=st.sampled_from(["feed", "buffered"]),
)
def test_small_threshold_byte_level_fragmentation(cmds, sizes, threshold, mode):
    """With a tiny large_threshold, the receive-into-own-buffer path runs for most arguments, and chunk
    boundaries fall at every position."""
    frames = [(mbulk(*c), c) for c in cmds]
    data = b"".join(f for f, _ in frames)
    spans = large_spans(frames, threshold)
    rec = Recorder()
    p = RequestParser(allocate=rec, large_threshold=threshold)
    (feed_stream if mode == "feed" else buffered_stream)(p, data, sizes, spans)
    got = p.commands()
    assert [[bytes(a) for a in c] for c in got] == cmds
    for c in got:
        for a in c:
            if type(a) is bytearray:
                assert rec.owns(a)


SAFE_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-:.{}", min_size=1, max_size=12)


def _quote_dq(arg: bytes) -> bytes:
    out = bytearray(b'"')
    for c in arg:
        ch = bytes([c])
        if ch in b'"\\':
            out += b"\\" + ch
        elif ch == b"\n":
            out += b"\\n"
        elif ch == b"\r":
            out += b"\\r"
        elif ch == b"\t":
            out += b"\\t"
        elif 32 <= c < 127:
            out += ch
        else:
            out += b"\\x%02x" % c
    return bytes(out + b'"')


@st.composite
def inline_or_multibulk(draw):
    """(wire bytes, expected args or None for an empty line)."""
    kind = draw(st.sampled_from(["mbulk", "inline", "inline", "blank"]))
    if kind == "blank":
        return draw(st.sampled_from([b"\r\n", b"\n", b"  \t \r\n"])), None
    if kind == "mbulk":
        args = draw(st.lists(st.binary(max_size=30), min_size=1, max_size=4))
        return mbulk(*args), args
    words = draw(st.lists(st.one_of(SAFE_WORD.map(str.encode), st.binary(max_size=20)), min_size=1, max_size=5))
    parts = []
    for w in words:
        style = draw(st.sampled_from(["bare", "dq", "sq"]))
        if style == "bare" and w and all(c in SAFE_WORD_BYTES for c in w):
            parts.append(w)
        elif style == "sq" and b"\\" not in w and all(32 <= c < 127 for c in w):
            parts.append(b"'" + w.replace(b"'", b"\\'") + b"'")
        else:
            parts.append(_quote_dq(w))
    sep = draw(st.sampled_from([b" ", b"  ", b"\t"]))
    lead = draw(st.sampled_from([b"", b" "]))
    end = draw(st.sampled_from([b"\r\n", b"\n"]))
    return lead + sep.join(parts) + end, words


SAFE_WORD_BYTES = set(b"abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-:.{}")


@SMALL_PROPERTY
@given(items=st.lists(inline_or_multibulk(), min_size=1, max_size=8),
       sizes=st.lists(st.integers(1, 20), min_size=1, max_size=6),
       mode=st.sampled_from(["feed", "buffered"]))
def test_inline_and_multibulk_mixed(items, sizes, mode):
    data = b"".join(wire for wire, _ in items)
    expected = [args for _, args in items if args is not None]
    assert run(data, sizes, mode=mode) == expected


@SMALL_PROPERTY
@given(data=st.binary(max_size=60), sizes=st.lists(st.integers(1, 8), min_size=1, max_size=5))
def test_garbage_either_parses_or_raises_protocol_error(data, sizes):
    p = RequestParser(large_threshold=4)
    try:
        feed_stream(p, data, sizes)
    except ProtocolError as exc:
        assert exc.message.startswith("ERR Protocol error: ")
    for cmd in p.commands():
        assert cmd and all(type(a) in (bytes, bytearray) for a in cmd)


# ----------------------------------------------------------------------------------------------------------------
# Malformed input: Redis's error texts
# ----------------------------------------------------------------------------------------------------------------

MALFORMED = [
    (b"*abc\r\n", "invalid multibulk length"),
    (b"*3000000000\r\n", "invalid multibulk length"),
    (b"*1\r\n$abc\r\n", "invalid bulk length"),
    (b"*1\r\n$-1\r\n", "invalid bulk length"),
    (b"*2\r\n$3\r\nGET\r\n$-5\r\n", "invalid bulk length"),
    (b"*1\r\n$9999999999\r\n", "invalid bulk length"),
    (b"*1\r\n$%d\r\n" % (512 * 1024 * 1024 + 1), "invalid bulk length"),
    (b"*1\r\n:1\r\n", "expected '$', got ':'"),
    (b"*2\r\n$4\r\nECHO\r\n+hi\r\n", "expected '$', got '+'"),
    (b"*1\r\nx\r\n", "expected '$', got 'x'"),
    (b"*2\r\n$1\r\na\r\n*1\r\n$1\r\nb\r\n", "expected '$', got '*'"),
    (b'ECHO "unbalanced\r\n', "unbalanced quotes in request"),
    (b"ECHO 'unbalanced\r\n", "unbalanced quotes in request"),
    (b'SET "a"b c\r\n', "unbalanced quotes in request"),
    (b"SET 'a'b c\r\n", "unbalanced quotes in request"),
    (b"x" * (64 * KB + 1), "too big inline request"),
    (b"*" + b"1" * (64 * KB), "too big mbulk count string"),
    (b"*1\r\n$" + b"1" * (64 * KB), "too big bulk count string"),
]


@pytest.mark.parametrize("data,text", MALFORMED, ids=[t for _, t in MALFORMED])
@pytest.mark.parametrize("sizes", [(), (1,), (3,)], ids=["whole", "bytewise", "3"])
def test_malformed_input_raises_redis_error(data, text, sizes):
    if sizes and len(data) > 1000:
        sizes = (sizes[0] * 1000,)
    p = RequestParser()
    with pytest.raises(ProtocolError) as info:
        feed_stream(p, data, sizes)
    assert info.value.message == err(text)
    assert str(info.value) == err(text)


def test_commands_before_the_error_are_kept():
    data = mbulk(b"PING") + mbulk(b"SET", b"a", b"b") + b"*1\r\n:1\r\n"
    for sizes in [(), (1,)]:
        assert outcome(data, sizes) == ("error", err("expected '$', got ':'"), [[b"PING"], [b"SET", b"a", b"b"]])


def test_inline_just_below_limit_then_error_just_above():
    p = RequestParser()
    p.feed(b"y" * (64 * KB))
    with pytest.raises(ProtocolError, match="too big inline request"):
        p.feed(b"y")


def test_bytes_after_bulk_are_skipped_like_redis():
    # Redis skips the two bytes after a bulk string unchecked; so does kvstrata, whole or fragmented.
    assert run(b"*1\r\n$3\r\nabcXY", [1]) == [[b"abc"]]


@pytest.mark.parametrize("sizes", [(), (1,)], ids=["whole", "bytewise"])
def test_bulk_above_max_bulk_refused_before_allocation(sizes):
    rec = Recorder()
    data = b"*2\r\n$3\r\nSET\r\n$100001\r\n" + b"z" * 1000
    p = RequestParser(max_bulk=lambda: 100_000, large_threshold=1024, allocate=rec)
    with pytest.raises(ProtocolError) as info:
        feed_stream(p, data, sizes)
    assert info.value.message == err("invalid bulk length")
    assert rec.sizes == []


def test_bulk_at_max_bulk_is_allocated():
    rec = Recorder()
    p = RequestParser(max_bulk=lambda: 100_000, large_threshold=1024, allocate=rec)
    p.feed(b"*1\r\n$100000\r\n")
    assert rec.sizes == [100_000]


def test_huge_announced_bulk_is_refused_without_allocating():
    def allocate(n: int) -> bytearray:
        raise AssertionError(f"allocate({n}) called for a refused header")

    p = RequestParser(allocate=allocate)
    with pytest.raises(ProtocolError, match="invalid bulk length"):
        p.feed(b"*1\r\n$%d\r\n" % (512 * 1024 * 1024 + 1))


def test_huge_announced_array_is_refused():
    p = RequestParser()
    with pytest.raises(ProtocolError, match="invalid multibulk length"):
        p.feed(b"*%d\r\n" % (2**40))


def test_max_bulk_lowered_at_runtime_applies_to_next_header():
    limit = [1000]
    p = RequestParser(max_bulk=lambda: limit[0])
    p.feed(b"*1\r\n$1000\r\n")
    p.feed(b"a" * 1000 + b"\r\n")
    assert p.commands() == [[b"a" * 1000]]
    limit[0] = 10
    with pytest.raises(ProtocolError, match="invalid bulk length"):
        p.feed(b"*1\r\n$11\r\n")


# ----------------------------------------------------------------------------------------------------------------
# Unauthenticated limits
# ----------------------------------------------------------------------------------------------------------------


def _unauth(**kw) -> RequestParser:
    return RequestParser(authenticated=lambda: False, **kw)


@pytest.mark.parametrize("sizes", [(1,), (5,)], ids=["bytewise", "5"])
def test_unauthenticated_multibulk_over_10_args(sizes):
    p = _unauth()
    with pytest.raises(ProtocolError) as info:
        feed_stream(p, b"*11\r\n" + b"$1\r\na\r\n" * 11, sizes)
    assert info.value.message == err("unauthenticated multibulk length")


def test_unauthenticated_header_alone_is_refused():
    p = _unauth()
    with pytest.raises(ProtocolError, match="^ERR Protocol error: unauthenticated multibulk length$"):
        p.feed(b"*11\r\n")


def test_unauthenticated_10_args_allowed():
    frame = b"*10\r\n" + b"$1\r\na\r\n" * 10
    for sizes in [(), (1,)]:
        p = _unauth()
        feed_stream(p, frame, sizes)
        assert p.commands() == [[b"a"] * 10]


def test_unauthenticated_bulk_over_16384_refused_before_allocation():
    rec = Recorder()
    p = _unauth(allocate=rec, large_threshold=1024)
    with pytest.raises(ProtocolError) as info:
        p.feed(b"*2\r\n$4\r\nAUTH\r\n$16385\r\n")
    assert info.value.message == err("unauthenticated bulk length")
    assert rec.sizes == []


def test_unauthenticated_bulk_of_16384_allowed():
    value = b"p" * 16384
    frame = mbulk(b"AUTH", value)
    for sizes in [(), (1,), (100,)]:
        p = _unauth()
        feed_stream(p, frame, sizes)
        assert p.commands() == [[b"AUTH", value]]


def test_invalid_beats_unauthenticated():
    p = _unauth()
    with pytest.raises(ProtocolError, match="invalid multibulk length"):
        p.feed(b"*3000000000\r\n")
    p = _unauth()
    with pytest.raises(ProtocolError, match="invalid bulk length"):
        p.feed(b"*1\r\n$-1\r\n")


def test_limits_lifted_once_authenticated():
    state = {"auth": False}
    p = RequestParser(authenticated=lambda: state["auth"])
    p.feed(mbulk(b"AUTH", b"pw"))
    assert p.commands() == [[b"AUTH", b"pw"]]
    state["auth"] = True
    p.resume()  # the owner ran the AUTH
    frame = b"*11\r\n" + b"$1\r\na\r\n" * 11
    p.feed(frame[:7])
    p.feed(frame[7:])
    big = b"q" * 20000
    p.feed(mbulk(b"SET", b"k", big)[:30])
    p.feed(mbulk(b"SET", b"k", big)[30:])
    assert p.commands() == [[b"a"] * 11, [b"SET", b"k", big]]


# ----------------------------------------------------------------------------------------------------------------
# Former bugs, fixed: kept as regression tests
# ----------------------------------------------------------------------------------------------------------------


def test_large_bulk_chunk_ending_between_cr_and_lf():
    value = payload(THR, 5)
    frame = mbulk(value)
    p = RequestParser()
    p.feed(frame[:-1])  # header + value + b"\r"
    p.feed(frame[-1:])  # b"\n"
    p.feed(mbulk(b"PING"))
    assert p.commands() == [[value], [b"PING"]]


def test_get_buffer_not_empty_when_chunk_ends_at_end_of_large_value():
    value = payload(THR, 6)
    frame = mbulk(b"SET", b"k", value)
    p = RequestParser()
    n = len(frame) - 2  # everything but the final CRLF, in as few reads as the buffers allow
    done = 0
    while done < n:
        buf = p.get_buffer()
        k = min(len(buf), n - done)
        buf[:k] = frame[done : done + k]
        p.buffer_updated(k)
        done += k
    assert len(p.get_buffer()) > 0
    buf = p.get_buffer()
    buf[:2] = b"\r\n"
    p.buffer_updated(2)
    assert p.commands() == [[b"SET", b"k", value]]


def test_unauthenticated_multibulk_limit_applies_to_a_whole_frame():
    p = _unauth()
    with pytest.raises(ProtocolError, match="unauthenticated multibulk length"):
        p.feed(b"*11\r\n" + b"$1\r\na\r\n" * 11)


def test_unauthenticated_bulk_limit_applies_to_a_whole_frame():
    p = _unauth()
    with pytest.raises(ProtocolError, match="unauthenticated bulk length"):
        p.feed(mbulk(b"AUTH", b"x" * 16385))


def test_max_bulk_applies_to_a_whole_frame():
    p = RequestParser(max_bulk=lambda: 10)
    with pytest.raises(ProtocolError, match="invalid bulk length"):
        p.feed(mbulk(b"SET", b"k", b"y" * 20))


def test_resp3_set_frame_is_not_a_command():
    data = mbulk(b"PING") + b"~1\r\n$4\r\nPING\r\n"
    assert outcome(data) == outcome(data, [1])


@pytest.mark.parametrize("data", [b"*2\r\n+0123456789\r\n*1\r\n$1\r\na\r\n",
                                  b"*2\r\n+0123456789\r\n=7\r\ntxt:abc\r\n"], ids=["nested-array", "verbatim"])
def test_non_bulk_elements_refused_even_when_sizes_cancel(data):
    p = RequestParser()
    with pytest.raises(ProtocolError, match="expected '\\$', got '\\+'"):
        p.feed(data)


def test_bad_bulk_terminator_same_outcome_whole_or_fragmented():
    data = b"*1\r\n$3\r\nabcXY"
    assert outcome(data) == outcome(data, [1])


@pytest.mark.parametrize("data,text", [
    (b"*1\r\n$+3\r\nabc\r\n", "invalid bulk length"),
    (b"*1\r\n$ 3\r\nabc\r\n", "invalid bulk length"),
    (b"*1\r\n$03\r\nabc\r\n", "invalid bulk length"),
    (b"*1\r\n$1_0\r\n0123456789\r\n", "invalid bulk length"),
    (b"*+1\r\n$3\r\nabc\r\n", "invalid multibulk length"),
    (b"* 1\r\n$3\r\nabc\r\n", "invalid multibulk length"),
    (b"*01\r\n$3\r\nabc\r\n", "invalid multibulk length"),
], ids=["bulk+", "bulk-space", "bulk-zero", "bulk-underscore", "mbulk+", "mbulk-space", "mbulk-zero"])
def test_non_canonical_lengths_refused(data, text):
    p = RequestParser()
    with pytest.raises(ProtocolError) as info:
        p.feed(data)
    assert info.value.message == err(text)


def test_multibulk_count_up_to_int_max_accepted():
    p = RequestParser()
    p.feed(b"*1073741825\r\n$1\r\na\r\n")
    assert p.commands() == []


# ---- NUL in an inline request (issue 13) ----

def test_nul_before_the_newline_waits_like_redis():
    """Redis finds the end of an inline request with strchr, which stops at a NUL: the request (and what comes
    after it) waits until it exceeds the inline limit, then is a protocol error. Never a loop or a command."""
    p = RequestParser()
    p.feed(b"PI\x00NG\r\n")
    p.feed(b"PING\r\n")
    assert p.commands() == []
    with pytest.raises(ProtocolError, match="too big inline request"):
        p.feed(b"x" * (64 * KB))


def test_nul_after_the_newline_belongs_to_the_next_request():
    p = RequestParser()
    p.feed(b"PING\r\n\x00")
    assert p.commands() == [[b"PING"]]


def test_only_one_cr_is_part_of_the_line_ending():
    assert run(b"ECHO 'a\r'\r\n") == [[b"ECHO", b"a\r"]]
    assert run(b"ECHO a\r\r\n") == [[b"ECHO", b"a"]]


def test_headers_end_at_cr_like_redis():
    """Redis finds a header's end with strchr(p, '\\r') and skips the byte after it without checking it."""
    assert run(b"*1\rx$4\r\nPING\r\n") == [[b"PING"]]
    assert run(b"*1\r\n$4\rzPING\r\n") == [[b"PING"]]


def test_nul_before_a_header_end_means_incomplete():
    p = RequestParser()
    p.feed(b"*1\r\n\x006\r\nPING\r\n")
    assert p.commands() == []
    with pytest.raises(ProtocolError, match="too big bulk count string"):
        p.feed(b"x" * (64 * KB))


@pytest.mark.parametrize("sizes", [(), (1,), (7,), (4096,)], ids=["whole", "bytewise", "7", "4096"])
def test_unauthenticated_parsing_holds_after_auth_until_resumed(sizes):
    """Nothing after an unauthenticated client's AUTH (or HELLO) is parsed until its owner ran it: the limits that
    apply to what follows are the ones the AUTH decided."""
    state = {"authed": False}
    p = RequestParser(authenticated=lambda: state["authed"], large_threshold=1024)
    big = b"v" * 20_000
    feed_stream(p, mbulk(b"AUTH", b"pw") + mbulk(b"SET", b"k", big) + mbulk(b"hello", b"3"), sizes)
    assert p.held and p.commands() == [[b"AUTH", b"pw"]]
    state["authed"] = True
    p.resume()
    cmds = p.commands()
    assert [bytes(a) for a in cmds[0]] == [b"SET", b"k", big] and cmds[1:] == [[b"hello", b"3"]]
    assert not p.held  # an authenticated client's HELLO holds nothing


def test_unauthenticated_parsing_after_a_failed_auth_keeps_the_limits():
    p = _unauth()
    p.feed(mbulk(b"AUTH", b"wrong") + mbulk(b"SET", b"k", b"x" * 16385))
    assert p.held and p.commands() == [[b"AUTH", b"wrong"]]
    with pytest.raises(ProtocolError, match="unauthenticated bulk length"):
        p.resume()
