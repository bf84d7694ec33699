# Builds outbox-relay, producer-demo and consumer-demo on Debian bookworm (the versions the
# project is tested with), then copies them into a slim runtime image with only the shared
# libraries they link, curl (the compose health checks: the relays' /readyz, the API's
# /healthz) and psql (to look at the database from a program's container).
#
#   docker build -t outbox-relay:local .      (docker-compose.yml does this for you)

FROM debian:bookworm AS build
# The [build] section of the project's one package list, installed by the same script as
# `make deps`; copied on its own first so this layer is rebuilt only when the list changes.
WORKDIR /src
COPY tools/packages.txt tools/install-deps.sh tools/
RUN sh tools/install-deps.sh build && rm -rf /var/lib/apt/lists/*
COPY . .
RUN make -j"$(nproc)" CFLAGS="-O2 -g -Werror" bin/outbox-relay bin/producer-demo bin/consumer-demo

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends libpq5 librdkafka1 libjansson4 libev4 \
        libmicrohttpd12 libhiredis0.14 libavro23 libcurl4 ca-certificates curl postgresql-client \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/bin/outbox-relay /src/bin/producer-demo /src/bin/consumer-demo \
    /usr/local/bin/
# The programs need no privileges; /tmp holds consumer-demo's health file.
USER nobody
WORKDIR /tmp
CMD ["outbox-relay", "run"]
