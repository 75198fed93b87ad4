"""The ACL command family: SETUSER, GETUSER, DELUSER, LIST, USERS, WHOAMI, CAT, LOG, LOAD, SAVE, DRYRUN,
GENPASS, HELP (the model and the checks live in ``kvstrata.acl``)."""

from __future__ import annotations

import os
import time
from typing import Any

from kvstrata import acl as acl_mod
from kvstrata.commands.args import parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.registry import REGISTRY, command, container
from kvstrata.errors import CommandError, syntax_error
from kvstrata.protocol.encoder import OK
from kvstrata.server.pubsub import PATTERN

container("acl", "", group="server", since="6.0.0", summary="A container for Access List Control commands.")


def _text(raw: bytes) -> str:
    return bytes(raw).decode("utf-8", "surrogateescape")


def _valid_username(name: str) -> bool:
    """Redis's rule (no whitespace, no NUL: UTF-8 and other bytes are fine), and not empty, which could not be
    read back from an ACL file."""
    return bool(name) and not any(c in " \t\n\v\f\r\x00" for c in name)


@command("setuser", -3, "admin noscript loading stale", parent="acl", group="server", since="6.0.0",
         summary="Creates and modifies an ACL user and its rules.", syntax="ACL SETUSER username [rule [rule ...]]")
def acl_setuser(ctx: Context, args: list[bytes]) -> Any:
    name = _text(args[2])
    if not _valid_username(name):
        raise CommandError("Usernames can't contain spaces or null characters")
    try:
        acl_mod.acl_of(ctx).setuser(name, [_text(a) for a in args[3:]])
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    _close_subscribers_without_access(ctx)
    return OK


def _close_subscribers_without_access(ctx: Context) -> None:
    """As Redis 7: a connection subscribed to a channel (or pattern) its user may no longer use is closed."""
    if ctx.server is None:
        return
    for conn in list(ctx.server.clients.values()):
        client = conn.client
        user = client.user
        if not client.subscribed or user is None or user.allchannels:
            continue
        if any(not user.may_use_channel(name, kind == PATTERN) for kind, names in enumerate(client.pubsub)
               for name in names):
            if client is ctx.client:
                client.closing = True  # after this command's reply
            else:
                conn.kill()


@command("getuser", 3, "admin noscript loading stale", parent="acl", group="server", since="6.0.0",
         summary="Lists the ACL rules of a user.", syntax="ACL GETUSER username")
def acl_getuser(ctx: Context, args: list[bytes]) -> Any:
    user = acl_mod.acl_of(ctx).users.get(_text(args[2]))
    if user is None:
        return None
    return {
        "flags": user.flags(),  # bulk strings, as Redis 7
        "passwords": user.passwords,
        **user.fields(),  # the root selector's
        "selectors": [s.fields() for s in user.selectors],
    }


@command("deluser", -3, "admin noscript loading stale", parent="acl", group="server", since="6.0.0",
         summary="Deletes ACL users, and terminates their connections.", syntax="ACL DELUSER username [username ...]")
def acl_deluser(ctx: Context, args: list[bytes]) -> Any:
    acl = acl_mod.acl_of(ctx)
    names = [_text(a) for a in args[2:]]
    if "default" in names:
        raise CommandError("The 'default' user cannot be removed")
    deleted = []
    for name in names:
        user = acl.users.pop(name, None)
        if user is not None:
            deleted.append(user)
    if ctx.server is not None and deleted:
        for conn in list(ctx.server.clients.values()):
            if any(conn.client.user is u for u in deleted):
                conn.kill()
    return len(deleted)


@command("list", 2, "admin noscript loading stale", parent="acl", group="server", since="6.0.0",
         summary="Dumps the effective rules in ACL file format.")
def acl_list(ctx: Context, args: list[bytes]) -> Any:
    users = acl_mod.acl_of(ctx).users
    return [users[name].describe() for name in sorted(users)]  # Redis lists them in name order


@command("users", 2, "admin noscript loading stale", parent="acl", group="server", since="6.0.0",
         summary="Lists all ACL users.")
def acl_users(ctx: Context, args: list[bytes]) -> Any:
    return sorted(acl_mod.acl_of(ctx).users)


@command("whoami", 2, "noscript loading stale", parent="acl", group="server", since="6.0.0",
         summary="Returns the authenticated username of the current connection.")
def acl_whoami(ctx: Context, args: list[bytes]) -> Any:
    user = getattr(ctx.client, "user", None)
    return user.name if user is not None else "default"


@command("cat", -2, "noscript loading stale", parent="acl", group="server", since="6.0.0", most=3,
         summary="Lists the ACL categories, or the commands inside a category.", syntax="ACL CAT [category]")
def acl_cat(ctx: Context, args: list[bytes]) -> Any:
    if len(args) == 2:
        return list(acl_mod.CATEGORIES)
    cat = _text(args[2]).lower().lstrip("@")
    if cat not in acl_mod.CATEGORIES:
        raise CommandError(f"Unknown category '{_text(args[2])}'")
    return [s.full_name for s in acl_mod.category_specs(cat)]


@command("log", -2, "admin noscript loading stale", parent="acl", group="server", since="6.0.0",
         summary="Lists recent security events generated due to ACL rules.", syntax="ACL LOG [count | RESET]")
def acl_log(ctx: Context, args: list[bytes]) -> Any:
    acl = acl_mod.acl_of(ctx)
    if len(args) > 3:
        raise syntax_error()
    count = len(acl.log)
    if len(args) == 3:
        if args[2].upper() == b"RESET":
            acl.log.clear()
            return OK
        count = parse_int(args[2], "value is out of range, must be positive")
        if count < 0:
            raise CommandError("value is out of range, must be positive")
    now = int(time.time() * 1000)
    return [{
        "count": e.count,
        "reason": e.reason,
        "context": e.context,
        "object": e.object,
        "username": e.username,
        "age-seconds": f"{(now - e.created_ms) / 1000:.3f}",
        "client-info": e.client_info,
        "entry-id": e.entry_id,
        "timestamp-created": e.created_ms,
        "timestamp-last-updated": e.updated_ms,
    } for e in list(acl.log)[:count]]


def _aclfile(ctx: Context) -> str:
    path = acl_mod.acl_of(ctx).aclfile
    if not path:
        raise CommandError("This Redis instance is not configured to use an ACL file. You may want to specify "
                           "users via the ACL SETUSER command and then issue a CONFIG REWRITE (assuming you have a "
                           "Redis configuration file set) in order to store users in the Redis configuration.")
    return path


@command("load", 2, "admin noscript loading stale", parent="acl", group="server", since="6.0.0",
         summary="Reloads the rules from the configured ACL file.")
def acl_load(ctx: Context, args: list[bytes]) -> Any:
    acl = acl_mod.acl_of(ctx)
    path = _aclfile(ctx)
    try:
        acl.load(path)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if ctx.server is not None:  # connections follow their user's new definition; a removed user's are closed
        for conn in list(ctx.server.clients.values()):
            user = acl.users.get(conn.client.user.name) if conn.client.user is not None else None
            if user is None:
                conn.kill()
            else:
                conn.client.user = user
    _close_subscribers_without_access(ctx)
    return OK


@command("save", 2, "admin noscript loading stale", parent="acl", group="server", since="6.0.0",
         summary="Saves the effective ACL rules in the configured ACL file.")
def acl_save(ctx: Context, args: list[bytes]) -> Any:
    path = _aclfile(ctx)
    try:
        acl_mod.acl_of(ctx).save(path)
    except OSError as exc:
        raise CommandError(f"There was an error trying to save the ACLs. Please check the server logs for more "
                           f"information ({exc.strerror or exc})") from None
    return OK


@command("dryrun", -4, "admin noscript loading stale", parent="acl", group="server", since="7.0.0",
         summary="Simulates the execution of a command by a user, without executing the command.",
         syntax="ACL DRYRUN username command [arg [arg ...]]")
def acl_dryrun(ctx: Context, args: list[bytes]) -> Any:
    acl = acl_mod.acl_of(ctx)
    name = _text(args[2])
    user = acl.users.get(name)
    if user is None:
        raise CommandError(f"User '{name}' not found")
    cmd = list(args[3:])
    spec = REGISTRY.get(bytes(args[3]).lower())
    if spec is not None and spec.subcommands and len(cmd) > 1:  # as the dispatcher: the subcommand is the command
        spec = spec.subcommands.get(bytes(cmd[1]).lower())
    if spec is None:
        raise CommandError(f"Command '{_text(args[3])}' not found")
    if not spec.arity_ok(len(cmd)):
        raise CommandError(f"wrong number of arguments for '{spec.full_name}' command")
    refused = acl_mod.check(user, spec, cmd)
    if refused is None:
        return OK
    reason, obj = refused
    if reason == "command":
        return f"This user has no permissions to run the '{spec.full_name}' command"
    return f"This user has no permissions to access the '{obj}' {reason}"


@command("genpass", -2, "noscript loading stale", parent="acl", group="server", since="6.0.0", most=3,
         summary="Generates a pseudorandom, secure password that can be used to identify ACL users.",
         syntax="ACL GENPASS [bits]")
def acl_genpass(ctx: Context, args: list[bytes]) -> Any:
    bits = 256
    if len(args) == 3:
        bits = parse_int(args[2])
        if not 0 < bits <= 4096:
            raise CommandError("ACL GENPASS argument must be the number of bits for the output password, a "
                               "positive number up to 4096")
    return os.urandom((bits + 7) // 8).hex()[: (bits + 3) // 4]


@command("help", 2, "loading stale", parent="acl", group="server", since="6.0.0",
         summary="Returns helpful text about the different subcommands.")
def acl_help(ctx: Context, args: list[bytes]) -> Any:
    return [f"{s.syntax or s.name.upper()}: {s.summary}" for s in REGISTRY[b"acl"].subcommands.values()]
