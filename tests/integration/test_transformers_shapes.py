"""transformers integration on cache shapes beyond plain grouped-query attention, against a real server: MLA
(DeepSeek-V3: K and V of different widths), sliding-window layers (Mistral, Gemma2), and store failures that are
logged and counted instead of lost."""

from __future__ import annotations

import logging
import os
import uuid

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (see scripts/test.sh)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvstrata.client import KVCacheClient, Namespace  # noqa: E402
from kvstrata.integrations.models import load_tiny  # noqa: E402
from kvstrata.integrations.transformers import (  # noqa: E402
    CachedGenerator,
    cache_layers,
    chunk_from_cache,
    kv_widths,
    model_namespace,
    restore_cache,
)

CS = 16


@pytest.fixture(scope="module")
def url(module_make_server):
    srv = module_make_server()
    return f"redis://{srv.host}:{srv.port}"


@pytest.fixture(scope="module")
def mla():
    return load_tiny("deepseek_v3")


def prompt(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (n,), generator=g).tolist()


def fresh_client(url, model, **kw):
    kw.setdefault("chunk_size", CS)
    return KVCacheClient(url, model_namespace(model, salt=uuid.uuid4().hex), **kw)


def test_mla_cache_has_k_and_v_of_different_widths(mla):
    res = CachedGenerator(mla).generate(prompt(20), 2, keep_cache=True)
    k, v = cache_layers(res.cache)[0]
    # transformers 4.57 caches full heads (K: qk_nope 16 + rope 8, V: v_head_dim 12); 5.x the latent (16, rope 8)
    expect = (24, 12) if transformers.__version__.startswith("4.") else (16, 8)
    assert (k.shape[-1], v.shape[-1]) == expect
    assert kv_widths(mla) == expect
    ns = model_namespace(mla)
    assert ns.layout == "LHTD" and ("kv_split", f"{expect[0]}+{expect[1]}") in ns.extra
    # Different keys from an LKHTD namespace of the same model: the two layouts never read each other's chunks.
    assert ns.id != Namespace(model=ns.model, kv_dtype=ns.kv_dtype).id


def test_mla_restores_with_identical_greedy_tokens(url, mla):
    ids = prompt(90, seed=2)
    base = CachedGenerator(mla).generate(ids, 12, return_logits=True)
    client = fresh_client(url, mla)
    with CachedGenerator(mla, client) as gen:
        first = gen.generate(ids, 12, keep_cache=True)
        gen.flush()
        assert not gen.store_errors
        again = gen.generate(ids, 12, return_logits=True, keep_cache=True)
    assert client.stats.store_errors == 0 and client.stats.stored_chunks >= 5
    assert again.cached_tokens == 80 and again.computed_tokens == 10
    assert first.tokens == base.tokens and again.tokens == base.tokens
    assert torch.allclose(again.first_logits, base.first_logits, atol=1e-5, rtol=1e-4)
    for (k1, v1), (k2, v2) in zip(cache_layers(first.cache), cache_layers(again.cache), strict=True):
        assert torch.equal(k1[:, :, :80], k2[:, :, :80]) and torch.equal(v1[:, :, :80], v2[:, :, :80])


def test_mla_chunks_decode_bitwise(url, mla):
    ids = prompt(48, seed=3)
    client = fresh_client(url, mla)
    with CachedGenerator(mla, client, background_store=False) as gen:
        res = gen.generate(ids, 3, keep_cache=True)
    layers = cache_layers(res.cache)
    n, chunks = client.retrieve_chunks(ids)
    k, v = layers[0]
    assert n == 48 and chunks[0].shape == (2, k.shape[1], CS, k.shape[-1] + v.shape[-1])
    for i, chunk in enumerate(chunks):
        assert (chunk == chunk_from_cache(layers, i * CS, (i + 1) * CS)).all()
    restored = restore_cache(chunks, "float32", k_width=k.shape[-1])
    for (k, v), (rk, rv) in zip(layers, cache_layers(restored), strict=True):
        assert torch.equal(k[:, :, :48], rk) and torch.equal(v[:, :, :48], rv)
    with pytest.raises(ValueError, match="k_width"):
        restore_cache(chunks, "float32")


def test_a_namespace_of_the_wrong_layout_is_refused(url, mla):
    with pytest.raises(ValueError, match="LHTD"):
        CachedGenerator(mla, KVCacheClient(url, Namespace(model="deepseek"), chunk_size=CS))


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_sliding_window_models_restore_past_the_window(url, family):
    model = load_tiny(family)
    assert model.config.sliding_window == 24
    ids = prompt(100, seed=4)  # four windows long
    with CachedGenerator(model, fresh_client(url, model)) as gen, CachedGenerator(model) as plain:
        gen.generate(ids, 4)
        turn2 = ids + prompt(30, seed=5)
        r = gen.generate(turn2, 10)
        assert r.cached_tokens == 96
        assert r.tokens == plain.generate(turn2, 10).tokens
        assert not gen.store_errors


def test_a_cache_that_dropped_tokens_cannot_be_cut_into_chunks():
    """A sliding-window layer that kept only its window (a cache built by the model itself) is refused with a
    clear error, never stored as a short chunk."""
    k = torch.zeros(1, 2, 24, 16)
    full = torch.zeros(1, 2, 64, 16)
    with pytest.raises(ValueError, match="layer 1 holds 24 tokens"):
        chunk_from_cache([(full, full), (k, k)], 32, 48)


@pytest.mark.parametrize("background", [True, False])
def test_store_failures_are_logged_and_counted(make_server, caplog, background):
    """A server that refuses the store (out of memory, noeviction): the reply is still right, the failure is
    logged, in ``store_errors`` and in the client's stats; the next turn simply computes everything."""
    model = load_tiny("qwen2")
    srv = make_server({"maxmemory": "1mb", "maxmemory-policy": "noeviction"})
    filler = srv.client()
    filler.set("filler", b"x" * 900_000)
    filler.close()
    client = KVCacheClient(f"redis://{srv.host}:{srv.port}", model_namespace(model), chunk_size=CS)
    caplog.set_level(logging.WARNING, logger="kvstrata.integrations.transformers")
    ids = prompt(300, seed=6)  # 18 chunks of 8 KiB: over what is left of the budget
    with CachedGenerator(model, client, background_store=background) as gen, CachedGenerator(model) as plain:
        r1 = gen.generate(ids, 4)
        gen.flush()
        assert len(gen.store_errors) == 1
        r2 = gen.generate(ids, 4)
        assert r1.tokens == r2.tokens == plain.generate(ids, 4).tokens
    assert r2.cached_tokens < 288  # the refused chunks are not there
    assert client.stats.store_errors == 2
    assert sum(e.startswith("store: OutOfMemoryError") for e in client.stats.errors) == 2
    assert caplog.text.count("storing the KV cache failed") == 2
