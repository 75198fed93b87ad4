"""The vLLM v1 KV connector against a real kvstrata server and vLLM 0.33's real classes (``KVConnectorBase_V1``,
``KVConnectorFactory``, ``VllmConfig``, ``Request``, ``SchedulerOutput``, ``KVCacheBlocks``), on the CPU.

vLLM's engine is not run (it needs a GPU); each test drives the connector as vLLM's scheduler and model runner do
in one step: scheduler ``get_num_new_matched_tokens`` -> ``update_state_after_alloc`` -> ``build_connector_meta``;
worker ``start_load_kv`` -> per layer ``wait_for_layer_load``, compute, ``save_kv_layer`` -> ``wait_for_save``.
"Compute" writes a deterministic value per (layer, position, token) into the paged cache, so a load can be
compared bitwise with what a full prefill would have produced.
"""

from __future__ import annotations

import os
import uuid

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM's CPU platform: no GPU needed for its config classes
torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm", reason="pip install --no-deps vllm==0.33.0 (scripts/test.sh, docs/vllm.md)")

from vllm.config import CacheConfig, KVTransferConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import KVCacheBlock  # noqa: E402
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from kvstrata.integrations.vllm import KvstrataConnector, PagedLayout  # noqa: E402

pytestmark = pytest.mark.kvstrata_only

LAYERS, HEADS, DIM, MLA_DIM, NUM_BLOCKS, CHUNK = 3, 2, 8, 12, 64, 64


@pytest.fixture(scope="module")
def srv(module_make_server):
    return module_make_server()


class Engine:
    """One vLLM instance as the connector sees it: a scheduler-side and a worker-side connector built by vLLM's
    factory from one VllmConfig, and the worker's paged KV cache (CPU tensors)."""

    def __init__(self, srv, block_size=16, mla=False, layout="flash", dtype=torch.float32, salt="s"):
        self.bs, self.mla, self.dtype = block_size, mla, dtype
        extra = {"url": f"redis://{srv.host}:{srv.port}", "chunk_size": CHUNK, "model": "test/model",
                 "kv_dtype": str(dtype).removeprefix("torch."), "use_mla": mla, "salt": salt}
        config = VllmConfig(kv_transfer_config=KVTransferConfig(
            kv_connector="KvstrataConnector", kv_connector_module_path="kvstrata.integrations.vllm",
            kv_role="kv_both", kv_connector_extra_config=extra), cache_config=CacheConfig(block_size=block_size))
        kv_cache_config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[])
        self.sched = KVConnectorFactory.create_connector(config, KVConnectorRole.SCHEDULER, kv_cache_config)
        self.worker = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_cache_config)
        if mla:
            shape = (NUM_BLOCKS, block_size, MLA_DIM)
        elif layout == "flash":
            shape = (2, NUM_BLOCKS, block_size, HEADS, DIM)
        elif layout == "flashinfer":
            shape = (NUM_BLOCKS, 2, block_size, HEADS, DIM)
        else:  # HND
            shape = (2, NUM_BLOCKS, HEADS, block_size, DIM)
        self.layout = layout
        self.kv = {f"model.layers.{i}.self_attn.attn": torch.full(shape, -1.0, dtype=dtype) for i in range(LAYERS)}
        self.worker.register_kv_caches(self.kv)
        self.free = list(range(NUM_BLOCKS))
        self.blocks: dict[str, list[int]] = {}

    def alloc(self, req_id, n_tokens):
        have = self.blocks.setdefault(req_id, [])
        need = -(-n_tokens // self.bs) - len(have)
        new = [self.free.pop(0) for _ in range(max(0, need))]
        have += new
        return new

    def release(self, req_id):
        self.free += self.blocks.pop(req_id, [])

    def token_kv(self, layer, pos, token):
        """What a prefill computes for one token: [2, H, D] (MHA) or [D] (MLA)."""
        g = torch.Generator().manual_seed(layer * 1_000_003 + pos * 7919 + token)
        shape = (MLA_DIM,) if self.mla else (2, HEADS, DIM)
        return torch.randn(shape, generator=g).to(self.dtype)

    def slot(self, kv, block, off):
        if self.mla:
            return kv[block, off]
        if self.layout == "flash":
            return kv[:, block, off]
        if self.layout == "flashinfer":
            return kv[block, :, off]
        return kv[:, block, :, off]

    def token_at(self, req_id, layer, pos):
        kv = self.kv[f"model.layers.{layer}.self_attn.attn"]
        return self.slot(kv, self.blocks[req_id][pos // self.bs], pos % self.bs)

    def step(self, scheduled):
        """One engine step. ``scheduled``: (request, num_computed, num_new_tokens, new_block_ids, kind) with kind
        "new", "running" or "resumed"."""
        out = SchedulerOutput.make_empty()
        cached = CachedRequestData.make_empty()
        for req, computed, n, new_blocks, kind in scheduled:
            out.num_scheduled_tokens[req.request_id] = n
            if kind == "new":
                out.scheduled_new_reqs.append(NewRequestData.from_request(req, (list(self.blocks[req.request_id]),)))
                out.scheduled_new_reqs[-1].num_computed_tokens = computed
            else:
                cached.req_ids.append(req.request_id)
                cached.new_block_ids.append((list(new_blocks),) if new_blocks is not None else None)
                cached.num_computed_tokens.append(computed)
                if kind == "resumed":
                    cached.resumed_req_ids.add(req.request_id)
        out.scheduled_cached_reqs = cached
        meta = self.sched.build_connector_meta(out)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        for layer, name in enumerate(self.kv):
            self.worker.wait_for_layer_load(name)
            for req, computed, n, _, _ in scheduled:  # the forward writes the KV of the tokens it computes
                for pos in range(computed, computed + n):
                    block = self.blocks[req.request_id][pos // self.bs]
                    self.slot(self.kv[name], block, pos % self.bs).copy_(
                        self.token_kv(layer, pos, req.prompt_token_ids[pos]))
            self.worker.save_kv_layer(name, self.kv[name], None)
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()
        return meta

    def schedule(self, req, local_hit=0):
        """The scheduler's view of a new request: external hit, allocation, update_state_after_alloc."""
        req.num_computed_tokens = local_hit
        ext, is_async = self.sched.get_num_new_matched_tokens(req, local_hit)
        assert is_async is False
        new = self.alloc(req.request_id, local_hit + ext)
        blocks = KVCacheBlocks(([KVCacheBlock(block_id=b) for b in self.blocks[req.request_id]],))
        self.sched.update_state_after_alloc(req, blocks if new or ext else KVCacheBlocks(([],)), ext)
        return ext

    def prefill(self, req, local_hit=0):
        """Schedule and run a whole prompt in one step; returns (external hit, the step's metadata)."""
        ext = self.schedule(req, local_hit)
        self.alloc(req.request_id, len(req.prompt_token_ids))
        computed = local_hit + ext
        meta = self.step([(req, computed, len(req.prompt_token_ids) - computed, None, "new")])
        self.worker.flush()
        return ext, meta

    def expect_prefilled(self, req, upto):
        for layer in range(LAYERS):
            for pos in range(upto):
                want = self.token_kv(layer, pos, req.prompt_token_ids[pos])
                assert torch.equal(self.token_at(req.request_id, layer, pos), want), (layer, pos)


def request(tokens, req_id=None):
    return Request(req_id or uuid.uuid4().hex, list(tokens), SamplingParams(max_tokens=1), None)


def prompt(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 30000, (n,), generator=g).tolist()


def test_the_connector_is_vllms_kind_and_loads_through_its_factory(srv):
    eng = Engine(srv)
    assert isinstance(eng.sched, KvstrataConnector) and isinstance(eng.sched, KVConnectorBase_V1)
    assert eng.worker.role == KVConnectorRole.WORKER
    assert eng.sched.client.namespace.layout == "LKHTD"
    assert Engine(srv, mla=True).sched.client.namespace.layout == "LHTD"


CASES = [dict(block_size=16), dict(block_size=32), dict(block_size=16, layout="flashinfer"),
         dict(block_size=16, layout="hnd"), dict(block_size=16, dtype=torch.bfloat16),
         dict(block_size=16, mla=True), dict(block_size=64, mla=True)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_blocks_round_trip_between_two_instances(srv, case):
    salt = uuid.uuid4().hex
    a, b = Engine(srv, salt=salt, **case), Engine(srv, salt=salt, **case)
    tokens = prompt(200, seed=1)
    ext, meta = a.prefill(request(tokens))
    assert ext == 0 and [len(s.keys) for s in meta.saves] == [3]  # three whole 64-token chunks of the prompt
    assert a.worker.store_errors == 0
    b.free = b.free[::-1]  # other block ids than a's
    req = request(tokens)
    ext, meta = b.prefill(req)
    assert ext == 192 and not meta.saves
    assert b.worker.get_block_ids_with_load_errors() == set()
    b.expect_prefilled(req, 200)  # loaded 0..191 bitwise equal to a prefill, 192..199 computed
    # The chunks are the SDK's: the same keys, values a client of the same namespace decodes.
    n, chunks = b.sched.client.retrieve_chunks(tokens)
    assert n == 192 and chunks[0].shape[-2] == CHUNK


def test_partial_hit_and_local_prefix(srv):
    salt = uuid.uuid4().hex
    a, b = Engine(srv, salt=salt), Engine(srv, salt=salt)
    base = prompt(200, seed=2)
    a.prefill(request(base))
    other = base[:130] + prompt(70, seed=3)
    req = request(other)
    ext, _ = b.prefill(req)
    assert ext == 128  # two whole chunks in common
    b.expect_prefilled(req, 200)
    # vLLM's own prefix cache already holds 64 tokens: only the rest of the hit is loaded, the first blocks are
    # not touched.
    c = Engine(srv, salt=salt)
    req = request(base)
    c.alloc(req.request_id, 64)
    for name in c.kv:
        for blk in c.blocks[req.request_id]:
            c.slot(c.kv[name], blk, slice(None)).fill_(7.0)
    ext, meta = c.prefill(req, local_hit=64)
    assert ext == 128 and meta.loads[0].start == 64 and meta.loads[0].end == 192
    assert torch.all(c.token_at(req.request_id, 0, 10) == 7.0)
    for layer in range(LAYERS):
        for pos in range(64, 200):
            assert torch.equal(c.token_at(req.request_id, layer, pos), c.token_kv(layer, pos, base[pos]))
    # A prompt shorter than a chunk, or one whose hit is all local already: nothing to load.
    assert c.sched.get_num_new_matched_tokens(request(base[:60]), 0) == (0, False)
    assert c.sched.get_num_new_matched_tokens(request(base), 192) == (0, False)


def test_chunked_prefill_and_preemption(srv):
    salt = uuid.uuid4().hex
    eng = Engine(srv, salt=salt)
    tokens = prompt(260, seed=4)
    req = request(tokens)
    assert eng.schedule(req) == 0
    eng.alloc(req.request_id, 100)
    meta = eng.step([(req, 0, 100, None, "new")])  # chunked prefill: 100 tokens, one whole chunk done
    assert [(s.first, len(s.keys)) for s in meta.saves] == [(0, 1)]
    new = eng.alloc(req.request_id, 200)
    meta = eng.step([(req, 100, 100, new, "running")])
    assert [(s.first, len(s.keys)) for s in meta.saves] == [(1, 2)]
    eng.worker.flush()
    # Preempted: its blocks go back; it is scheduled again later with other blocks and finds its chunks.
    eng.release(req.request_id)
    eng.free = eng.free[::-1]
    ext = eng.schedule(req)
    assert ext == 192
    eng.alloc(req.request_id, 260)
    meta = eng.step([(req, 192, 68, list(eng.blocks[req.request_id]), "resumed")])
    assert [(s.first, len(s.keys)) for s in meta.saves] == [(3, 1)]  # the fourth chunk, computed now
    eng.worker.flush()
    eng.expect_prefilled(req, 260)
    assert eng.sched.client.lookup(tokens) == 256
    assert eng.sched.request_finished(req, eng.blocks[req.request_id]) == (False, None)


def test_chunks_evicted_after_the_lookup_are_reported_as_load_errors(srv):
    salt = uuid.uuid4().hex
    a, b = Engine(srv, salt=salt), Engine(srv, salt=salt)
    tokens = prompt(200, seed=5)
    a.prefill(request(tokens))
    req = request(tokens)
    assert b.schedule(req) == 192
    srv.client().delete(b.sched.client.keys(tokens)[1])  # gone between the lookup and the load
    b.alloc(req.request_id, 200)
    b.step([(req, 192, 8, None, "new")])
    lost = b.worker.get_block_ids_with_load_errors()
    assert lost == set(b.blocks[req.request_id][4:12])  # tokens 64..191: vLLM recomputes these blocks
    for layer in range(LAYERS):
        for pos in range(64):
            assert torch.equal(b.token_at(req.request_id, layer, pos), b.token_kv(layer, pos, tokens[pos]))


def test_unreachable_server_is_a_miss_and_a_counted_store_error(srv, make_server):
    dead = make_server()
    eng = Engine(dead)
    dead._reap()
    tokens = prompt(200, seed=6)
    req = request(tokens)
    ext, meta = eng.prefill(req)
    assert ext == 0 and len(meta.saves) == 1
    assert eng.worker.store_errors == 1 and eng.worker.client.stats.store_errors == 1
    eng.expect_prefilled(req, 200)


def test_paged_layout_detection():
    assert PagedLayout((2, 10, 16, 4, 8), 10, 16, False).kv_first
    assert not PagedLayout((10, 2, 16, 4, 8), 10, 16, False).kv_first
    assert PagedLayout((2, 10, 4, 16, 8), 10, 16, False).hnd
    with pytest.raises(ValueError):
        PagedLayout((3, 10, 16, 4, 8), 10, 16, False)
    with pytest.raises(ValueError):
        PagedLayout((10, 16), 10, 16, True)


def test_a_worker_of_another_tp_rank_uses_its_own_keys(srv):
    """An MHA rank stores its own heads: a worker whose rank differs from the scheduler's namespace computes its
    keys from the plan's tokens (vLLM's parallel state gives the rank; set here as register_kv_caches would)."""
    from kvstrata.client import KVCacheClient, Namespace

    salt = uuid.uuid4().hex
    eng = Engine(srv, salt=salt)
    eng.worker._ns_fields["tp_rank"] = 1
    eng.worker._own_keys = True
    eng.worker._make_client("float32")
    tokens = prompt(140, seed=7)
    eng.prefill(request(tokens))
    rank1 = KVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace(**{**eng.worker.client.namespace.__dict__}),
                          chunk_size=CHUNK)
    assert rank1.namespace.tp_rank == 1 and rank1.lookup(tokens) == 128
    assert eng.sched.client.lookup(tokens) == 0  # rank 0's keys: nothing stored under them
