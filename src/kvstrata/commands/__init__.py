"""Command table and handlers. Importing this package registers every command family."""

from kvstrata.commands import (  # noqa: F401
    acl,
    bits,
    connection,
    dataplane,
    dump,
    keyspace,
    lcs,
    migrate,
    object_info,
    observe,
    pubsub,
    pull,
    server_cmds,
    staging,
    strings,
    tairkv,
    tracking,
    transactions,
)
from kvstrata.commands.registry import REGISTRY, CommandSpec, lookup

__all__ = ["REGISTRY", "CommandSpec", "lookup"]
