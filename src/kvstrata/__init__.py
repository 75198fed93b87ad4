"""kvstrata: a tiered KV-cache service for LLM inference with a Redis-protocol server."""

__version__ = "0.1.0"
