# The compose test's S3 server: moto's server (PyPI, pinned in s3-requirements.txt; it passes
# `batchfleet watch`'s create-only race check), installed offline from wheels the host
# downloaded, FROM the imported debootstrap root fs. Same role as the S3 server of
# docker-compose.yml (S3 API on port 9000; credentials are not checked).
FROM batchfleet-base:bookworm
COPY wheels-s3 /tmp/wheels
COPY s3-requirements.txt /tmp/s3-requirements.txt
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --disable-pip-version-check --no-cache-dir --no-index \
        --find-links /tmp/wheels -r /tmp/s3-requirements.txt \
    && rm -rf /tmp/wheels /tmp/s3-requirements.txt \
    && groupadd --gid 10001 s3 && useradd --uid 10001 --gid 10001 --create-home s3
USER 10001:10001
EXPOSE 9000
HEALTHCHECK --interval=3s --timeout=3s --retries=20 \
    CMD ["/opt/venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9000/moto-api/', timeout=2)"]
ENTRYPOINT ["/opt/venv/bin/moto_server", "-H", "0.0.0.0", "-p", "9000"]
