# batchfleet-worker for users: a release build in the official Rust image, run on the official
# Python image with pandas and pyarrow. `docker compose build` builds it (docker-compose.yml);
# by hand, from the repository root:
#   docker build -f infra/images/worker.Dockerfile -t batchfleet-worker .
# infra/docker/setup builds the same image here without any registry
# (infra/docker/local/worker.Dockerfile): keep the runtime steps of the two in step.
#
# Add your own Python packages with a Dockerfile of two lines:
#   FROM batchfleet-worker
#   RUN pip install --no-cache-dir scikit-learn==1.7.2
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p batchfleet-worker --bin batchfleet-worker \
    && cp target/release/batchfleet-worker /batchfleet-worker

FROM python:3.11-slim-bookworm
COPY infra/images/worker-requirements.txt /tmp/worker-requirements.txt
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --disable-pip-version-check --no-cache-dir \
        -r /tmp/worker-requirements.txt \
    && rm -f /tmp/worker-requirements.txt \
    && groupadd --gid 10001 batchfleet \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/batchfleet batchfleet \
    && mkdir -p /scratch && chown -R 10001:10001 /scratch /opt/venv
COPY --from=build /batchfleet-worker /usr/local/bin/batchfleet-worker
ENV PATH=/opt/venv/bin:$PATH \
    BATCHFLEET_PYTHON=/opt/venv/bin/python \
    BATCHFLEET_SCRATCH_DIR=/scratch
VOLUME /scratch
USER 10001:10001
WORKDIR /home/batchfleet
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["batchfleet-worker", "--check"]
ENTRYPOINT ["batchfleet-worker"]
