"""Command line: ``kvstrata serve | bench NAME | top``. ``main(argv) -> int``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import logging.handlers
import os
import signal
import sys

from kvstrata import __version__
from kvstrata.config import ALIASES, PARAMS, build_config
from kvstrata.cpulist import format_cpus, parse_cpulist, pin_process

_LOGLEVELS = {"debug": logging.DEBUG, "verbose": logging.INFO, "notice": logging.INFO, "warning": logging.WARNING}
BENCHMARKS = ("small", "hitrate", "large", "ssd", "chat", "prefetch", "restore")


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvstrata serve", description="Run the kvstrata RESP server.")
    parser.add_argument("--config", metavar="FILE", help="TOML file with parameters (same names as the flags)")
    for p in PARAMS:
        names = [f"--{p.name}", *(f"--{alias}" for alias, target in ALIASES.items() if target == p.name)]
        parser.add_argument(*names, dest=p.name, default=None, metavar="VALUE",
                            help=f"{p.help} (default: {p.render(p.default) or 'unset'})")
    return parser


def serve(argv: list[str]) -> int:
    if hasattr(signal, "SIGHUP"):
        # As Redis: a hang-up must not kill the server (a checkpoint-less exit loses write-back data); the server
        # logs the ones that come once it runs.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    args = _serve_parser().parse_args(argv)
    flags = {name: value for name, value in vars(args).items() if name != "config" and value is not None}
    try:
        config = build_config(flags, os.environ, args.config)
    except (ValueError, OSError) as exc:
        print(f"kvstrata: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        handler = _log_handler(str(config.get("logfile")))
    except OSError as exc:
        print(f"kvstrata: bad configuration: logfile: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=_LOGLEVELS.get(config.get("loglevel"), logging.INFO), handlers=[handler],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kvstrata.server.app import Server
    from kvstrata.server.limits import check_persistence, fit_maxclients

    try:
        check_persistence(config)
    except ValueError as exc:
        print(f"kvstrata: bad configuration: {exc}", file=sys.stderr)
        return 2
    fit_maxclients(config)
    cpus = parse_cpulist(config.get("server-cpulist"))
    if cpus:
        # Before the server starts a thread: every thread it starts inherits the mask.
        try:
            pin_process(cpus)
        except OSError as exc:
            print(f"kvstrata: bad configuration: server-cpulist: {exc}", file=sys.stderr)
            return 2
        logging.getLogger("kvstrata.server").info("running on CPUs %s", format_cpus(cpus))

    try:
        import uvloop

        runner = uvloop.run
        use_uvloop = True
    except ImportError:  # uvloop is optional (e.g. on Windows)
        runner = asyncio.run
        use_uvloop = False
    try:
        server = Server(config, config_file=os.path.abspath(args.config) if args.config else None)
    except Exception as exc:
        print(f"kvstrata: cannot start: {exc}", file=sys.stderr)
        return 1
    server.uvloop = use_uvloop
    pidfile = _write_pidfile(str(config.get("pidfile")))
    try:
        runner(server.serve_forever())
    except OSError as exc:
        print(f"kvstrata: cannot listen: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        if pidfile:
            with contextlib.suppress(OSError):
                os.unlink(pidfile)
    return 0


def _log_handler(path: str) -> logging.Handler:
    """Standard error, or the log file (OSError when it cannot be opened); a WatchedFileHandler opens the file
    again when logrotate has moved it."""
    if not path:
        return logging.StreamHandler(sys.stderr)
    return logging.handlers.WatchedFileHandler(path)


def _write_pidfile(path: str) -> str:
    """Write this process's id to ``path`` (as Redis: a failure is logged, the server runs); the path written, or
    empty."""
    if not path:
        return ""
    try:
        with open(path, "w") as fh:
            fh.write(f"{os.getpid()}\n")
    except OSError as exc:
        logging.getLogger("kvstrata.server").warning("could not write the pid file %s: %s", path, exc)
        return ""
    return path


def bench(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: kvstrata bench {{{','.join(BENCHMARKS)}}} [options]")
        return 0 if argv else 2
    name = argv[0]
    try:
        module = importlib.import_module(f"kvstrata.bench.{name}")
    except ModuleNotFoundError:
        print(f"kvstrata: unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    return int(module.main(argv[1:]))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: kvstrata {serve,bench,chat,top,check,version} ...\n\n"
              "  serve    run the RESP server (kvstrata serve --help)\n"
              "  bench    run a benchmark: " + ", ".join(BENCHMARKS) + "\n"
              "  chat     a multi-turn chat that reuses the KV cache (kvstrata chat --help)\n"
              "  top      a live terminal view of a server (kvstrata top --help)\n"
              "  check    verify (and --repair) an SSD tier (kvstrata check --help)\n"
              "  version  print the version")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        return serve(rest)
    if cmd == "bench":
        return bench(rest)
    if cmd == "top":
        from kvstrata.observability.top import main as top_main

        return top_main(rest)
    if cmd == "check":
        from kvstrata.check import main as check_main

        return check_main(rest)
    if cmd == "chat":
        from kvstrata.chat import main as chat_main

        return chat_main(rest)
    if cmd in ("version", "--version"):
        print(f"kvstrata {__version__}")
        return 0
    print(f"kvstrata: unknown command {cmd!r}", file=sys.stderr)
    return 2
