# batchfleet (the producer: watch, submit, run, status, resume) for users: a release build in
# the official Rust image, run on Debian slim. `docker compose build` builds it
# (docker-compose.yml); by hand, from the repository root:
#   docker build -f infra/images/batchfleet.Dockerfile -t batchfleet .
# infra/docker/setup builds the same image here without any registry
# (infra/docker/local/batchfleet.Dockerfile): keep the runtime steps of the two in step.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p batchfleet-producer --bin batchfleet \
    && cp target/release/batchfleet /batchfleet

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates python3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 batchfleet \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/batchfleet batchfleet
COPY --from=build /batchfleet /usr/local/bin/batchfleet
USER 10001:10001
WORKDIR /home/batchfleet
STOPSIGNAL SIGTERM
ENTRYPOINT ["batchfleet"]
