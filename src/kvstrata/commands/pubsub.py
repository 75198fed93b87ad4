"""Pub/Sub commands: SUBSCRIBE and friends, PUBLISH, SPUBLISH and PUBSUB, with Redis 7.0's replies and rules.

The subscriptions and the delivery are the server's (``kvstrata.server.pubsub``). ACL: a user's channel rules
(``&pattern``, ``allchannels``) decide which channels it may publish or subscribe to, as in Redis 7 (a PSUBSCRIBE
pattern must be one of the user's patterns literally); new users start with none (Redis's
``acl-pubsub-default resetchannels``).
"""

from __future__ import annotations

from typing import Any

from kvstrata.commands.context import Context
from kvstrata.commands.observe import help_reply
from kvstrata.commands.registry import command, container
from kvstrata.errors import CommandError
from kvstrata.protocol.encoder import Replies
from kvstrata.server.pubsub import CHANNEL, PATTERN, SHARD


def _conn(ctx: Context) -> Any:
    if ctx.server is None:
        raise CommandError("Pub/Sub needs a server connection")
    return ctx.server.clients[ctx.client.id]


def _subscribe(ctx: Context, args: list[bytes], kind: int) -> Any:
    return Replies(ctx.server.pubsub.subscribe(_conn(ctx), kind, args[1:]))


def _unsubscribe(ctx: Context, args: list[bytes], kind: int) -> Any:
    return Replies(ctx.server.pubsub.unsubscribe(_conn(ctx), kind, args[1:] if len(args) > 1 else None))


@command("subscribe", -2, "pubsub noscript loading stale", group="pubsub", since="2.0.0",
         summary="Listens for messages published to channels.", syntax="SUBSCRIBE channel [channel ...]")
def subscribe(ctx: Context, args: list[bytes]) -> Any:
    return _subscribe(ctx, args, CHANNEL)


@command("unsubscribe", -1, "pubsub noscript loading stale", group="pubsub", since="2.0.0",
         summary="Stops listening to messages posted to channels.", syntax="UNSUBSCRIBE [channel [channel ...]]")
def unsubscribe(ctx: Context, args: list[bytes]) -> Any:
    return _unsubscribe(ctx, args, CHANNEL)


@command("psubscribe", -2, "pubsub noscript loading stale", group="pubsub", since="2.0.0",
         summary="Listens for messages published to channels that match one or more patterns.",
         syntax="PSUBSCRIBE pattern [pattern ...]")
def psubscribe(ctx: Context, args: list[bytes]) -> Any:
    return _subscribe(ctx, args, PATTERN)


@command("punsubscribe", -1, "pubsub noscript loading stale", group="pubsub", since="2.0.0",
         summary="Stops listening to messages published to channels that match one or more patterns.",
         syntax="PUNSUBSCRIBE [pattern [pattern ...]]")
def punsubscribe(ctx: Context, args: list[bytes]) -> Any:
    return _unsubscribe(ctx, args, PATTERN)


@command("ssubscribe", -2, "pubsub noscript loading stale", group="pubsub", since="7.0.0",
         summary="Listens for messages published to shard channels.",
         syntax="SSUBSCRIBE shardchannel [shardchannel ...]")
def ssubscribe(ctx: Context, args: list[bytes]) -> Any:
    return _subscribe(ctx, args, SHARD)


@command("sunsubscribe", -1, "pubsub noscript loading stale", group="pubsub", since="7.0.0",
         summary="Stops listening to messages posted to shard channels.",
         syntax="SUNSUBSCRIBE [shardchannel [shardchannel ...]]")
def sunsubscribe(ctx: Context, args: list[bytes]) -> Any:
    return _unsubscribe(ctx, args, SHARD)


def _publish(ctx: Context, args: list[bytes], shard: bool) -> int:
    if ctx.server is None:
        return 0
    current = ctx.server.clients.get(ctx.client.id)
    message = bytes(args[2])
    receivers = ctx.server.pubsub.publish(args[1], message, current, shard)
    pool = ctx.store.pool
    if pool is not None and not shard and pool.forwarding:  # the other nodes' subscribers (as Redis Cluster)
        pool.forward(bytes(args[1]), message)
    return receivers


@command("publish", 3, "pubsub loading stale fast", group="pubsub", since="2.0.0",
         summary="Posts a message to a channel.", syntax="PUBLISH channel message")
def publish(ctx: Context, args: list[bytes]) -> Any:
    return _publish(ctx, args, False)


@command("spublish", 3, "pubsub loading stale fast", group="pubsub", since="7.0.0",
         summary="Post a message to a shard channel", syntax="SPUBLISH shardchannel message")
def spublish(ctx: Context, args: list[bytes]) -> Any:
    return _publish(ctx, args, True)


container("pubsub", "", group="pubsub", since="2.8.0", summary="A container for Pub/Sub commands.")


@command("channels", -2, "pubsub loading stale", parent="pubsub", group="pubsub", since="2.8.0", most=3,
         summary="Returns the active channels.", syntax="PUBSUB CHANNELS [pattern]")
def pubsub_channels(ctx: Context, args: list[bytes]) -> Any:
    return ctx.server.pubsub.names(CHANNEL, bytes(args[2]) if len(args) > 2 else None) if ctx.server else []


@command("numsub", -2, "pubsub loading stale", parent="pubsub", group="pubsub", since="2.8.0",
         summary="Returns a count of subscribers to channels.", syntax="PUBSUB NUMSUB [channel [channel ...]]")
def pubsub_numsub(ctx: Context, args: list[bytes]) -> Any:
    return ctx.server.pubsub.numsub(CHANNEL, args[2:]) if ctx.server else []


@command("numpat", 2, "pubsub loading stale", parent="pubsub", group="pubsub", since="2.8.0",
         summary="Returns a count of unique pattern subscriptions.")
def pubsub_numpat(ctx: Context, args: list[bytes]) -> Any:
    return ctx.server.pubsub.sizes()[1] if ctx.server else 0


@command("shardchannels", -2, "pubsub loading stale", parent="pubsub", group="pubsub", since="7.0.0", most=3,
         summary="Returns the active shard channels.", syntax="PUBSUB SHARDCHANNELS [pattern]")
def pubsub_shardchannels(ctx: Context, args: list[bytes]) -> Any:
    return ctx.server.pubsub.names(SHARD, bytes(args[2]) if len(args) > 2 else None) if ctx.server else []


@command("shardnumsub", -2, "pubsub loading stale", parent="pubsub", group="pubsub", since="7.0.0",
         summary="Returns the count of subscribers of shard channels.",
         syntax="PUBSUB SHARDNUMSUB [shardchannel [shardchannel ...]]")
def pubsub_shardnumsub(ctx: Context, args: list[bytes]) -> Any:
    return ctx.server.pubsub.numsub(SHARD, args[2:]) if ctx.server else []


@command("help", 2, "loading stale", parent="pubsub", group="pubsub", since="6.2.0",
         summary="Returns helpful text about the different subcommands.")
def pubsub_help(ctx: Context, args: list[bytes]) -> Any:
    return help_reply("PUBSUB", [
        "CHANNELS [<pattern>]",
        "    Return the currently active channels matching a <pattern> (default: '*').",
        "NUMPAT",
        "    Return number of subscriptions to patterns.",
        "NUMSUB [<channel> ...]",
        "    Return the number of subscribers for the specified channels, excluding",
        "    pattern subscriptions(default: no channels).",
        "SHARDCHANNELS [<pattern>]",
        "    Return the currently active shard level channels matching a <pattern> (default: '*').",
        "SHARDNUMSUB [<shardchannel> ...]",
        "    Return the number of subscribers for the specified shard level channel(s)",
    ])
