# The worker / ingest / flower / board image of rl-job-health.
#
# The parser's native stat-line pass (worker/evidence/logs/_fastscan.c, built by setup.py) is
# compiled here: gcc is installed for the build and removed after it, and the build fails if the
# extension did not compile. EXTRAS="[iris]" adds the Iris CLI (marin-iris); kubectl, py-spy and
# the Slurm tools are not in this image, so it judges bundles and recorded probes, and live
# probing needs an image with the backend's tools (docs/operations.md, "Deploy with compose").
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml setup.py README.md ./
COPY shared shared
COPY worker worker
COPY reports reports
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install ".${EXTRAS}" "flower>=2.0,<3" \
    && python -c "import worker.evidence.logs._fastscan" \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 rlhealth

USER rlhealth
CMD ["rl-health", "--help"]
