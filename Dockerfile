# The jobbroker image: the broker and jobbroker-cli on debian:bookworm-slim, built from source
# against Debian 12's own gRPC, protobuf, Abseil, RocksDB and prometheus-cpp (the same packages
# scripts/install-deps.sh installs), so the runtime stage needs only their shared libraries; plus
# Debian 12's etcd (3.4), so that one image runs both the nodes of a cluster and its etcd
# (docs/cluster.md; the Helm chart's chart-managed etcd runs `etcd` from this image).
#
#   docker build -t jobbroker .            # or: podman build --format docker -t jobbroker .
#   docker run -p 7070:7070 -p 8080:8080 -v jobbroker-data:/data jobbroker
#   docker run --entrypoint etcd jobbroker --version
#
# Arguments after the image name replace all of CMD, so pass --data-dir /data with them.
# scripts/image-check.sh builds this file and runs the image for real.

ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---- build: compiler, CMake and the -dev packages; only the two shipped binaries are built.
# golang-etcd-server-dev is there for etcd's .proto files only (cluster/etcd compiles its etcd
# client from them); its Go sources come along but nothing here builds Go.
FROM ${DEBIAN_IMAGE} AS build

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential \
      ccache \
      cmake \
      golang-etcd-server-dev \
      libabsl-dev \
      libgrpc++-dev \
      libjemalloc-dev \
      libprotobuf-dev \
      librocksdb-dev \
      ninja-build \
      pkg-config \
      prometheus-cpp-dev \
      protobuf-compiler \
      protobuf-compiler-grpc \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# .dockerignore lets in only what this build reads (CMakeLists.txt, VERSION, cmake/ proto/ core/ storage/
# node/ cluster/ server/ client/cpp/ ui/), so a change to tests, docs, the chart or another
# language's client keeps this layer and the build below cached.
COPY . .

# Parallel compile jobs: 2 suits a 2-core machine; raise it on a bigger one.
# JOBBROKER_BUILD_TESTS=OFF: no tests/, bench/ or GoogleTest. JOBBROKER_BUILD_CLUSTER=ON (the
# default, spelt out): cluster mode (--cluster-etcd) is in the binary.
# CCACHE=ON compiles through ccache with its cache in /ccache: a builder that mounts a cache
# there (scripts/image-check.sh lends the host's, `podman build -v DIR:/ccache`) reuses what it
# already compiled. Without a mount the objects stay in this stage and no build reuses them, so
# the default is OFF. The build directory is /src/build, where the host's release build sits in
# its checkout, so ccache (CMakeLists.txt) sees the same relative paths in both.
ARG JOBS=2
ARG CCACHE=OFF
RUN cmake -S . -B /src/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DJOBBROKER_BUILD_TESTS=OFF \
      -DJOBBROKER_BUILD_CLUSTER=ON -DJOBBROKER_CCACHE="${CCACHE}" \
 && CCACHE_DIR=/ccache cmake --build /src/build --parallel "${JOBS}" --target jobbroker jobbroker-cli \
 && install -D --strip -m 0755 /src/build/server/jobbroker /out/jobbroker \
 && install -D --strip -m 0755 /src/build/client/cpp/jobbroker-cli /out/jobbroker-cli

# ---- runtime: the shared libraries the two binaries load (ldd + dpkg -S), tzdata (the IANA zones
# of recurring schedules: absl reads /usr/share/zoneinfo), and etcd-server
# (/usr/bin/etcd, a Go binary that loads only libc) for the etcd members of a cluster. Nothing
# else: no etcdctl, no tools beyond the base image's.
FROM ${DEBIAN_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      etcd-server \
      libabsl20220623 \
      libbz2-1.0 \
      libc-ares2 \
      libcivetweb1 \
      libgrpc++1.51 \
      libgrpc29 \
      libjemalloc2 \
      liblz4-1 \
      libprometheus-cpp-core1.0 \
      libprotobuf32 \
      libre2-9 \
      libsnappy1v5 \
      libssl3 \
      libzstd1 \
      tzdata \
      zlib1g \
 && rm -rf /var/lib/apt/lists/*

# A fixed UID/GID, so a volume or a Kubernetes securityContext (runAsUser/fsGroup 10001) can
# match it.
RUN groupadd --system --gid 10001 jobbroker \
 && useradd --system --uid 10001 --gid jobbroker --no-create-home --home-dir /data \
      --shell /usr/sbin/nologin jobbroker \
 && mkdir -p /data \
 && chown jobbroker:jobbroker /data \
 && chmod 0750 /data

COPY --from=build /out/ /usr/local/bin/

USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 7070 8080
# jobbroker-cli (and the HEALTHCHECK) dial this: set it too when --listen changes the port.
ENV JOBBROKER_ADDRESS=127.0.0.1:7070

# SIGTERM: stop leasing, let in-flight calls finish, flush, exit 0 (podman/docker stop).
STOPSIGNAL SIGTERM
# Kubernetes ignores this (the chart has its own probes); docker and podman --format docker use it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["jobbroker-cli", "--timeout", "3s", "health"]

# Last, so a new version or commit changes only this metadata, not the layers above.
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE_URL=https://jobbroker.dev
LABEL org.opencontainers.image.title="jobbroker" \
      org.opencontainers.image.description="A durable job broker: jobs over gRPC, kept in RocksDB, with retries, leases and a dead set" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="debian:bookworm-slim"

ENTRYPOINT ["jobbroker"]
CMD ["--listen", "0.0.0.0:7070", "--http-listen", "0.0.0.0:8080", "--data-dir", "/data"]
