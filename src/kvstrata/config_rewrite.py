"""CONFIG REWRITE: the server's configuration file written again with what CONFIG SET changed since it started.

The file keeps the parameters it had (their values as the running server has them now) and gains those changed
at run time; flags and the environment stay the operator's per-run choice and are not written. Values are written
as they were given (a parsed value does not always read back: an octal mode, a size with units), as TOML: a
string is a basic string with every character TOML forbids raw escaped, so that no value can end its line and
add a parameter of its own. The file is replaced whole, atomically (a new file beside it, fsynced, renamed over
it, with the old one's permissions): a crash leaves the old file or the new one, never half of one. Comments of
the old file are not kept (it starts with a line saying so).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Any

from kvstrata.config import PARAMS, Config


def toml_value(value: Any) -> str:
    """``value`` as a TOML value: booleans, integers and floats as themselves, anything else as a string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    out = ['"']
    for ch in str(value):
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def render(cfg: Config) -> str:
    """The file's text: one ``name = value`` line per persisted parameter, in the documented order."""
    lines = [f"# Written by CONFIG REWRITE on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; comments of the previous "
             "file are not kept.", ""]
    lines += [f"{p.name} = {toml_value(cfg.persisted[p.name])}" for p in PARAMS if p.name in cfg.persisted]
    return "\n".join(lines) + "\n"


def rewrite(cfg: Config, path: str) -> None:
    """Replace the file at ``path`` with ``render(cfg)``, atomically; OSError when it cannot."""
    text = render(cfg).encode()
    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=".kvstrata-config-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dirfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
