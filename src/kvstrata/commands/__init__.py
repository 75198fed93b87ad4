"""Command table and handlers. Importing this package registers every command family."""

from kvstrata.commands import acl, connection, keyspace, observe, server_cmds, strings, tairkv  # noqa: F401
from kvstrata.commands.registry import REGISTRY, CommandSpec, lookup

__all__ = ["REGISTRY", "CommandSpec", "lookup"]
