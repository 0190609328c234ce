# dbf-serve: the service and the committed models, nothing else (no torch, no training code, no data).
#
#   docker build -t dbf-serve:gpu .               # CUDA (the default target)
#   docker build -t dbf-serve:cpu --target cpu .  # machines without a GPU: a smaller image, the CPU provider
#
# The CPU stages come first: the classic builder (Docker without BuildKit, docker-compose v1) builds every stage
# before the target, so `--target cpu` then never needs the CUDA image. No `# syntax=` line: BuildKit would
# fetch that frontend image first, which fails on a host without a registry, and nothing here needs it.
#
# onnxruntime-gpu 1.31 (pyproject.toml's gpu extra) is built against CUDA 13.0 and cuDNN 9: the CUDA base
# below pins both together, and tests/deploy/test_containers.py checks the CUDA major against the wheel's.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- CPU: the service's dependencies with onnxruntime (CPU), in a virtual environment to copy ------------------
FROM ${PYTHON_IMAGE} AS cpu-build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# Only what `pip install .` needs: training/ is absent, so setuptools packages calibration, fusion, manifest
# and service.
COPY pyproject.toml README.md ./
COPY calibration/ calibration/
COPY fusion/ fusion/
COPY manifest/ manifest/
COPY service/ service/
# pip and setuptools only build the environment: the runtime image does without them.
RUN /opt/venv/bin/pip install ".[cpu]" \
    && /opt/venv/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE} AS cpu
# A home that exists (libraries look there), owned by the service's user; the root may be read-only.
RUN groupadd --system --gid 10001 dbf \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/dbf --create-home --shell /usr/sbin/nologin dbf
COPY --from=cpu-build /opt/venv /opt/venv
WORKDIR /app
COPY models/ models/
# Python prints at once and writes no bytecode, and onnxruntime's usage telemetry (a device id and an event
# store under $HOME) is off: the root filesystem may be read-only. /tmp is the one path the service writes,
# and only with --workers N, for the workers' shared metrics: mount a tmpfs there (--read-only --tmpfs /tmp).
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/home/dbf \
    ORT_DISABLE_TELEMETRY=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DBF_HOST=0.0.0.0 \
    DBF_PORT=8000 \
    DBF_GRPC_PORT=8081 \
    DBF_MODEL_DIR=/app/models \
    DBF_GRACEFUL_SHUTDOWN_SECONDS=30
USER 10001:10001
# HTTP (REST: v1 and the Open Inference Protocol) and gRPC (the Open Inference Protocol, grpc.health.v1);
# DBF_GRPC_PORT=0 turns gRPC off.
EXPOSE 8000 8081
# No curl in slim images: Python asks /ready (503, or no answer, is a failure) where DBF_HOST and DBF_PORT
# say the service listens (the loopback for a wildcard; ::1 for ::, which is IPv6 alone).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "service.healthcheck", "/ready"]
# Exec form: Python (uvicorn's server) is PID 1 and gets SIGTERM itself, then lets requests in flight finish
# for DBF_GRACEFUL_SHUTDOWN_SECONDS. Arguments after the image name are passed on (e.g. --workers 4).
ENTRYPOINT ["python", "-m", "service"]

# --- GPU: onnxruntime-gpu on the CUDA base (the default target, so last) ----------------------------------
FROM ${CUDA_IMAGE} AS gpu-build
ARG DEBIAN_FRONTEND=noninteractive
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Unpinned: the CUDA image's tag fixes the Ubuntu release, whose updates should flow in.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY calibration/ calibration/
COPY fusion/ fusion/
COPY manifest/ manifest/
COPY service/ service/
RUN /opt/venv/bin/pip install ".[gpu]" \
    && /opt/venv/bin/pip uninstall --yes pip setuptools

FROM ${CUDA_IMAGE} AS gpu
ARG DEBIAN_FRONTEND=noninteractive
# The interpreter the virtual environment was made with (the venv links to it), nothing more.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 dbf \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/dbf --create-home --shell /usr/sbin/nologin dbf
COPY --from=gpu-build /opt/venv /opt/venv
WORKDIR /app
COPY models/ models/
# DBF_REQUIRE_GPU: a GPU image on a machine where CUDA cannot run the heads stops at start-up with the reason,
# rather than serving from the CPU unnoticed (set it to false to allow that).
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/home/dbf \
    ORT_DISABLE_TELEMETRY=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DBF_HOST=0.0.0.0 \
    DBF_PORT=8000 \
    DBF_GRPC_PORT=8081 \
    DBF_MODEL_DIR=/app/models \
    DBF_GRACEFUL_SHUTDOWN_SECONDS=30 \
    DBF_REQUIRE_GPU=true
USER 10001:10001
EXPOSE 8000 8081
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "service.healthcheck", "/ready"]
ENTRYPOINT ["python", "-m", "service"]
