# kvstrata server image: slim Python 3.11, no CUDA and no torch (the server needs neither).
#
#   docker build -t kvstrata .
#   docker run -p 6379:6379 -v kvstrata-data:/data -e DRAM_SIZE=4G -e REQUIREPASS=change-me kvstrata
#   docker run kvstrata kvstrata serve --port=6379 --cluster-enabled=no      (Tair-style flags work as they are)
#
# Environment: DRAM_SIZE, ESSD_PATH (default /data/essd), ESSD_SIZE, HBM_SIZE, REQUIREPASS[_FILE], KVSTRATA_*.
# See docs/deploy.md and deploy/docker/entrypoint.sh.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# gcc: hatch_build.py compiles the client's native copy helper and the prefetch predictor's extension module into
# kvstrata's wheel (the python image has Python's headers; without gcc the wheel is built without them: the client
# copies with numpy, the predictor runs in Python). Only in this stage: the image gets the wheel.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md hatch_build.py ./
COPY src ./src
# Wheels of kvstrata, its server dependencies and redis-py (the `sdk` extra: the client of the Redis Cluster pool
# tier). Not the `llm` or `sglang` extras: no torch, no transformers.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[sdk]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kvstrata" \
      org.opencontainers.image.description="Tiered KV-cache service for LLM inference with a Redis-protocol server" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ESSD_PATH=/data/essd \
    KVSTRATA_PORT=6379 \
    KVSTRATA_HTTP_PORT=9379

RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/*.whl \
    && groupadd --system --gid 10001 kvstrata \
    && useradd --system --uid 10001 --gid kvstrata --home-dir /data --shell /usr/sbin/nologin kvstrata \
    && mkdir -p /data/essd \
    && chown -R kvstrata:kvstrata /data

COPY --chmod=0755 deploy/docker/entrypoint.sh /usr/local/bin/kvstrata-entrypoint

USER 10001:10001
WORKDIR /data
# The SSD tier (LMDB) lives here: mount a volume or a host directory on local SSD/NVMe.
VOLUME ["/data"]
EXPOSE 6379 9379

HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["kvstrata-entrypoint", "healthcheck"]

ENTRYPOINT ["kvstrata-entrypoint"]
CMD ["serve"]
