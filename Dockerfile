# thaw and the model simulator, built from source on Debian, run as non-root.
#   docker build -t thaw:0.1.0 .
#   docker run --rm thaw:0.1.0 --version
FROM debian:bookworm-slim AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential meson ninja-build pkg-config ca-certificates \
      libevent-dev libcurl4-openssl-dev libcjson-dev libyaml-dev libssl-dev node-llhttp \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY meson.build meson_options.txt ./
COPY include include
COPY src src
COPY tests/sim tests/sim
COPY loadtest/coldstart_client.c loadtest/costsim.c loadtest/
RUN mkdir -p tests && printf "if get_option('fuzz')\nendif\n" > tests/meson.build \
 && meson setup /build --buildtype=release -Db_ndebug=false --prefix=/usr \
 && ninja -C /build thaw thaw-model-sim thaw-costsim \
 && DESTDIR=/out ninja -C /build install

FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates libevent-2.1-7 libevent-core-2.1-7 libcurl4 libcjson1 libyaml-0-2 libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 thaw \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --shell /usr/sbin/nologin thaw
COPY --from=build /out/usr/bin/thaw /out/usr/bin/thaw-model-sim /out/usr/bin/thaw-costsim /usr/bin/
RUN ["/usr/bin/thaw", "--version"]
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/usr/bin/thaw"]
CMD ["--config", "/etc/thaw/config.json"]
