"""Client-side caching commands: CLIENT TRACKING, CLIENT CACHING, CLIENT GETREDIR, CLIENT TRACKINGINFO, with Redis
7.0's options, checks and error texts (the tracking itself: server/tracking.py)."""

from __future__ import annotations

from typing import Any

from kvstrata.commands.args import parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.registry import command
from kvstrata.errors import CommandError, syntax_error
from kvstrata.protocol.encoder import OK, SetReply
from kvstrata.server.tracking import BCAST, BROKEN_REDIR, CACHING, NOLOOP, ON, OPTIN, OPTOUT

_OPTIONS = {b"bcast": BCAST, b"optin": OPTIN, b"optout": OPTOUT, b"noloop": NOLOOP}


def _c_string(raw: bytes) -> str:
    """A prefix as Redis's ``%s`` shows it: up to its first NUL byte."""
    return raw.split(b"\0", 1)[0].decode("latin-1")


def _overlap(a: bytes, b: bytes) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _existing_overlap(prefix: bytes, old: bytes) -> CommandError:
    return CommandError(f"Prefix '{_c_string(prefix)}' overlaps with an existing prefix '{_c_string(old)}'. "
                        "Prefixes for a single client must not overlap.")


def _provided_overlap(prefix: bytes, other: bytes) -> CommandError:
    return CommandError(f"Prefix '{_c_string(prefix)}' overlaps with another provided prefix '{_c_string(other)}'. "
                        "Prefixes for a single client must not overlap.")


# Up to this many prefixes (the client's and the new ones) every pair is compared, in Redis's order, so the error
# names the pair Redis names; beyond it, a sort finds whether any pair overlaps (Redis compares every pair, which
# here would hold the event loop for minutes for one command with a hundred thousand prefixes).
EXACT_PREFIXES = 256


def _check_prefixes(own: list[bytes], prefixes: list[bytes]) -> None:
    """Redis's checkPrefixCollisionsOrReply: no two prefixes of one client may both cover a key."""
    if len(own) + len(prefixes) > EXACT_PREFIXES:
        _check_prefixes_sorted(own, prefixes)
        return
    own = sorted(own)  # Redis walks the client's prefixes in their radix tree's order
    for i, prefix in enumerate(prefixes):
        for old in own:
            if _overlap(old, prefix):
                raise _existing_overlap(prefix, old)
        for other in prefixes[i + 1:]:
            if _overlap(prefix, other):
                raise _provided_overlap(prefix, other)


def _check_prefixes_sorted(own: list[bytes], prefixes: list[bytes]) -> None:
    """Whether any two overlap, in O(n log n): if one prefix covers another, it also covers the one right after
    it in sorted order (everything between them starts with it), so adjacent pairs are enough. The client's own
    prefixes never overlap each other. The error names an overlapping pair, not always the one Redis would."""
    entries = sorted([(p, 0, i) for i, p in enumerate(own)] + [(p, 1, i) for i, p in enumerate(prefixes)])
    for (a, a_new, a_i), (b, b_new, b_i) in zip(entries, entries[1:], strict=False):
        if not b.startswith(a):
            continue
        if not a_new:
            raise _existing_overlap(b, a)
        if not b_new:
            raise _existing_overlap(a, b)
        first, second = (a, b) if a_i < b_i else (b, a)
        raise _provided_overlap(first, second)


@command("tracking", -3, "noscript loading stale", parent="client", group="connection", since="6.0.0",
         summary="Controls server-assisted client-side caching for the connection.",
         syntax="CLIENT TRACKING <ON | OFF> [REDIRECT client-id] [PREFIX prefix [PREFIX prefix ...]] [BCAST] "
                "[OPTIN] [OPTOUT] [NOLOOP]")
def client_tracking(ctx: Context, args: list[bytes]) -> Any:
    server = ctx.server
    if server is None:
        raise CommandError("client-side caching needs a running server")
    redirect = 0
    options = 0
    prefixes: list[bytes] = []
    i = 3
    while i < len(args):
        word = args[i].lower()
        more = i + 1 < len(args)
        if word == b"redirect" and more:
            i += 1
            if redirect:
                raise CommandError("A client can only redirect to a single other client")
            redirect = parse_int(args[i])
            if redirect not in server.clients:  # it must exist now, even if it may leave later (as Redis)
                raise CommandError("The client ID you want redirect to does not exist")
        elif word in _OPTIONS:
            options |= _OPTIONS[word]
        elif word == b"prefix" and more:
            i += 1
            prefixes.append(bytes(args[i]))
        else:
            raise syntax_error()
        i += 1
    client = ctx.client
    conn = server.clients[client.id]
    mode = args[2].lower()
    if mode == b"on":
        current = client.tracking
        if not options & BCAST and prefixes:
            raise CommandError("PREFIX option requires BCAST mode to be enabled")
        if current & ON and bool(current & BCAST) != bool(options & BCAST):
            raise CommandError("You can't switch BCAST mode on/off before disabling tracking for this client, "
                               "and then re-enabling it with a different mode.")
        if options & BCAST and options & (OPTIN | OPTOUT):
            raise CommandError("OPTIN and OPTOUT are not compatible with BCAST")
        if options & OPTIN and options & OPTOUT:
            raise CommandError("You can't specify both OPTIN mode and OPTOUT mode")
        if (options & OPTIN and current & OPTOUT) or (options & OPTOUT and current & OPTIN):
            raise CommandError("You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, "
                               "and then re-enabling it with a different mode.")
        if options & BCAST:
            _check_prefixes(client.tracking_prefixes, prefixes)
        server.tracking.enable(conn, redirect, options, prefixes)
    elif mode == b"off":
        server.tracking.disable(conn)
    else:
        raise syntax_error()
    return OK


@command("caching", 3, "noscript loading stale", parent="client", group="connection", since="6.0.0",
         summary="Instructs the server whether to track the keys in the next request.",
         syntax="CLIENT CACHING <YES | NO>")
def client_caching(ctx: Context, args: list[bytes]) -> Any:
    client = ctx.client
    if not client.tracking:
        raise CommandError("CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or "
                           "OPTOUT mode enabled")
    choice = args[2].lower()
    if choice == b"yes":
        if not client.tracking & OPTIN:
            raise CommandError("CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.")
    elif choice == b"no":
        if not client.tracking & OPTOUT:
            raise CommandError("CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.")
    else:
        raise syntax_error()
    client.tracking |= CACHING
    return OK


@command("getredir", 2, "noscript loading stale", parent="client", group="connection", since="6.0.0",
         summary="Returns the client ID to which the connection's tracking notifications are redirected.")
def client_getredir(ctx: Context, args: list[bytes]) -> Any:
    return ctx.client.tracking_redirect if ctx.client.tracking else -1


@command("trackinginfo", 2, "noscript loading stale", parent="client", group="connection", since="6.2.0",
         summary="Returns information about server-assisted client-side caching for the connection.")
def client_trackinginfo(ctx: Context, args: list[bytes]) -> Any:
    flags = ctx.client.tracking
    names = ["on" if flags & ON else "off"]
    if flags & BCAST:
        names.append("bcast")
    if flags & OPTIN:
        names += ["optin", "caching-yes"] if flags & CACHING else ["optin"]
    if flags & OPTOUT:
        names += ["optout", "caching-no"] if flags & CACHING else ["optout"]
    if flags & NOLOOP:
        names.append("noloop")
    if flags & BROKEN_REDIR:
        names.append("broken_redirect")
    return {
        "flags": SetReply(names),
        "redirect": ctx.client.tracking_redirect if flags & ON else -1,
        "prefixes": sorted(ctx.client.tracking_prefixes),  # as Redis's radix tree lists them
    }
