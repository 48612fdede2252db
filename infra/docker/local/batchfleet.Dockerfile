# batchfleet (the producer: watch, submit, run, status, resume), built here without any registry
# by infra/docker/setup: FROM the imported debootstrap root fs, with the host's binary. The steps
# after the base match infra/images/batchfleet.Dockerfile; keep the two in step.
FROM batchfleet-base:bookworm
RUN groupadd --gid 10001 batchfleet \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/batchfleet batchfleet
COPY bin/batchfleet /usr/local/bin/batchfleet
USER 10001:10001
WORKDIR /home/batchfleet
STOPSIGNAL SIGTERM
ENTRYPOINT ["batchfleet"]
