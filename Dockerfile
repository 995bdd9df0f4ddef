# promptbus service image. Build: docker build -t promptbus .
# Run:   docker run --rm -e KAFKA_BOOTSTRAP_SERVERS=kafka:9092 -v $PWD/examples:/config promptbus run --config /config/tiers.yaml
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY consumer ./consumer
# the plain install, no extras: the service alone (the simulator and dev tools stay out)
RUN pip install --no-cache-dir . && useradd --system --uid 10001 promptbus
USER promptbus
ENV PYTHONUNBUFFERED=1 PROMPTBUS_METRICS_PORT=9464
EXPOSE 9464
ENTRYPOINT ["promptbus"]
CMD ["run"]
