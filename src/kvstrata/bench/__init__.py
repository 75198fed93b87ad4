"""Benchmarks for kvstrata: harnesses that run servers side by side and measure them (``kvstrata bench ...``)."""
