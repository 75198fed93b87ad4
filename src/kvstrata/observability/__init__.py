"""Observability: a stats snapshot read at scrape time, Prometheus metrics, the HTTP endpoint and dashboard,
the per-second history (charts and the LATENCY monitor) and ``kvstrata top``.

Nothing here is called from the per-command path. The hot path only increments plain counters
(``kvstrata.server.cmdstats``, ``kvstrata.server.stats``, ``kvstrata.engine.stats``); this package reads them
when someone asks: a scrape of ``/metrics``, a poll of ``/stats.json``, ``INFO``, or the once-a-second sampler.
Modules:

- ``latency``: quantiles and cumulative buckets from the power-of-two microsecond histograms;
- ``snapshot``: one JSON-ready dict of every number (the schema of ``/stats.json``), with bounded work;
- ``history``: the once-a-second sampler (time series for the dashboard, events for LATENCY LATEST/HISTORY);
- ``prometheus``: a custom ``prometheus_client`` collector that turns a snapshot into metric families;
- ``http``: a small HTTP/1.1 server on the server's own event loop, with password checks off loopback;
- ``service``: wires the above to a running server;
- ``top``: the terminal view (``kvstrata top``).
"""
