# syntax=docker/dockerfile:1
#
# pidgate container image: a Kafka-protocol proxy that throttles new producer IDs per principal
# (KIP-936). Multi-stage: the first stage builds pidgate's wheel and every dependency wheel, the
# final stage installs them into a virtualenv without network access and runs as a non-root user.
# The proxy only (`pidgate serve`, `pidgate quotas`): no demo broker, no PySpark/pandas/pyarrow/
# matplotlib (the `demo` and `analyze` extras), no pip in the virtualenv. Expected size: the
# python:3.11-slim base plus about 45 MB (measured as a venv install; not built here). `pidgate
# analyze` needs Java and the analyze extra: deploy/README.md, "Analysis", says where to run it.
#
#   docker build -t pidgate:local .
#   docker run --rm -p 127.0.0.1:9092:9092 -p 127.0.0.1:9404:9404 \
#     -v "$PWD/my-pidgate.yaml:/etc/pidgate/pidgate.yaml:ro" pidgate:local
#
# Configuration: /etc/pidgate/pidgate.yaml (the image ships deploy/pidgate.yaml there, the example
# docker-compose.yml uses; mount your own over it), any PIDGATE_* environment variable, or flags
# after the image name (they replace CMD: `serve --config /etc/pidgate/pidgate.yaml --http ...`).
# An unknown PIDGATE_* variable stops start-up, as pidgate validates every one of them.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

# gcc for pidgate's compiled per-request path (protocol/_speedups.pyx, quota/_bloomspeed.pyx and
# proxy/serving/_express.pyx, built by setup.py; the image's Python has its headers). Only in
# this stage: the runtime image gets the built wheel.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps everything else out of the context).
COPY pyproject.toml setup.py README.md ./
COPY src ./src

# pidgate's own wheel (with the compiled module) plus a wheel of every runtime dependency of the
# proxy (no extras; all of them publish manylinux wheels for CPython 3.11).
RUN pip wheel --wheel-dir /wheels .

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="pidgate" \
      org.opencontainers.image.description="Kafka-protocol proxy that throttles new producer IDs per principal (KIP-936)" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Non-root user with fixed numeric ids, so Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 pidgate \
    && useradd --system --uid 10001 --gid pidgate --no-create-home \
       --home-dir /var/lib/pidgate --shell /usr/sbin/nologin pidgate \
    && mkdir -p /etc/pidgate /var/lib/pidgate \
    && chown pidgate:pidgate /var/lib/pidgate

# Install from the build stage's wheels without copying them into a layer of this image.
# The base image's pip installs into a venv that has none of its own (pip --python, pip >= 22.3).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv --without-pip /opt/venv \
    && pip --python /opt/venv/bin/python install --no-index --find-links=/wheels \
       /wheels/pidgate-*.whl \
    && pidgate --version

COPY deploy/pidgate.yaml /etc/pidgate/pidgate.yaml

# The only directory pidgate writes to (state.path, e.g. /var/lib/pidgate/state.json); the root
# filesystem can be read-only.
WORKDIR /var/lib/pidgate
USER 10001:10001

# 9092: bootstrap listener (proxy.listen).
# 9093-9199: gateway mode's per-broker listeners, one per broker node_id on
#   proxy.broker_port_base + node_id (default: listen port + 1, so node ids 0..106 here);
#   publish the ones your cluster's node ids need. Sidecar mode needs only the bootstrap port.
# 9404: admin HTTP (/metrics /healthz /readyz /state; admin.listen or --http, loopback by default:
#   pass --http 0.0.0.0:9404 for Prometheus or Kubernetes probes to reach it).
EXPOSE 9092 9093-9199 9404

# No curl in the slim image: python's urllib. urlopen raises (exit 1) on any non-2xx answer or a
# refused connection. Assumes the admin listener on port 9404 (bound to 0.0.0.0 or 127.0.0.1).
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9404/healthz', timeout=4)"]

# SIGTERM: stop accepting, let in-flight requests finish (proxy.shutdown_grace_ms), exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["pidgate"]
CMD ["serve", "--config", "/etc/pidgate/pidgate.yaml"]
