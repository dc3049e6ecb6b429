# One image for every framefleet service: workers, Flower, the enqueue script.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Only what the package needs (and s3fs: workers that read and write s3:// roots): no virtual environment,
# caches or local data in the image.
COPY pyproject.toml README.md ./
COPY tasks ./tasks
COPY worker_config ./worker_config
COPY scripts ./scripts
RUN pip install ".[s3]" \
    && useradd --create-home --uid 1000 framefleet

# /data/out must be writable by uid 1000 (or set `user:` in compose.yaml).
USER framefleet
CMD ["celery", "-A", "tasks", "worker", "-Q", "cpu"]
