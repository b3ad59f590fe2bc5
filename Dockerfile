# Both binaries in one image: sluice-controller and sluice-runtime.
#   docker build -t sluice:0.1.0 .
# Build stage: the Debian packages of the Makefile's deps list that compile.
FROM debian:bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential pkg-config \
      libevent-dev libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler libgrpc-dev \
      libjansson-dev libyaml-dev libssl-dev libcrypt-dev liburcu-dev libsqlite3-dev \
      libhiredis-dev libpcre2-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile ./
COPY proto proto
COPY common common
COPY policies policies
COPY runtime runtime
COPY controller controller
RUN make -j"$(nproc)" build/bin/sluice-runtime build/bin/sluice-controller \
 && strip build/bin/sluice-runtime build/bin/sluice-controller

# Run stage: only the shared libraries the binaries link, and a non-root user.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
      libevent-2.1-7 libevent-pthreads-2.1-7 libevent-openssl-2.1-7 libnghttp2-14 \
      libprotobuf-c1 libgrpc29 libjansson4 libyaml-0-2 libssl3 libcrypt1 liburcu8 \
      libsqlite3-0 libhiredis0.14 libpcre2-8-0 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 sluice \
 && useradd --system --uid 10001 --gid sluice --home-dir /var/lib/sluice --shell /usr/sbin/nologin sluice \
 && install -d -o sluice -g sluice /var/lib/sluice
COPY --from=build /src/build/bin/sluice-runtime /src/build/bin/sluice-controller /usr/local/bin/
USER 10001:10001
WORKDIR /var/lib/sluice
# runtime: 8080 http, 8443 https, 9901 admin; controller: 9090 REST, 18000 stream
EXPOSE 8080 8443 9901 9090 18000
ENTRYPOINT []
CMD ["sluice-runtime", "--help"]
