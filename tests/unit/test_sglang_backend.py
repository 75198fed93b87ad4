"""SGLang HiCache backend without a server: the real abstract class, key mapping, page objects, URL parsing."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from sglang_support import MHAHostPool, MLAHostPool, import_sglang, page_indices, storage_config  # noqa: E402

hicache = import_sglang()
if hicache is None:
    pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23; see docs/sglang.md)",
                allow_module_level=True)

from kvstrata.integrations.sglang import KvstrataHiCacheStorage, parse_url  # noqa: E402


def make(**overrides):
    extra = {"check_server": False, **overrides.pop("extra", {})}
    return KvstrataHiCacheStorage(storage_config(hicache, extra_config=extra, **overrides), {})


def test_subclass_of_the_real_abstract_class():
    assert hicache.HiCacheStorage.__module__ == "sglang.srt.mem_cache.hicache_storage"
    assert issubclass(KvstrataHiCacheStorage, hicache.HiCacheStorage)
    assert not getattr(KvstrataHiCacheStorage, "__abstractmethods__", None)
    backend = make()
    assert isinstance(backend, hicache.HiCacheStorage)


@pytest.mark.parametrize("name", ["get", "batch_get", "set", "batch_set", "exists", "batch_exists",
                                  "batch_get_v1", "batch_set_v1", "register_mem_pool_host", "clear", "get_stats"])
def test_overrides_match_the_real_signatures(name):
    ours = inspect.signature(getattr(KvstrataHiCacheStorage, name))
    theirs = inspect.signature(getattr(hicache.HiCacheStorage, name))
    assert list(ours.parameters) == list(theirs.parameters), name
    assert getattr(KvstrataHiCacheStorage, name) is not getattr(hicache.HiCacheStorage, name)


def test_dynamic_factory_loads_and_constructs_the_backend():
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    extra = {"backend_name": "kvstrata", "module_path": "kvstrata.integrations.sglang",
             "class_name": "KvstrataHiCacheStorage", "url": "redis://127.0.0.1:1", "check_server": False}
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(hicache, extra_config=extra), None)
    assert isinstance(backend, KvstrataHiCacheStorage)
    assert backend.url == "redis://127.0.0.1:1"


def test_mha_keys_follow_mooncake_suffixes():
    b = make(tp_rank=3, tp_size=4)
    assert b.object_keys("abc") == [b"hicache:Qwen-Qwen3-0.6B_abc_3_k", b"hicache:Qwen-Qwen3-0.6B_abc_3_v"]
    b = make(tp_rank=1, tp_size=2, pp_rank=2, pp_size=4, model_name=None, extra={"key_prefix": ""})
    assert b.object_keys("abc") == [b"abc_1_2_k", b"abc_1_2_v"]


def test_mla_keys_are_one_object_shared_by_tp_ranks():
    b0 = make(is_mla_model=True, tp_rank=0, tp_size=2)
    b1 = make(is_mla_model=True, tp_rank=1, tp_size=2)
    assert b0.object_keys("h") == b1.object_keys("h") == [b"hicache:Qwen-Qwen3-0.6B_h__k"]
    b = make(is_mla_model=True, pp_rank=1, pp_size=2, extra={"extra_backend_tag": "t1"})
    assert b.object_keys("h") == [b"hicache:t1_Qwen-Qwen3-0.6B_h_1_k"]


def test_context_parallel_ranks_get_their_own_objects():
    b = make(attn_cp_rank=1, attn_cp_size=2)
    assert b.object_keys("h") == [b"hicache:Qwen-Qwen3-0.6B_h_0_cp1_2_k", b"hicache:Qwen-Qwen3-0.6B_h_0_cp1_2_v"]


@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct"])
def test_mha_page_objects_cover_the_flat_page_k_then_v(layout):
    """K object = every K segment of the page in order, V likewise; K||V equals get_data_page(flat)."""
    pool = MHAHostPool(layout=layout)
    b = make()
    b.register_mem_pool_host(pool)
    assert b.mem_pool_host is pool
    pages = b._page_objects(["p0", "p1"], page_indices([2, 5], pool.page_size))
    assert [[o.key for o in objs] for objs in pages] == [b.object_keys("p0"), b.object_keys("p1")]
    for objs, page in zip(pages, [2, 5], strict=True):
        from kvstrata.integrations.sglang import _view

        data = b"".join(bytes(_view(a, n)) for o in objs for a, n in o.segments)
        assert data == pool.page_bytes(page * pool.page_size)
        assert objs[0].nbytes == objs[1].nbytes == len(data) // 2


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_mla_page_is_one_object(layout):
    from kvstrata.integrations.sglang import _view

    pool = MLAHostPool(layout=layout)
    b = make(is_mla_model=True)
    b.register_mem_pool_host(pool)
    (objs,) = b._page_objects(["p"], page_indices([3], pool.page_size))
    assert len(objs) == 1
    assert b"".join(bytes(_view(a, n)) for a, n in objs[0].segments) == pool.page_bytes(3 * pool.page_size)


def test_flat_tensor_split_matches_zero_copy_objects():
    from kvstrata.integrations.sglang import _view

    pool = MHAHostPool()
    b = make()
    b.register_mem_pool_host(pool)
    flat = pool.get_data_page(8).contiguous()
    objs = b._tensor_objects("p", flat)
    (zc,) = b._page_objects(["p"], page_indices([2], pool.page_size))
    for a, z in zip(objs, zc, strict=True):
        assert a.key == z.key and a.nbytes == z.nbytes
        assert bytes(_view(*a.segments[0])) == b"".join(bytes(_view(*s)) for s in z.segments)


def test_unsupported_configurations_are_refused():
    with pytest.raises(NotImplementedError):
        make(should_split_heads=True, tp_lcm_size=4)


def test_parse_url():
    assert parse_url("redis://127.0.0.1:7000") == {"host": "127.0.0.1", "port": 7000, "username": None,
                                                   "password": None, "db": 0}
    assert parse_url("redis://u:p%40ss@h:1/0")["password"] == "p@ss"
    assert parse_url("redis://:pw@h")["password"] == "pw"
    assert parse_url("localhost:6380")["port"] == 6380
    with pytest.raises(ValueError):
        parse_url("http://x")
    tls = parse_url("rediss://:pw@h:6390/?ssl_cert_reqs=none")  # TLS with the SDK's options
    assert tls["port"] == 6390 and tls["ssl_context"].verify_mode == 0 and "ssl_context" not in parse_url("redis://h")


def test_get_stats_without_traffic():
    stats = make().get_stats()
    assert stats.prefetch_pgs == [] and stats.backup_pgs == []
    assert stats.kvstrata["get_pages"] == 0


def test_clear_refuses_an_empty_namespace():
    b = make(model_name=None, extra={"key_prefix": ""})
    assert b.clear() is False  # it would delete every key on the node; refused before any connection
