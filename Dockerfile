# The worker / ingest / flower / board image of rl-job-health, in two stages (docs/operations.md,
# "The image"):
#
# - build: a compiler builds the parser's native pass (worker/evidence/logs/_fastscan.c, through
#   setup.py) while the package is installed into a virtual environment, with the Python probe
#   tools: the iris CLI (the `iris` extra: marin-iris pinned, httpx<1), py-spy, and Flower. The
#   extension is optional in setup.py (pip would install without it), so the stage imports it
#   and fails the build when it is missing.
# - runtime: the same slim base with that environment, kubectl (Debian's kubernetes-client) and
#   ps/pgrep, run as an unprivileged user; no compiler and no source tree (the code imported is
#   the installed package, with its extension).
#
# tests/unit/test_dockerfile.py checks these stages as written; tests/integration/test_image.py
# builds the image and imports `_fastscan` in it where Docker is available.

# bookworm, named: its kubernetes-client is the kubectl below (trixie has none)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv \
    && pip install --upgrade pip setuptools wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY shared shared
COPY reports reports
COPY worker worker
RUN pip install ".[iris]" "py-spy>=0.4,<0.5" "flower>=2.0,<3"
# from outside the source tree, so the installed package (and its extension) is what imports
WORKDIR /
RUN python -c "import worker.evidence.logs._fastscan as native; print(native.__file__)" \
    && rl-health --help >/dev/null \
    && iris --help >/dev/null \
    && py-spy --version

FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
# kubectl for the kubernetes backend (Debian's build: 1.20 on bookworm, see docs/operations.md
# for a cluster beyond its version skew); procps for the local backend's ps and pgrep
RUN apt-get update \
    && apt-get install -y --no-install-recommends kubernetes-client procps \
    && rm -rf /var/lib/apt/lists/* \
    && kubectl version --client >/dev/null \
    && useradd --create-home --uid 10001 rlhealth
COPY --from=build /opt/venv /opt/venv
WORKDIR /home/rlhealth
USER rlhealth
CMD ["rl-health", "--help"]
