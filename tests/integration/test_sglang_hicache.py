"""SGLang HiCache backend against a real kvstrata server: zero-copy pages into and out of a host pool, hit
lengths, whole pages or nothing, the tensor interface, clear, stats, reconnects.

(The unit tests of the same backend are tests/unit/test_sglang_backend.py; this file has another name because
pytest's default import mode needs unique test file names.)
"""

from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")

from sglang_support import MHAHostPool, MLAHostPool, import_sglang, page_indices, storage_config  # noqa: E402

hicache = import_sglang()
if hicache is None:
    pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23; see docs/sglang.md)",
                allow_module_level=True)

from kvstrata.integrations.sglang import KvstrataHiCacheStorage  # noqa: E402

pytestmark = pytest.mark.kvstrata_only


@pytest.fixture(scope="module")
def srv(module_make_server):
    return module_make_server()


@pytest.fixture
def r(srv):
    client = srv.client()
    client.flushall()
    yield client
    client.close()


def backend(srv, pool=None, **overrides):
    extra = {"url": f"redis://{srv.host}:{srv.port}", "interface_v1": 1, **overrides.pop("extra", {})}
    b = KvstrataHiCacheStorage(storage_config(hicache, extra_config=extra, **overrides), {})
    if pool is not None:
        b.register_mem_pool_host(pool)
    return b


HASHES = [f"{i:064x}" for i in range(1, 9)]


@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct"])
def test_mha_pages_round_trip_through_the_host_pool(r, srv, layout):
    src = MHAHostPool(layout=layout, seed=1)
    dst = MHAHostPool(layout=layout, seed=2)
    writer, reader = backend(srv, src), backend(srv, dst)
    assert writer.batch_set_v1(HASHES[:4], page_indices([0, 1, 2, 3], 4)) == [True] * 4
    assert r.dbsize() == 8  # K and V per page
    assert reader.batch_exists(HASHES[:6]) == 4
    # Read them into other slots of another pool.
    assert reader.batch_get_v1(HASHES[:4], page_indices([9, 7, 5, 11], 4)) == [True] * 4
    for s, d in zip([0, 1, 2, 3], [9, 7, 5, 11], strict=True):
        assert dst.page_bytes(d * 4) == src.page_bytes(s * 4)
    writer.close()
    reader.close()


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_mla_pages_round_trip(r, srv, layout):
    src, dst = MLAHostPool(layout=layout, seed=3), MLAHostPool(layout=layout, seed=4)
    writer = backend(srv, src, is_mla_model=True)
    reader = backend(srv, dst, is_mla_model=True, tp_rank=1, tp_size=2)  # MLA: one object for all ranks
    assert writer.batch_set_v1(HASHES[:3], page_indices([4, 5, 6], 4)) == [True] * 3
    assert r.dbsize() == 3
    assert reader.batch_exists(HASHES[:3]) == 3
    assert reader.batch_get_v1(HASHES[:3], page_indices([0, 1, 2], 4)) == [True] * 3
    for s, d in zip([4, 5, 6], [0, 1, 2], strict=True):
        assert dst.page_bytes(d * 4) == src.page_bytes(s * 4)


def test_tp_ranks_store_their_own_shards(r, srv):
    a, b = MHAHostPool(seed=5), MHAHostPool(seed=6)
    rank0, rank1 = backend(srv, a, tp_rank=0, tp_size=2), backend(srv, b, tp_rank=1, tp_size=2)
    assert rank0.batch_set_v1(HASHES[:2], page_indices([0, 1], 4)) == [True, True]
    assert rank1.batch_exists(HASHES[:2]) == 0
    assert rank1.batch_set_v1(HASHES[:2], page_indices([0, 1], 4)) == [True, True]
    assert r.dbsize() == 8
    assert r.get(rank0.object_keys(HASHES[0])[0]) != r.get(rank1.object_keys(HASHES[0])[0])


def test_hit_length_counts_consecutive_pages_from_the_start(r, srv):
    pool = MHAHostPool()
    b = backend(srv, pool)
    assert b.batch_exists(HASHES) == 0
    assert b.batch_set_v1([HASHES[0], HASHES[1], HASHES[3]], page_indices([0, 1, 3], 4)) == [True] * 3
    assert b.batch_exists(HASHES[:4]) == 2  # page 2 missing: 3 does not count
    assert b.exists(HASHES[3]) and not b.exists(HASHES[2])
    assert b.batch_exists([]) == 0


@pytest.mark.parametrize("missing", ["k", "v"])
def test_a_page_with_one_object_missing_is_a_miss_never_half_a_page(r, srv, missing):
    src = MHAHostPool(seed=7)
    b = backend(srv, src)
    assert b.batch_set_v1(HASHES[:4], page_indices([0, 1, 2, 3], 4)) == [True] * 4
    k_key, v_key = b.object_keys(HASHES[2])
    assert r.delete(k_key if missing == "k" else v_key) == 1  # e.g. evicted alone
    assert b.batch_exists(HASHES[:4]) == 2
    dst = MHAHostPool(seed=8)
    reader = backend(srv, dst)
    results = reader.batch_get_v1(HASHES[:4], page_indices([0, 1, 2, 3], 4))
    assert results[:3] == [True, True, False]
    # What SGLang does with the result: the hit is the leading run of True.
    hit = results.index(False)
    assert hit == 2
    for p in range(hit):
        assert dst.page_bytes(p * 4) == src.page_bytes(p * 4)
    assert reader.get_stats().kvstrata["get_partial_pages"] == 1
    # The tensor interface says the same.
    flat = reader.get(HASHES[2], src.get_dummy_flat_data_page())
    assert flat is None
    # Writing the page again restores both objects (the present one is not trusted alone).
    assert b.batch_set_v1([HASHES[2]], page_indices([2], 4)) == [True]
    assert b.batch_exists(HASHES[:4]) == 4


def test_an_object_of_the_wrong_size_is_a_miss(r, srv):
    small = MHAHostPool(head_dim=4)
    big = MHAHostPool(head_dim=8)
    backend(srv, small).batch_set_v1(HASHES[:1], page_indices([0], 4))
    reader = backend(srv, big)
    assert reader.batch_get_v1(HASHES[:1], page_indices([0], 4)) == [False]
    # The connection is still in step: a following read works.
    backend(srv, big, extra={"key_prefix": "other:"}).batch_set_v1(HASHES[1:2], page_indices([1], 4))
    other = backend(srv, big, extra={"key_prefix": "other:"})
    assert other.batch_get_v1(HASHES[1:2], page_indices([2], 4)) == [True]


def test_tensor_interface_and_zero_copy_share_objects(r, srv):
    pool = MHAHostPool(seed=9)
    b = backend(srv, pool)
    pages = [pool.get_data_page(p * 4) for p in range(3)]
    assert b.batch_set(HASHES[:3], pages) is True
    assert b.batch_exists(HASHES[:3]) == 3
    # Read back with the zero-copy path into another pool.
    dst = MHAHostPool(seed=10)
    reader = backend(srv, dst)
    assert reader.batch_get_v1(HASHES[:3], page_indices([3, 4, 5], 4)) == [True] * 3
    for p in range(3):
        assert dst.page_bytes((p + 3) * 4) == pool.page_bytes(p * 4)
    # And the tensor path reads what the zero-copy path wrote.
    assert reader.batch_set_v1(HASHES[5:6], page_indices([6], 4)) == [True]
    out = b.batch_get(HASHES[5:7], [pool.get_dummy_flat_data_page() for _ in range(2)])
    assert out[1] is None
    assert out[0].view(torch.uint8).numpy().tobytes() == dst.page_bytes(6 * 4)
    # Single-page calls, as SGLang's generic path makes them.
    assert b.set(HASHES[7], pool.get_data_page(10 * 4)) is True
    got = b.get(HASHES[7], pool.get_dummy_flat_data_page())
    assert torch.equal(got, pool.get_data_page(10 * 4))
    assert b.get(HASHES[6], pool.get_dummy_flat_data_page()) is None


def test_existing_pages_are_not_rewritten(r, srv):
    pool = MHAHostPool()
    b = backend(srv, pool)
    assert b.batch_set_v1(HASHES[:2], page_indices([0, 1], 4)) == [True, True]
    key = b.object_keys(HASHES[0])[0]
    version = r.execute_command("TAIR.KV.VERSION", key)
    assert b.batch_set_v1(HASHES[:3], page_indices([0, 1, 2], 4)) == [True] * 3
    assert r.execute_command("TAIR.KV.VERSION", key) == version
    stats = b.get_stats()
    assert stats.kvstrata["set_skipped_pages"] == 2
    assert stats.backup_pgs == [2, 3]


def test_large_pages(r, srv):
    """Pages of a few MiB: values span many receive buffers and several vectored writes."""
    src = MHAHostPool(size=32, page_size=16, layer_num=8, head_num=8, head_dim=128, dtype=torch.float16)
    dst = MHAHostPool(size=32, page_size=16, layer_num=8, head_num=8, head_dim=128, dtype=torch.float16, seed=1)
    b, reader = backend(srv, src), backend(srv, dst)
    assert b.batch_set_v1(HASHES[:2], page_indices([0, 1], 16)) == [True, True]
    assert r.strlen(b.object_keys(HASHES[0])[0]) == 16 * 8 * 8 * 128 * 2
    assert reader.batch_get_v1(HASHES[:2], page_indices([1, 0], 16)) == [True, True]
    assert dst.page_bytes(16) == src.page_bytes(0) and dst.page_bytes(0) == src.page_bytes(16)
    layer_src = MHAHostPool(layout="layer_first", size=32, page_size=16, layer_num=8, head_num=8, head_dim=128,
                            dtype=torch.float16, seed=3)
    lb = backend(srv, layer_src, extra={"key_prefix": "lf:"})
    assert lb.batch_set_v1(HASHES[:2], page_indices([0, 1], 16)) == [True, True]
    layer_dst = MHAHostPool(layout="layer_first", size=32, page_size=16, layer_num=8, head_num=8, head_dim=128,
                            dtype=torch.float16, seed=4)
    assert backend(srv, layer_dst, extra={"key_prefix": "lf:"}).batch_get_v1(
        HASHES[:2], page_indices([0, 1], 16)) == [True, True]
    assert torch.equal(layer_dst.kv_buffer, layer_src.kv_buffer)


def test_clear_deletes_only_this_namespace(r, srv):
    pool = MHAHostPool()
    b = backend(srv, pool)
    other_model = backend(srv, pool, model_name="other/model")
    b.batch_set_v1(HASHES[:3], page_indices([0, 1, 2], 4))
    other_model.batch_set_v1(HASHES[:1], page_indices([0], 4))
    r.set("kvs:unrelated", b"x")
    assert b.clear() is True
    assert b.batch_exists(HASHES[:3]) == 0
    assert other_model.batch_exists(HASHES[:1]) == 1
    assert r.get("kvs:unrelated") == b"x"


def test_password_in_url(make_server):
    srv = make_server({"requirepass": "s3cret"})
    pool = MHAHostPool()
    b = KvstrataHiCacheStorage(storage_config(hicache, extra_config={
        "url": f"redis://:s3cret@{srv.host}:{srv.port}"}), {})
    b.register_mem_pool_host(pool)
    assert b.batch_set_v1(HASHES[:1], page_indices([0], 4)) == [True]
    with pytest.raises(Exception, match="NOAUTH|[Aa]uth"):
        KvstrataHiCacheStorage(storage_config(hicache, extra_config={"url": f"redis://{srv.host}:{srv.port}"}), {})


def test_acl_username_and_key_prefix(make_server):
    srv = make_server({"requirepass": "admin"})
    admin = srv.client(password="admin")
    admin.execute_command("ACL", "SETUSER", "sgl", "on", ">sglpw", "~hicache:*", "+@all", "-@dangerous")
    admin.execute_command("ACL", "SETUSER", "other", "on", ">otherpw", "~other:*", "+@all", "-@dangerous")
    admin.close()
    pool = MHAHostPool()
    url = f"redis://{srv.host}:{srv.port}"
    b = KvstrataHiCacheStorage(storage_config(hicache, extra_config={
        "url": url, "username": "sgl", "password": "sglpw", "interface_v1": 1}), {})
    b.register_mem_pool_host(pool)
    assert b.batch_set_v1(HASHES[:2], page_indices([0, 1], 4)) == [True, True]
    assert b.batch_exists(HASHES[:2]) == 2
    # A user whose keys are elsewhere can neither write nor find this backend's pages.
    o = KvstrataHiCacheStorage(storage_config(hicache, extra_config={
        "url": f"redis://other:otherpw@{srv.host}:{srv.port}", "interface_v1": 1}), {})
    o.register_mem_pool_host(pool)
    assert o.batch_set_v1(HASHES[2:3], page_indices([2], 4)) == [False]
    assert o.batch_exists(HASHES[:2]) == 0


def test_server_restart_is_a_miss_then_reconnects(make_server):
    srv = make_server()
    pool = MHAHostPool()
    b = backend(srv, pool)
    assert b.batch_set_v1(HASHES[:1], page_indices([0], 4)) == [True]
    port = srv.port
    srv._reap()  # stop the server
    assert b.batch_exists(HASHES[:1]) == 0
    assert b.batch_get_v1(HASHES[:1], page_indices([1], 4)) == [False]
    assert b.get_stats().kvstrata["errors"] >= 1
    srv.port = port
    srv._spawn()
    assert srv._wait_ready(20)
    assert b.batch_set_v1(HASHES[:1], page_indices([0], 4)) == [True]
    assert b.batch_exists(HASHES[:1]) == 1


def test_oom_refusal_is_a_failed_write(make_server):
    srv = make_server({"maxmemory": "2mb", "maxmemory-policy": "noeviction"})
    pool = MHAHostPool(size=64, page_size=16, layer_num=8, head_num=8, head_dim=64, dtype=torch.float16)
    b = backend(srv, pool)
    # Pages of 2 x 128 KiB: four fit in the 2 MB budget.
    assert b.batch_set_v1(HASHES[:4], page_indices([0, 1, 2, 3], 16)) == [True] * 4
    big = MHAHostPool(size=64, page_size=64, layer_num=8, head_num=8, head_dim=64, dtype=torch.float16)
    b2 = backend(srv, big, extra={"key_prefix": "big:"})
    assert b2.batch_set_v1(HASHES[:1], page_indices([0], 64)) == [False]  # 2 x 512 KiB: over the budget
    assert b2.batch_exists(HASHES[:1]) == 0
    assert b.batch_exists(HASHES[:1]) == 1


def test_pages_demoted_to_the_ssd_tier_come_back(make_server, tmp_path):
    """L3 as deployed: a small DRAM tier, pages demoted to the SSD tier, then read back into the host pool."""
    srv = make_server({"dram-size": "4mb", "essd-path": str(tmp_path / "essd")})
    src = MHAHostPool(size=64 * 16, page_size=16, layer_num=8, head_num=8, head_dim=64, dtype=torch.float16)
    b = backend(srv, src)
    hashes = [f"{i:064x}" for i in range(40)]  # 40 pages of 2 x 128 KiB: 10 MiB, over the DRAM budget
    assert b.batch_set_v1(hashes, page_indices(range(40), 16)) == [True] * 40
    client = srv.client()
    tiers = {client.execute_command("TAIR.KV.TIER", k) for h in hashes[:4] for k in b.object_keys(h)}
    assert b"ssd" in tiers
    client.close()
    dst = MHAHostPool(size=64 * 16, page_size=16, layer_num=8, head_num=8, head_dim=64, dtype=torch.float16, seed=5)
    reader = backend(srv, dst)
    assert reader.batch_exists(hashes) == 40
    assert reader.batch_get_v1(hashes, page_indices(range(40), 16)) == [True] * 40
    assert torch.equal(dst.kv_buffer[:, : 40 * 16], src.kv_buffer[:, : 40 * 16])


def test_prefetch_and_backup_threads_share_one_backend(r, srv):
    """SGLang calls one backend from its prefetch and backup threads at once: each gets its own connection."""
    import threading

    src = MHAHostPool(size=256, seed=11)
    dst = MHAHostPool(size=256, seed=12)
    b = backend(srv, src)
    b.register_mem_pool_host(src)
    hashes = [f"{i:064x}" for i in range(64)]
    assert all(b.batch_set_v1(hashes[:32], page_indices(range(32), 4)))
    reader = backend(srv, dst)
    errors = []

    def backup():
        try:
            for start in range(32, 64, 4):
                assert all(b.batch_set_v1(hashes[start:start + 4], page_indices(range(start, start + 4), 4)))
        except Exception as exc:  # reported below
            errors.append(exc)

    def prefetch():
        try:
            for _ in range(8):
                assert reader.batch_get_v1(hashes[:32], page_indices(range(32), 4)) == [True] * 32
                assert all(b.batch_exists(hashes[:32]) == 32 for _ in range(2))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=backup), threading.Thread(target=prefetch), threading.Thread(target=prefetch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert b.batch_exists(hashes) == 64
    assert torch.equal(dst.kv_buffer[:, :128], src.kv_buffer[:, :128])


# -- layouts: differently shaped writers never share objects; a page of another length is a miss, then rewritten --

@pytest.mark.parametrize("other", [
    dict(head_num=4), dict(head_dim=16), dict(dtype=torch.float16), dict(page_size=8, size=128),
    dict(layout="layer_first"), dict(tp_size=2),
])
def test_writers_of_different_layouts_never_collide(r, srv, other):
    tp_size = other.pop("tp_size", 1)
    a_pool, b_pool = MHAHostPool(seed=20), MHAHostPool(seed=21, **other)
    a, b = backend(srv, a_pool), backend(srv, b_pool, tp_size=tp_size)
    assert a.object_keys(HASHES[0]) != b.object_keys(HASHES[0])
    ps_b = b_pool.page_size
    assert a.batch_set_v1(HASHES[:2], page_indices([0, 1], 4)) == [True, True]
    assert b.batch_exists(HASHES[:2]) == 0  # a's pages are not b's
    assert b.batch_set_v1(HASHES[:2], page_indices([0, 1], ps_b)) == [True, True]
    assert b.get_stats().kvstrata["set_bytes"] > 0 and r.dbsize() == 8
    a_dst, b_dst = MHAHostPool(seed=22), MHAHostPool(seed=23, **other)
    assert backend(srv, a_dst).batch_get_v1(HASHES[:2], page_indices([2, 3], 4)) == [True, True]
    assert backend(srv, b_dst, tp_size=tp_size).batch_get_v1(HASHES[:2], page_indices([2, 3], ps_b)) == [True] * 2
    for s, d in ((0, 2), (1, 3)):
        assert a_dst.page_bytes(d * 4) == a_pool.page_bytes(s * 4)
        assert b_dst.page_bytes(d * ps_b) == b_pool.page_bytes(s * ps_b)


def test_a_page_of_another_length_is_a_miss_and_the_next_set_rewrites_it(r, srv):
    pool = MHAHostPool(seed=24)
    b = backend(srv, pool)
    assert b.batch_set_v1(HASHES[:3], page_indices([0, 1, 2], 4)) == [True] * 3
    k_key = b.object_keys(HASHES[1])[0]
    r.set(k_key, b"x" * 100)  # same key, another length: a stale or foreign writer
    assert b.batch_exists(HASHES[:3]) == 1
    dst = MHAHostPool(seed=25)
    reader = backend(srv, dst)
    assert reader.batch_get_v1(HASHES[:3], page_indices([0, 1, 2], 4))[:2] == [True, False]
    before = b.get_stats().kvstrata
    assert b.batch_set_v1(HASHES[:3], page_indices([0, 1, 2], 4)) == [True] * 3
    after = b.get_stats().kvstrata
    assert after["set_skipped_pages"] - before["set_skipped_pages"] == 2  # pages 0 and 2 were right
    assert after["set_bytes"] - before["set_bytes"] == 2 * r.strlen(b.object_keys(HASHES[0])[0])
    assert b.batch_exists(HASHES[:3]) == 3
    assert reader.batch_get_v1(HASHES[1:2], page_indices([1], 4)) == [True]
    assert dst.page_bytes(4) == pool.page_bytes(4)


# -- hybrid models: batch_exists_v2 / batch_get_v2 / batch_set_v2 with SGLang's real PoolTransfer types ------------

def hybrid_backend(srv, kv, mamba, indexer, **overrides):
    b = backend(srv, kv, **overrides)
    b.register_mem_host_pool_v2(mamba, hicache.PoolName.MAMBA)
    b.register_mem_host_pool_v2(indexer, hicache.PoolName.INDEXER)
    return b


def transfers(keys, kv_pages, mamba_slot, indexer_pages, page=4):
    P = hicache.PoolTransfer
    return [P(name=hicache.PoolName.KV, keys=keys, host_indices=page_indices(kv_pages, page)),
            P(name=hicache.PoolName.MAMBA, keys=keys[-1:], host_indices=torch.tensor([mamba_slot]),
              hit_policy=hicache.PoolHitPolicy.TRAILING_PAGES),
            P(name=hicache.PoolName.INDEXER, keys=keys, host_indices=page_indices(indexer_pages, 2),
              hit_policy=hicache.PoolHitPolicy.ALL_PAGES)]


def test_hybrid_pools_round_trip_and_gate_the_hit(r, srv):
    from sglang_support import StateHostPool

    kv, mamba, indexer = MHAHostPool(seed=30), StateHostPool(seed=31), StateHostPool(size=32, page_size=2, seed=32)
    b = hybrid_backend(srv, kv, mamba, indexer)
    keys = HASHES[:4]
    written = b.batch_set_v2(transfers(keys, [0, 1, 2, 3], 5, [0, 1, 2, 3]))
    assert written == {"kv": [True] * 4, "mamba": [True], "indexer": [True] * 4}
    probe = transfers(keys, [0, 1, 2, 3], 5, [0, 1, 2, 3])[1:]
    res = b.batch_exists_v2(keys, probe)
    assert isinstance(res, hicache.PoolTransferResult)
    assert res.kv_hit_pages == 4 and res.restorable_prefix_pages == [4]  # the state exists only after page 4
    assert res.extra_pool_hit_pages == {"kv": 4, "mamba": 4, "indexer": 4}
    # Into other slots of other pools.
    kv2, mamba2, indexer2 = MHAHostPool(seed=33), StateHostPool(seed=34), StateHostPool(size=32, page_size=2, seed=35)
    reader = hybrid_backend(srv, kv2, mamba2, indexer2)
    got = reader.batch_get_v2(transfers(keys, [4, 5, 6, 7], 9, [4, 5, 6, 7]))
    assert got == {"kv": [True] * 4, "mamba": [True], "indexer": [True] * 4}
    for p in range(4):
        assert kv2.page_bytes((p + 4) * 4) == kv.page_bytes(p * 4)
        assert indexer2.page_bytes((p + 4) * 2) == indexer.page_bytes(p * 2)
    assert mamba2.page_bytes(9) == mamba.page_bytes(5)
    # An indexer page missing (ALL_PAGES) cuts the prefix before it; with no state at that stop point, nothing.
    r.delete(b._pool_keys("indexer").key(keys[2]))
    res = b.batch_exists_v2(keys, probe)
    assert res.extra_pool_hit_pages["indexer"] == 2 and res.kv_hit_pages == 0 and res.restorable_prefix_pages == []
    # The state stored at page 2 too: that stop point works.
    b.batch_set_v2([hicache.PoolTransfer(name=hicache.PoolName.MAMBA, keys=[keys[1]], host_indices=torch.tensor([6]),
                                         hit_policy=hicache.PoolHitPolicy.TRAILING_PAGES)])
    res = b.batch_exists_v2(keys, probe)
    assert res.kv_hit_pages == 2 and res.restorable_prefix_pages == [2]
    # Without extra pools the v2 hit is the KV hit.
    assert b.batch_exists_v2(keys, []).kv_hit_pages == 4


def test_extra_pools_have_their_own_layout_keys(r, srv):
    from sglang_support import StateHostPool

    kv = MHAHostPool(seed=36)
    small = hybrid_backend(srv, kv, StateHostPool(slot_elems=40), StateHostPool(size=32, page_size=2))
    big = hybrid_backend(srv, kv, StateHostPool(slot_elems=80), StateHostPool(size=32, page_size=2))
    assert small._pool_keys("mamba").key(HASHES[0]) != big._pool_keys("mamba").key(HASHES[0])
    assert small._pool_keys("indexer").key(HASHES[0]) == big._pool_keys("indexer").key(HASHES[0])
    assert big.batch_get_v2([hicache.PoolTransfer(name=hicache.PoolName.MAMBA, keys=HASHES[:1],
                                                  host_indices=torch.tensor([0]))]) == {"mamba": [False]}
    with pytest.raises(ValueError, match="not registered"):
        backend(srv, kv).batch_get_v2([hicache.PoolTransfer(name=hicache.PoolName.SWA, keys=HASHES[:1],
                                                            host_indices=torch.tensor([0]))])


def _calls(client, name: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def test_reads_send_tair_kv_mget_to_kvstrata(make_server):
    """As the SDK reads: TAIR.KV.MGET (the server's consistency level and ACL rules), never plain MGET. A user
    refused MGET still reads every page."""
    srv = make_server({"requirepass": "admin"})
    admin = srv.client(password="admin")
    admin.execute_command("ACL", "SETUSER", "nomget", "on", ">pw", "~hicache:*", "+@all", "-mget")
    src, dst = MHAHostPool(seed=40), MHAHostPool(seed=41)
    extra = {"url": f"redis://nomget:pw@{srv.host}:{srv.port}", "interface_v1": 1}
    writer = KvstrataHiCacheStorage(storage_config(hicache, extra_config=extra), {})
    reader = KvstrataHiCacheStorage(storage_config(hicache, extra_config=extra), {})
    writer.register_mem_pool_host(src)
    reader.register_mem_pool_host(dst)
    try:
        assert writer.batch_set_v1(HASHES[:3], page_indices([0, 1, 2], 4)) == [True] * 3
        assert reader.batch_get_v1(HASHES[:3], page_indices([5, 6, 7], 4)) == [True] * 3
        for s, d in zip([0, 1, 2], [5, 6, 7], strict=True):
            assert dst.page_bytes(d * 4) == src.page_bytes(s * 4)
        flat = [dst.get_dummy_flat_data_page()]
        assert reader.batch_get(HASHES[:1], flat)[0] is not None
        assert reader.counters.errors == 0
    finally:
        writer.close()
        reader.close()
    assert _calls(admin, "tair.kv.mget") >= 2 and _calls(admin, "mget") == 0
    admin.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_reads_send_plain_mget_to_redis():
    from tests.conftest import ServerProc

    srv = ServerProc({}, target="redis").start()
    try:
        src, dst = MHAHostPool(seed=42), MHAHostPool(seed=43)
        writer, reader = backend(srv, src), backend(srv, dst)
        assert writer.batch_set_v1(HASHES[:2], page_indices([0, 1], 4)) == [True] * 2
        assert reader.batch_get_v1(HASHES[:2], page_indices([3, 4], 4)) == [True] * 2
        assert dst.page_bytes(3 * 4) == src.page_bytes(0)
        writer.close()
        reader.close()
        admin = srv.client()
        assert _calls(admin, "mget") >= 1 and _calls(admin, "tair.kv.mget") == 0
        admin.close()
    finally:
        srv.stop()


def test_pages_over_tls(make_server, tmp_path):
    """``rediss://`` with the SDK's TLS options: the same transport, encrypted; a wrong CA is a failed backend
    start, not a silent plain connection."""
    import ssl
    from urllib.parse import quote

    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID
    from tests.integration.test_tls import _cert, _write

    ca_key = ec.generate_private_key(ec.SECP256R1())
    _write(tmp_path / "ca", _cert("sgl CA", ca_key, "sgl CA", ca_key, ca=True), ca_key)
    for name, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        _write(tmp_path / name, _cert(name, ca_key, "sgl CA", key, usage=usage), key)
    from kvstrata.bench.procs import free_port

    srv = make_server({"tls-port": str(free_port()), "tls-cert-file": tmp_path / "server.crt",
                       "tls-key-file": tmp_path / "server.key", "tls-ca-cert-file": tmp_path / "ca.crt"})
    q = "&".join(f"{k}={quote(str(tmp_path / f))}" for k, f in (("ssl_ca_certs", "ca.crt"),
                                                                 ("ssl_certfile", "client.crt"),
                                                                 ("ssl_keyfile", "client.key")))
    url = f"rediss://127.0.0.1:{srv.config['tls-port']}/?{q}"
    src, dst = MHAHostPool(seed=44), MHAHostPool(seed=45)
    writer = KvstrataHiCacheStorage(storage_config(hicache, extra_config={"url": url, "interface_v1": 1}), {})
    reader = KvstrataHiCacheStorage(storage_config(hicache, extra_config={"url": url, "interface_v1": 1}), {})
    writer.register_mem_pool_host(src)
    reader.register_mem_pool_host(dst)
    try:
        assert writer.batch_set_v1(HASHES[:2], page_indices([0, 1], 4)) == [True] * 2
        assert reader.batch_get_v1(HASHES[:2], page_indices([2, 3], 4)) == [True] * 2
        assert dst.page_bytes(2 * 4) == src.page_bytes(0) and dst.page_bytes(3 * 4) == src.page_bytes(4)
        assert isinstance(reader._connection().sock, ssl.SSLSocket)
    finally:
        writer.close()
        reader.close()
    assert srv.client().dbsize() == 4
    bad = url.replace(quote(str(tmp_path / "ca.crt")), quote(str(tmp_path / "server.crt")))
    with pytest.raises(ssl.SSLError):
        KvstrataHiCacheStorage(storage_config(hicache, extra_config={"url": bad}), {})
