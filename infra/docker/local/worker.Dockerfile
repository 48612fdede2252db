# batchfleet-worker, built here without any registry by infra/docker/setup: FROM the imported
# debootstrap root fs (Debian bookworm, Python 3.11), with the host's binary and wheels the
# host downloaded. The steps after the base match infra/images/worker.Dockerfile (the users'
# multi-stage build); keep the two in step.
FROM batchfleet-base:bookworm
COPY wheels-worker /tmp/wheels
COPY worker-requirements.txt /tmp/worker-requirements.txt
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --disable-pip-version-check --no-cache-dir --no-index \
        --find-links /tmp/wheels -r /tmp/worker-requirements.txt \
    && rm -rf /tmp/wheels /tmp/worker-requirements.txt \
    && groupadd --gid 10001 batchfleet \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/batchfleet batchfleet \
    && mkdir -p /scratch && chown -R 10001:10001 /scratch /opt/venv
COPY bin/batchfleet-worker /usr/local/bin/batchfleet-worker
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
