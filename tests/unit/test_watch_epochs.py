"""Store.watch_epochs: what WATCH compares beyond a key's version, kept only while a client watches the key."""

from __future__ import annotations

from kvstrata.engine.store import Store


def test_epochs_count_client_changes_and_go_with_the_last_watcher() -> None:
    store = Store(1 << 20)
    assert store.watch(b"k") == 0 and store.watch(b"k") == 0  # two watchers
    store.put(b"k", b"v")
    store.put(b"other", b"v")
    assert store.watch_epoch(b"k") == 1
    store.set_expire(b"k", 10**13)
    store.delete(b"k")
    assert store.watch_epoch(b"k") == 3
    assert not store.delete(b"k") and not store.set_expire(b"k", 1)
    assert store.watch_epoch(b"k") == 3  # nothing there: nothing changed, as Redis
    store.flush()
    assert store.watch_epoch(b"k") == 3  # it was not there: unchanged, as Redis
    store.put(b"k", b"v")
    store.flush()
    assert store.watch_epoch(b"k") == 5
    store.unwatch([b"k"])
    assert store.watch_epoch(b"k") == 5  # one watcher left
    store.unwatch([b"k"])
    assert store.watch_epochs == {}  # nothing kept for keys nobody watches
    store.put(b"k", b"v")
    assert store.watch_epoch(b"k") == -1
