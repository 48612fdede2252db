# The compose test's RabbitMQ: Debian's rabbitmq-server (installed into the root fs by
# infra/docker/setup) with the management plugin, the role of the official rabbitmq image in
# docker-compose.yml. The user comes from RABBITMQ_DEFAULT_USER / RABBITMQ_DEFAULT_PASS.
FROM batchfleet-rabbitmq-base:bookworm
RUN rabbitmq-plugins enable --offline rabbitmq_management
COPY rabbitmq.conf /etc/rabbitmq/rabbitmq.conf
USER rabbitmq
EXPOSE 5672 15672
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=5s --timeout=10s --start-period=10s --retries=30 \
    CMD ["rabbitmq-diagnostics", "-q", "check_port_connectivity"]
CMD ["rabbitmq-server"]
