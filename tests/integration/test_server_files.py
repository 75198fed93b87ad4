"""The files an operator points the server at, as Redis: ``pidfile`` (the process id while it runs, removed when
it stops) and ``logfile`` (the log there instead of standard error; kvstrata also opens it again when logrotate
moved it). Run against both targets; the rotation is kvstrata's."""

from __future__ import annotations

import contextlib

import pytest

from integration.polling import wait_for


def test_pidfile_and_logfile(make_server, tmp_path):
    pid, log = tmp_path / "server.pid", tmp_path / "server.log"
    srv = make_server({"pidfile": str(pid), "logfile": str(log)})
    assert int(pid.read_text()) == srv.proc.pid
    r = srv.client()
    assert r.config_get("pidfile") == {"pidfile": str(pid)} and r.config_get("logfile") == {"logfile": str(log)}
    wait_for(lambda: log.exists() and log.stat().st_size > 0, what="the start to be logged in the file")
    printed = [line for line in srv.log_text().splitlines() if line and not line.startswith("$ ")]
    assert printed == []  # nothing on standard output or error but the test's own command line
    srv.stop()
    assert not pid.exists()


@pytest.mark.kvstrata_only
def test_the_log_file_is_opened_again_after_logrotate_moves_it(make_server, tmp_path):
    log = tmp_path / "server.log"
    srv = make_server({"logfile": str(log)})
    wait_for(lambda: log.exists() and log.stat().st_size > 0, what="the start to be logged")
    log.rename(tmp_path / "server.log.1")
    r = srv.client()
    r.config_set("client-query-buffer-limit", "1mb")  # something that logs: a client over that limit
    raw = srv.raw()
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # it may be closed while it sends
        raw.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4000000\r\n" + b"v" * 2_000_000)
    raw.read_until_closed(timeout=10)
    wait_for(lambda: log.exists() and "query buffer" in log.read_text(), what="the new log file")
