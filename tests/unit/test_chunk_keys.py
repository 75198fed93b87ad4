"""Chunk keys: the test vectors of docs/chunk-keys.md, an independent re-implementation, namespaces."""

from __future__ import annotations

import hashlib
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvstrata.client.keys import Namespace, chunk_digests, chunk_keys, tail_digests, tail_keys

DOC = Path(__file__).resolve().parents[2] / "docs" / "chunk-keys.md"

VECTORS = [
    (list(range(8)), 4, ["baed642339816affb3fe8719792d0e4ce82f12db72b7373d244eaa65445800fe",
                         "01414b052706d93bd0f1f1646c0e8ca2fa8ef5efd7bcc99f7a1cee8eb11ad052"]),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4, ["cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72",
                                          "4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6"]),
    ([0xFFFFFFFF, 0, 1, 2], 4, ["2f63719df76283c009fc71cbe1ed655f2913379dc1b6d9f4ac17930ecb0f7535"]),
    (list(range(512)), 256, ["8808405eec6fbe306fe3369f88daed79dd5613ddbb5e801f632b01d6218c5f08",
                             "705440bca5981da70aa2be86254ecd2a1d66e6b280edf72ba0c3b17074bb9061"]),
]


def reference(tokens, chunk_size):
    """SGLang HiCache's get_hash_str, chained: sha256(prev digest bytes || le32 tokens)."""
    out, prior = [], None
    for i in range(len(tokens) // chunk_size):
        h = hashlib.sha256()
        if prior is not None:
            h.update(bytes.fromhex(prior))
        for t in tokens[i * chunk_size:(i + 1) * chunk_size]:
            h.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = h.hexdigest()
        out.append(prior)
    return out


@pytest.mark.parametrize(("tokens", "chunk_size", "expected"), VECTORS)
def test_vectors(tokens, chunk_size, expected):
    assert [d.hex() for d in chunk_digests(tokens, chunk_size)] == expected
    assert reference(tokens, chunk_size) == expected


def test_vectors_are_in_the_doc():
    text = DOC.read_text()
    for _, _, expected in VECTORS:
        for digest in expected:
            assert digest in text
    ns = Namespace("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert ns.id in text
    assert chunk_keys(list(range(8)), ns, 4)[0].decode() in text


def test_matches_reference_on_random_tokens():
    import random

    rng = random.Random(7)
    tokens = [rng.randrange(0, 2**32) for _ in range(1000)]
    assert [d.hex() for d in chunk_digests(tokens, 64)] == reference(tokens, 64)
    # numpy arrays and lists give the same digests
    np = pytest.importorskip("numpy")
    assert chunk_digests(np.array(tokens, dtype=np.int64), 64) == chunk_digests(tokens, 64)


def test_partial_last_chunk_has_no_key():
    assert chunk_digests(list(range(7)), 4) == chunk_digests(list(range(4)), 4)
    assert len(chunk_digests(list(range(7)), 4)) == 1
    assert chunk_digests(list(range(3)), 4) == []


TAIL_VECTORS = [
    # (tokens, chunk_size, the digest of the tail of r tokens at r - 1)
    (list(range(1, 11)), 4, ["0c433401cc95cf18e69ec4db4120530f5a2a260978ba6931bf6eec904adf8a1d",
                             "6dc571acd2ccb712fb7a8b13854443ded3fba409ddd9aa84849d3840c1547ca3"]),
    ([0, 1, 2], 4, ["df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119",
                    "01acecb507abfe1a354aa8064f4af5d3f1acd019e37db3c11c97523b71c76e9d",
                    "ad5dc1478de06a4c2728ea528bd9361a4b945e92a414bf4d180cedaaeaa5f4cc"]),
]


@pytest.mark.parametrize(("tokens", "chunk_size", "expected"), TAIL_VECTORS)
def test_tail_vectors(tokens, chunk_size, expected):
    ns = Namespace("m")
    keys = tail_keys(tokens, ns, chunk_size)
    assert [k.decode() for k in keys] == [ns.prefix.decode() + e for e in expected]
    # The reference chaining, with the tail as the last "chunk" of its own length.
    n_full = len(tokens) // chunk_size
    parent = reference(tokens, chunk_size)[-1] if n_full else None
    for r, digest in enumerate(expected, 1):
        h = hashlib.sha256(bytes.fromhex(parent) if parent else b"")
        for t in tokens[n_full * chunk_size:n_full * chunk_size + r]:
            h.update(t.to_bytes(4, "little"))
        assert h.hexdigest() == digest
    assert all(e in DOC.read_text() for e in expected)


def test_tail_keys_follow_the_full_chunks_and_fill_up_into_the_next():
    ns = Namespace("m")
    tokens = list(range(100, 111))  # two chunks of 4, a tail of 3
    full = chunk_keys(tokens, ns, 4)
    tails = tail_keys(tokens, ns, 4)
    assert len(tails) == 3 and not set(tails) & set(full)
    assert tail_keys(tokens, ns, 4, keys=full) == tails
    assert tail_keys(tokens, ns, 4, longest_only=True) == tails[-1:]  # what a store writes
    assert tail_keys(tokens[:8], ns, 4) == []  # no tail: nothing after the last full chunk
    # A tail that fills up is the full chunk the longer sequence gets; the chain is the full chunks'.
    longer = chunk_keys(tokens + [111], ns, 4)
    assert tail_digests(bytes.fromhex(full[-1][-64:].decode()), tokens[8:] + [111])[-1].hex() == \
        longer[-1][-64:].decode()
    # A different prefix gives different tails for the same last tokens.
    assert not set(tail_keys([0] + tokens[1:], ns, 4)) & set(tails)
    assert tail_keys(tokens, ns, 4, shard_key="u1")[0].startswith(ns.prefix + b"{u1}:")
    with pytest.raises(ValueError, match="keys given"):
        tail_keys(tokens, ns, 4, keys=full[:1])


def test_prefix_property_and_chaining():
    a = chunk_digests(list(range(12)), 4)
    b = chunk_digests(list(range(8)) + [99, 99, 99, 99], 4)
    assert a[:2] == b[:2] and a[2] != b[2]
    # the same chunk content after a different prefix gets a different digest
    c = chunk_digests([9, 9, 9, 9] + list(range(4, 8)), 4)
    assert c[1] != a[1]


def test_key_format_and_namespace_isolation():
    tokens = list(range(8))
    base = Namespace("m")
    keys = chunk_keys(tokens, base, 4)
    assert all(re.fullmatch(rb"kvs:[0-9a-f]{16}:[0-9a-f]{64}", k) for k in keys)
    others = [Namespace("m2"), Namespace("m", kv_dtype="bfloat16"), Namespace("m", layout="TLKHD"),
              Namespace("m", tp_rank=1, tp_size=2), Namespace("m", adapter="lora-a"), Namespace("m", salt="s")]
    ids = {base.id} | {ns.id for ns in others}
    assert len(ids) == len(others) + 1
    for ns in others:
        assert not set(chunk_keys(tokens, ns, 4)) & set(keys)


def test_token_range_checked():
    with pytest.raises(ValueError):
        chunk_digests([2**32, 0, 0, 0], 4)
    with pytest.raises(ValueError):
        chunk_digests([-1, 0, 0, 0], 4)
    with pytest.raises(ValueError):
        chunk_digests([1], 0)


def test_same_keys_in_another_process():
    code = ("from kvstrata.client.keys import Namespace, chunk_keys;"
            "print(chunk_keys(list(range(300)), Namespace('x', salt='y'), 128)[1].decode())")
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": src, "PYTHONHASHSEED": "123"}).stdout.strip()
    assert out == chunk_keys(list(range(300)), Namespace("x", salt="y"), 128)[1].decode()
    assert struct.calcsize("<I") == 4


def test_shard_key_becomes_the_hash_tag_of_every_key():
    ns = Namespace("m")
    tokens = list(range(12))
    tagged = chunk_keys(tokens, ns, 4, shard_key="user-42")
    plain = chunk_keys(tokens, ns, 4)
    assert len(tagged) == len(plain) == 3
    for t, p in zip(tagged, plain, strict=True):
        # The first {...} of a key decides its Redis Cluster slot: the shard key, for every chunk.
        assert t[t.index(b"{") + 1 : t.index(b"}")] == b"user-42"
        assert t.startswith(ns.prefix) and t.endswith(p[len(ns.prefix) :])
    assert not set(tagged) & set(plain)


def test_shard_key_with_braces_is_refused():
    import pytest

    with pytest.raises(ValueError):
        chunk_keys(list(range(4)), Namespace("m"), 4, shard_key="a}b")
