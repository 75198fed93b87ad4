"""``kvstrata.engine.copyalong``: a value's copy shared by the caller and a helper thread, hashed in order by the
caller (pulls built on it: test_pull.py). Every piece copied exactly once, hashed in order once landed, errors
raised in piece order after the helper has stopped, and a helper that never starts costs nothing but its
absence."""

from __future__ import annotations

import threading

import pytest

from kvstrata.engine.copyalong import copy_along


def test_every_piece_is_copied_once_and_hashed_in_order_after_it_landed(helper) -> None:
    copied: list[tuple[int, int]] = []  # (piece, thread)
    landed: set[int] = set()
    hashed: list[int] = []
    lock = threading.Lock()

    def copy(i: int) -> None:
        with lock:
            copied.append((i, threading.get_ident()))
            landed.add(i)

    def hash_piece(i: int) -> None:
        assert i in landed
        hashed.append(i)

    copy_along(500, copy, hash_piece, helper)
    assert sorted(i for i, _ in copied) == list(range(500)) and hashed == list(range(500))


def test_the_first_failed_piece_is_raised_once_the_helper_has_stopped(helper) -> None:
    finished: list[int] = []

    def copy(i: int) -> None:
        if i in (7, 300):
            raise OSError(f"piece {i} could not be read")
        finished.append(i)

    with pytest.raises(OSError, match="piece 7 "):  # in piece order, whichever thread failed first
        copy_along(400, copy, lambda i: None, helper)
    count = len(finished)
    assert helper.submit(lambda: None).result(timeout=10) is None  # the helper is free again
    assert len(finished) == count  # and nothing copies any more


def test_after_a_failed_piece_no_other_piece_starts(helper) -> None:
    release = threading.Event()
    busy = helper.submit(release.wait, 10)  # only the caller copies: the order is known
    finished: list[int] = []

    def copy(i: int) -> None:
        if i == 7:
            raise OSError("piece 7 could not be read")
        finished.append(i)

    try:
        with pytest.raises(OSError, match="piece 7"):
            copy_along(400, copy, lambda i: None, helper)
        assert finished == list(range(7)) and not busy.done()
    finally:
        release.set()


def test_a_helper_that_never_starts_leaves_every_piece_to_the_caller(helper) -> None:
    release = threading.Event()
    busy = helper.submit(release.wait, 10)
    try:
        threads: set[int] = set()
        copy_along(50, lambda i: threads.add(threading.get_ident()), lambda i: None, helper)
        assert threads == {threading.get_ident()} and not busy.done()
    finally:
        release.set()
