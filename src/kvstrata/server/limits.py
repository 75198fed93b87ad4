"""Startup checks on what the configuration asks of the machine: file descriptors, persistence, a DRAM budget.

As Redis does, ``maxclients`` is fitted to the open-file limit (raising the soft limit towards the hard one
first, then lowering maxclients, with a log line), and a configuration that asks for persistence the server
cannot give is refused instead of silently losing data on the next restart.
"""

from __future__ import annotations

import logging
import resource

from kvstrata.config import Config

log = logging.getLogger("kvstrata.server")

# Descriptors kept for everything that is not a client: listening sockets, the HTTP endpoint, LMDB, logs.
RESERVED_FDS = 32


def fit_maxclients(config: Config) -> int:
    """Raise the open-file limit to fit maxclients if allowed, else lower maxclients; returns maxclients."""
    wanted = int(config.get("maxclients"))
    need = wanted + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit to %d: %s", target, exc)
    if soft >= need:
        log.info("raised the open files limit to %d for maxclients %d", soft, wanted)
        return wanted
    fitted = max(int(soft) - RESERVED_FDS, 1)
    log.warning("you requested maxclients of %d requiring at least %d max file descriptors; the open files "
                "limit is %d, so maxclients has been reduced to %d. If you need higher maxclients increase "
                "'ulimit -n'.", wanted, need, soft, fitted)
    config.values["maxclients"] = fitted
    return fitted


def save_problem(save: str, ssd: bool) -> str | None:
    """Why save points cannot be kept (none without the SSD tier), or None."""
    if str(save).strip() and not ssd:
        return ("save asks for persistence, but kvstrata persists only through its SSD tier: add --essd-path DIR "
                "(data there survives restarts), or give save \"\" to run in memory only")
    return None


def check_persistence(config: Config) -> None:
    """Refuse persistence options without the SSD tier; say so when nothing will survive a restart."""
    if not config.get("essd-path"):
        problem = save_problem(config.get("save"), False)
        if problem is not None:
            raise ValueError("--" + problem)
        log.warning("running in memory only (no --essd-path): nothing stored survives a restart of the server")


def empty_budget(budget: int, ssd: bool) -> str | None:
    """Why a DRAM budget cannot be used, or None. 0 with an SSD tier is an SSD-only server (every value goes
    straight to it); without one it could store nothing (a pool tier takes only what DRAM demotes), and is
    refused: Redis users write
    ``maxmemory 0`` for "no limit", which kvstrata does not have (the budget is a promise), and at run time it
    would evict the whole data set."""
    if budget == 0 and not ssd:
        return ("a DRAM budget of 0 without an SSD tier could store nothing (kvstrata has no unlimited "
                "budget: Redis's maxmemory 0 does not apply); give a size, or add --essd-path for an SSD-only server")
    return None
