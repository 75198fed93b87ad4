"""transformers integration on tiny random-weight Qwen2, Qwen3 and Llama models, against a real server:
greedy tokens identical with and without reuse, logits allclose, restored cache bitwise equal (raw codec)."""

from __future__ import annotations

import os
import uuid

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (see scripts/test.sh)
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvstrata.client import KVCacheClient, LocalTier, Namespace  # noqa: E402
from kvstrata.integrations.models import load_tiny  # noqa: E402
from kvstrata.integrations.transformers import (  # noqa: E402
    CachedGenerator,
    cache_layers,
    chunk_from_cache,
    model_namespace,
    restore_cache,
)

CS = 16
FAMILIES = ["qwen2", "qwen3", "llama"]


@pytest.fixture(scope="module")
def url(module_make_server):
    srv = module_make_server()
    return f"redis://{srv.host}:{srv.port}"


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return load_tiny(request.param)


def prompt(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (n,), generator=g).tolist()


def fresh_client(url, model, **kw):
    kw.setdefault("chunk_size", CS)
    return KVCacheClient(url, model_namespace(model, salt=uuid.uuid4().hex), **kw)


def test_reuse_gives_identical_tokens_and_close_logits(url, model):
    ids = prompt(100)
    base = CachedGenerator(model).generate(ids, 20, return_logits=True, keep_cache=True)
    assert base.cached_tokens == 0 and base.computed_tokens == 100
    with CachedGenerator(model, fresh_client(url, model)) as gen:
        first = gen.generate(ids, 20, return_logits=True, keep_cache=True)
        assert first.cached_tokens == 0 and first.tokens == base.tokens
        gen.flush()
        again = gen.generate(ids, 20, return_logits=True, keep_cache=True)
    assert again.cached_tokens == 96 and again.computed_tokens == 4
    assert again.tokens == base.tokens
    assert torch.allclose(again.first_logits, base.first_logits, atol=1e-5, rtol=1e-4)
    for a, b in zip(again.step_logits, base.step_logits, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    # the restored part of the cache is bitwise what the first call computed and stored
    for (k1, v1), (k2, v2) in zip(cache_layers(first.cache), cache_layers(again.cache), strict=True):
        assert torch.equal(k1[:, :, :96], k2[:, :, :96]) and torch.equal(v1[:, :, :96], v2[:, :, :96])


def test_stored_chunks_decode_bitwise(url, model):
    ids = prompt(64, seed=3)
    client = fresh_client(url, model)
    with CachedGenerator(model, client, background_store=False) as gen:
        res = gen.generate(ids, 5, keep_cache=True)
    layers = cache_layers(res.cache)
    # prompt + 4 generated tokens have KV: 68 tokens -> 4 full chunks
    n, chunks = client.retrieve_chunks(ids + res.tokens[:-1])
    assert n == 64
    for i, chunk in enumerate(chunks):
        assert (chunk == chunk_from_cache(layers, i * CS, (i + 1) * CS)).all()
    restored = restore_cache(chunks, "float32")
    for (k, v), (rk, rv) in zip(layers, cache_layers(restored), strict=True):
        assert torch.equal(k[:, :, :64], rk) and torch.equal(v[:, :, :64], rv)


@pytest.mark.parametrize("tails", [True, False])
def test_next_turn_reuses_prompt_and_reply(url, model, tails):
    ids = prompt(40, seed=5)
    with CachedGenerator(model, fresh_client(url, model), tails=tails) as gen, CachedGenerator(model) as plain:
        r1 = gen.generate(ids, 12, keep_cache=True)
        # A new message longer than a chunk: the first turn's tail (at 48) lies before this prompt's last full
        # chunk boundary (80).
        turn2 = ids + r1.tokens + prompt(30, seed=6)
        r2 = gen.generate(turn2, 12, keep_cache=True)
        seen = len(ids) + len(r1.tokens) - 1  # the tokens whose KV the first turn computed
        if tails:
            # Every token the first turn computed (48 in full chunks, a tail of 3): only the last reply token and
            # the new message are computed.
            assert r2.cached_tokens == seen and r2.computed_tokens == len(turn2) - seen
        else:
            assert r2.cached_tokens == seen // CS * CS and r2.cached_tokens > len(ids) - CS
        assert r2.tokens == plain.generate(turn2, 12).tokens
        # The restored part, the tail's tokens too, is bitwise what the first turn computed.
        for (k1, v1), (k2, v2) in zip(cache_layers(r1.cache), cache_layers(r2.cache), strict=True):
            n = r2.cached_tokens
            assert torch.equal(k1[:, :, :n], k2[:, :, :n]) and torch.equal(v1[:, :, :n], v2[:, :, :n])
        # The third turn (a short message: its tail and its last full chunk boundary are the same) finds the
        # second turn's tail.
        turn3 = turn2 + r2.tokens + prompt(5, seed=7)
        r3 = gen.generate(turn3, 4)
        if tails:
            assert r3.cached_tokens == len(turn2) + len(r2.tokens) - 1
        assert r3.tokens == plain.generate(turn3, 4).tokens


def test_a_tail_is_read_only_after_every_full_chunk_before_it(url, model):
    client = fresh_client(url, model)
    ids = prompt(45, seed=8)  # two full chunks, a tail of 13
    with CachedGenerator(model, client, background_store=False) as gen:
        gen.generate(ids, 1)  # stores 2 chunks and the tail of 13 (a 1-token reply adds no KV)
    assert client.longest_tail(ids) == (13, client.tail_keys(ids)[12])
    longer = ids + prompt(2, seed=9)  # the next prompt: the tail of 13, then new tokens (still before 48)
    assert client.longest_tail(longer[:-1], client.keys(longer[:-1]))[0] == 13
    assert client.lookup_tail(longer + prompt(30, seed=10)) == (45, client.tail_keys(ids)[12])
    client.redis.delete(client.keys(ids)[1])  # a full chunk before the tail is gone
    with CachedGenerator(model, client, background_store=False) as gen, CachedGenerator(model) as plain:
        r = gen.generate(longer, 4)
        assert r.cached_tokens == CS  # the first chunk only: the tail needs every chunk before it
        assert r.tokens == plain.generate(longer, 4).tokens


def test_partial_last_chunk_and_exact_multiple(url, model):
    ids = prompt(96, seed=7)  # an exact multiple of the chunk size
    with CachedGenerator(model, fresh_client(url, model)) as gen:
        gen.generate(ids, 1)
        r = gen.generate(ids, 3)
        # the last token must be computed to get logits: only 5 of the 6 chunks are restored
        assert r.cached_tokens == 80 and r.computed_tokens == 16
        short = gen.generate(ids[:CS - 1], 2)
        assert short.cached_tokens == 0


def test_mismatched_namespace_never_hits(url, model):
    ids = prompt(64, seed=9)
    client = fresh_client(url, model)
    with CachedGenerator(model, client) as gen:
        gen.generate(ids, 2)
    other_weights = load_tiny(model.config.model_type.removesuffix("_text"), seed=123)
    ns = Namespace(model=client.namespace.model + ":other-weights", salt=client.namespace.salt)
    with CachedGenerator(other_weights, KVCacheClient(url, ns, chunk_size=CS)) as gen:
        assert gen.generate(ids, 2).cached_tokens == 0
    bf16 = Namespace(**{**client.namespace.__dict__, "kv_dtype": "bfloat16"})
    assert KVCacheClient(url, bf16, chunk_size=CS).lookup(ids) == 0
    assert client.lookup(ids) == 64


def test_local_tier_generator(model):
    client = KVCacheClient(None, model_namespace(model), chunk_size=CS, local_tier=LocalTier(1 << 26))
    ids = prompt(50, seed=11)
    with CachedGenerator(model, client) as gen, CachedGenerator(model) as plain:
        gen.generate(ids, 4)
        r = gen.generate(ids, 8)
        assert r.cached_tokens == 48
        assert r.tokens == plain.generate(ids, 8).tokens


def test_namespace_of_model(model):
    ns = model_namespace(model)
    assert ns.kv_dtype == "float32" and ns.layout == "LKHTD"
    assert model.config.model_type in ns.model
    assert model_namespace(model, model_id="x", adapter="a").model == "x"


def test_device_tier_in_front_of_the_server(url, model):
    from kvstrata.engine.entry import Entry
    from kvstrata.integrations.transformers import TensorTier

    client = fresh_client(url, model, local_tier=LocalTier(1 << 26))
    tier = TensorTier(1 << 26, device="cpu")  # the GPU when present; the same code path on the CPU here
    ids = prompt(70, seed=13)
    with CachedGenerator(model, client, device_tier=tier) as gen, CachedGenerator(model) as plain:
        gen.generate(ids, 3)
        gen.flush()
        assert len(tier) == 4 and tier.used <= tier.budget
        r = gen.generate(ids, 6)
        assert r.cached_tokens == 64 and gen.device_hits == 4
        assert r.tokens == plain.generate(ids, 6).tokens
        # chunks the device tier lost come from the server
        tier.delete(client.keys(ids)[2])
        r = gen.generate(ids, 6)
        assert r.cached_tokens == 64 and gen.device_hits == 2
        assert r.tokens == plain.generate(ids, 6).tokens
    # warm-up from the host tier up to warmup_ratio of the budget
    warm = TensorTier(1 << 26, device="cpu", warmup_ratio=0.5, warm_from=client.local)
    assert len(warm) == len(client.local) and warm.used <= 0.5 * warm.budget + 200_000
    small = TensorTier(3 * (16 * 2 * 2 * 2 * 16 * 4 + 400), device="cpu")
    for key in client.keys(ids):
        small.put(key, Entry(torch.zeros(2, 2, 2, 16, 16), 0))
    assert len(small) == 3 and small.evictions == 1


def test_restore_across_several_batches(url, model):
    """Chunks read in several batches (batch_size 2: four round trips) restore the same cache."""
    ids = prompt(130, seed=17)
    with CachedGenerator(model, fresh_client(url, model, batch_size=2)) as gen, CachedGenerator(model) as plain:
        gen.generate(ids, 2)
        gen.generate(ids, 2)  # the second read goes into reusable buffers
        r = gen.generate(ids, 8)
        assert r.cached_tokens == 128
        assert r.tokens == plain.generate(ids, 8).tokens
