"""Startup checks (kvstrata.server.limits): maxclients fitted to the open-file limit, persistence refused
without the SSD tier, and the memory-only warning; through ``kvstrata serve`` for the user-visible texts."""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from kvstrata.config import build_config
from kvstrata.server.limits import RESERVED_FDS, check_persistence, fit_maxclients

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _config(**flags):
    return build_config(flags, {}, None)


def test_save_without_the_ssd_tier_is_refused():
    with pytest.raises(ValueError, match="--essd-path"):
        check_persistence(_config(save="900 1"))


def test_empty_save_runs_in_memory_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="kvstrata.server"):
        check_persistence(_config(save=""))
    assert "nothing stored survives a restart" in caplog.text


def test_save_with_the_ssd_tier_is_accepted(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="kvstrata.server"):
        check_persistence(_config(save="900 1", **{"essd-path": str(tmp_path)}))
    assert "survives" not in caplog.text


def test_maxclients_within_the_limit_is_kept():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(1, min(soft, 10_000) - RESERVED_FDS - 1)
    cfg = _config(maxclients=str(wanted))
    assert fit_maxclients(cfg) == wanted


def _serve(args: list[str], limit: int | None = None) -> subprocess.CompletedProcess:
    def lower() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    env = dict(os.environ, PYTHONPATH=SRC)
    # --port 1 with a bad bind fails right after the startup checks have logged, so nothing keeps running.
    return subprocess.run([sys.executable, "-m", "kvstrata", "serve", "--http-port", "0", *args], env=env,
                          capture_output=True, text=True, timeout=60, preexec_fn=lower, check=False)


def test_serve_refuses_save_without_essd_path():
    proc = _serve(["--port", "0", "--save", "900 1"])
    assert proc.returncode == 2
    assert "--essd-path" in proc.stderr


def test_serve_lowers_maxclients_above_the_fd_limit_with_a_log_line():
    proc = _serve(["--port", "0", "--bind", "256.0.0.1", "--maxclients", "5000"], limit=256)
    assert f"maxclients has been reduced to {256 - RESERVED_FDS}" in proc.stderr
    assert "nothing stored survives a restart" in proc.stderr
