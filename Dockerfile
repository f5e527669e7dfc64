# The worker / ingest / flower / board image of rl-job-health.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY shared shared
COPY worker worker
COPY reports reports
RUN pip install . "flower>=2.0,<3" \
    && useradd --create-home --uid 10001 rlhealth

USER rlhealth
CMD ["rl-health", "--help"]
