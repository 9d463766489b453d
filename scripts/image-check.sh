#!/usr/bin/env bash
# Builds the Dockerfile with podman and runs the image for real: the broker serves gRPC and
# /metrics from inside the container, a job is enqueued, leased and acked through it, it runs as
# UID 10001 with /data as its volume, a job outlives the container, and SIGTERM stops it with
# exit code 0; then cluster mode: etcd run from the same image, and a node (--cluster-etcd,
# replication factor 1) through which a job is enqueued, leased and acked. Ends with "image-check: N passed, N failed"; exits non-zero on any failure.
#
#   scripts/image-check.sh
#
# Needs root and Debian's podman, runc and debootstrap (no Docker engine, no registry: the base
# image is debootstrapped from Debian's mirror and imported as debian:bookworm-slim).
# Environment:
#   JOBBROKER_TOOLS_CACHE  cache folder (default ~/.cache/jobbroker-tools): the base image
#                          tarball, and the podman image store unless IMAGE_CHECK_CACHE=0
#   IMAGE_CHECK_CACHE=0    build in a temporary image store (every layer rebuilt, then deleted)
#   IMAGE_CHECK_STORE_MAX_GB  wipe the cached store first when it is larger (default 20)
#   IMAGE_CHECK_CCACHE=0   compile without the host's ccache (lent to the build when installed)
#   BUILD                  the host build tree whose quickstart does lease+ack (default build)
#   JOBS                   compile jobs inside the image build (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${JOBBROKER_TOOLS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/jobbroker-tools}
build_dir=${BUILD:-build}
jobs=${JOBS:-2}
image=localhost/jobbroker:image-check
base=docker.io/library/debian:bookworm-slim
# Bump the suffix when the recipe in make_base changes, so caches are rebuilt.
base_tar=$cache/debian-bookworm-slim-v1.tar
uid=10001

passed=0
failed=0
skipped=0
pass() { passed=$((passed + 1)); echo "  ok    $*"; }
fail() { failed=$((failed + 1)); echo "  FAIL  $*"; }
skip() { skipped=$((skipped + 1)); echo "  skip  $*"; }
# show_logs CONTAINER LINES: the end of a container's output, indented under a failure.
show_logs() { pm logs "$1" 2>&1 | tail -"$2" | sed 's/^/        /'; }
# log_has CONTAINER PATTERN: the container's log so far has a line matching PATTERN. Read whole
# first: `pm logs | grep -q` fails under pipefail when grep stops reading before podman has
# written everything (SIGPIPE), so a line followed by others could be reported missing.
log_has() {
  local out
  out=$(pm logs "$1" 2>&1) || true
  grep -q -- "$2" <<<"$out"
}
say() { echo "image-check: $*"; }
# check NAME COMMAND...: one counted check; the command's output is shown only on failure.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then pass "$name"; else fail "$name"; printf '%s\n' "$out" | tail -20 | sed 's/^/        /'; fi
}
summary() {
  local line="image-check: $passed passed, $failed failed"
  [ "$skipped" -eq 0 ] || line+=", $skipped skipped"
  echo "$line"
}

if [ "$(id -u)" -ne 0 ]; then
  echo "image-check: needs root (podman with --root, debootstrap)" >&2
  exit 2
fi
missing=()
for tool in podman runc debootstrap curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -ne 0 ]; then
  echo "image-check: missing ${missing[*]}; install them with" >&2
  echo "  apt-get install -y --no-install-recommends podman runc debootstrap curl" >&2
  exit 2
fi

mkdir -p "$cache"
work=$(mktemp -d /tmp/image-check.XXXXXX)
if [ "${IMAGE_CHECK_CACHE:-1}" = 0 ]; then
  store=$work/storage
  runroot=$work/run
else
  store=$cache/podman
  # podman records its run root in the store and refuses another one later, so a cached store
  # has a fixed one (one per store); the lock keeps two runs from sharing it.
  runroot=/run/jobbroker-image-check-$(printf '%s' "$store" | md5sum | cut -c1-8)
  exec 9>"$cache/podman.lock"
  flock -w 1800 9 || { echo "image-check: another run holds $cache/podman.lock" >&2; rm -rf "$work"; exit 2; }
  # vfs copies the whole tree for every layer, and each changed source leaves a build behind.
  max_gb=${IMAGE_CHECK_STORE_MAX_GB:-20}
  if [ -d "$store" ] && [ "$(du -sx --block-size=1G "$store" | cut -f1)" -gt "$max_gb" ]; then
    echo "image-check: $store is over ${max_gb} GB; starting it afresh"
    rm -rf "$store" "$runroot"
  fi
fi
# vfs, cgroupfs and a file event log work in this sandbox (no overlay on overlay, no systemd).
podman_flags=(--root "$store" --runroot "$runroot" --tmpdir "$runroot/libpod" --storage-driver vfs
              --cgroup-manager cgroupfs --events-backend file)
pm() { TMPDIR=$work/tmp podman "${podman_flags[@]}" "$@"; }
if [ "${IMAGE_CHECK_CACHE:-1}" != 0 ]; then
  # A store whose recorded paths differ (made by hand or an older version of this script) loses
  # only its container database, not its images; then containers a killed run left are removed.
  pm info >/dev/null 2>&1 || rm -f "$store/libpod/bolt_state.db"
  pm rm -a -f -v -t 0 >/dev/null 2>&1 || true
  pm volume prune -f >/dev/null 2>&1 || true
fi
# The limits podman would copy from this host are above what the sandbox lets a container set.
limits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
run_flags=(--runtime runc "${limits[@]}")
mkdir -p "$work/tmp"

containers=()
volume=jobbroker-image-check-$$
cleanup() {
  local c
  for c in "${containers[@]}"; do pm rm -f -v -t 0 "$c" >/dev/null 2>&1 || true; done
  pm volume rm -f "$volume" >/dev/null 2>&1 || true
  # A temporary store goes with $work; a cached one keeps the image and its intermediate layers,
  # the next build's cache (it is wiped when it outgrows IMAGE_CHECK_STORE_MAX_GB).
  # Nothing may stay mounted under the folder about to be deleted (a container's /dev/shm).
  local m
  for m in $(awk -v w="$work/" -v r="$runroot/" 'index($2, w) == 1 || index($2, r) == 1 {print $2}' \
    /proc/mounts | sort -r); do
    umount -l "$m" || true
  done
  rm -rf "$work"  # a cached store's run root stays: podman would otherwise redo its state
}
trap cleanup EXIT

now() { date +%s; }
elapsed() { echo "$(($(now) - $1))s"; }

# ---- the base image: debian:bookworm-slim's recipe (minbase, no docs/man/locales, the same
# apt sources), debootstrapped once and cached as a tarball.
make_base() {
  local root=$work/rootfs
  say "debootstrap --variant=minbase bookworm (cached afterwards in $base_tar)"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    return 1
  }
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  printf 'Acquire::GzipIndexes "true";\nAcquire::CompressionTypes::Order:: "gz";\n' \
    >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
  printf 'APT::AutoRemove::SuggestsImportant "false";\n' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/{man,info,groff,lintian,linda}/* "$root"/usr/share/locale/*
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/*.log "$root"/tmp/*
  : >"$root/etc/machine-id"
  tar --numeric-owner --xattrs -C "$root" -cf "$base_tar.partial" .
  mv "$base_tar.partial" "$base_tar"
  rm -rf "$root"
}

total_start=$(now)
say "podman $(podman --version | awk '{print $3}'), store $store"

t=$(now)
if [ -s "$base_tar" ]; then
  say "base image from cache: $base_tar"
  base_time="cached"
else
  make_base
  base_time=$(elapsed "$t")
fi
if ! pm image exists "$base"; then
  pm import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' "$base_tar" "$base" >/dev/null
fi
check "base image $base is in the store" pm image exists "$base"

# ---- build
say "podman build (Release, -j$jobs; a cold build compiles for several minutes)"
# The host's ccache, when it has one, is lent to the build (Dockerfile: CCACHE): the objects the
# host's release build compiled are copied instead of compiled again, and the check still builds
# the image by its own recipe. IMAGE_CHECK_CCACHE=0 builds without it.
ccache_args=()
if [ "${IMAGE_CHECK_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  ccache_dir=$(ccache --get-config cache_dir)
  mkdir -p "$ccache_dir"
  ccache_args=(--volume "$ccache_dir:/ccache" --build-arg CCACHE=ON)
  say "compiling through the host's ccache ($ccache_dir)"
fi
t=$(now)
# --format docker keeps HEALTHCHECK (OCI image configs have no field for it); --pull=never: the
# base comes from the store, never a registry; --network=host: apt inside RUN.
if pm build --isolation chroot --network=host --pull=never --format docker \
  "${limits[@]}" "${ccache_args[@]}" --build-arg "JOBS=$jobs" --build-arg "VERSION=image-check" \
  --build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  -t "$image" -f Dockerfile . >"$work/build.log" 2>&1; then
  build_time=$(elapsed "$t")
  build_time+=" ($(grep -c -- '--> Using cache' "$work/build.log" || true) of $(grep -c '^\[[0-9]/[0-9]\] STEP ' "$work/build.log" || true) steps cached)"
  pass "podman build in $build_time"
else
  build_time=$(elapsed "$t")
  fail "podman build ($build_time)"
  tail -40 "$work/build.log" | sed 's/^/        /'
  summary
  exit 1
fi
size_bytes=$(pm image inspect --format '{{.Size}}' "$image")
size_mb=$((size_bytes / 1000 / 1000))

# ---- the image's configuration
config() { pm image inspect --format "$1" "$image"; }
expect() {  # expect NAME ACTUAL WANTED
  if [ "$2" = "$3" ]; then pass "$1"; else fail "$1: got '$2', want '$3'"; fi
}
expect "runs as user 10001:10001" "$(config '{{.Config.User}}')" "$uid:$uid"
expect "declares VOLUME /data" "$(config '{{range $k, $v := .Config.Volumes}}{{$k}} {{end}}')" "/data "
expect "exposes 7070 and 8080" "$(config '{{range $k, $v := .Config.ExposedPorts}}{{$k}} {{end}}')" "7070/tcp 8080/tcp "
expect "stop signal SIGTERM" "$(config '{{.Config.StopSignal}}')" "SIGTERM"
expect "entrypoint is the broker" "$(config '{{json .Config.Entrypoint}}')" '["jobbroker"]'
expect "default args listen on 0.0.0.0 with /data" "$(config '{{json .Config.Cmd}}')" \
  '["--listen","0.0.0.0:7070","--http-listen","0.0.0.0:8080","--data-dir","/data"]'
expect "OCI title label" "$(config '{{index .Config.Labels "org.opencontainers.image.title"}}')" "jobbroker"
expect "OCI version label from ARG" "$(config '{{index .Config.Labels "org.opencontainers.image.version"}}')" "image-check"
expect "HEALTHCHECK runs jobbroker-cli health" "$(config '{{json .Config.Healthcheck.Test}}')" \
  '["CMD","jobbroker-cli","--timeout","3s","health"]'

# Every shared library the binaries load is in the runtime stage (ldd reports none missing), and
# no build tool came along.
ldd_out=$(pm run --rm "${run_flags[@]}" --network none --entrypoint /bin/sh "$image" -c \
  'ldd /usr/local/bin/jobbroker /usr/local/bin/jobbroker-cli' 2>&1) || true
if grep -q "libgrpc++" <<<"$ldd_out" && ! grep -q "not found" <<<"$ldd_out"; then
  pass "every shared library of jobbroker and jobbroker-cli resolves"
else
  fail "shared libraries"
  grep "not found" <<<"$ldd_out" | sed 's/^/        /'
fi
check "no compiler, cmake or -dev headers in the runtime image" \
  pm run --rm "${run_flags[@]}" --network none --entrypoint /bin/sh "$image" -c \
  '! command -v cc && ! command -v cmake && ! test -e /usr/include/grpcpp && test -z "$(ls /var/lib/apt/lists | grep -v -e lock -e partial -e auxfiles)"'

# ---- the default command: 0.0.0.0:7070 and 0.0.0.0:8080 in a network namespace of its own.
c=jobbroker-image-check-default-$$
containers+=("$c")
# Its HEALTHCHECK is run by hand below (podman's timers need systemd; stderr says so).
pm run -d --name "$c" "${run_flags[@]}" --network none "$image" >/dev/null 2>"$work/run.err"
wait_serving() {  # wait_serving CONTAINER: prints "GRPC HTTP" from the serving line
  local i line
  for i in $(seq 1 120); do
    line=$(pm logs "$1" 2>/dev/null | grep -m1 '^jobbroker: serving ' || true)
    if [ -n "$line" ]; then
      sed -E 's/^jobbroker: serving grpc=([^ ]+) http=([^ ]+).*/\1 \2/' <<<"$line"
      return 0
    fi
    [ "$(pm inspect --format '{{.State.Running}}' "$1" 2>/dev/null)" = true ] || break
    sleep 0.5
  done
  return 1
}
if addrs=$(wait_serving "$c"); then
  expect "default command serves on 0.0.0.0:7070 and :8080" "$addrs" "0.0.0.0:7070 0.0.0.0:8080"
  check "the image's HEALTHCHECK passes (jobbroker-cli health on \$JOBBROKER_ADDRESS)" \
    pm healthcheck run "$c"
else
  fail "default command: no serving line"
  show_logs "$c" 20
fi
pm rm -f -v -t 0 "$c" >/dev/null 2>&1 || true

# The other containers run without the HEALTHCHECK: the check script probes them itself.
run_flags+=(--no-healthcheck)

# ---- HTTPS for /metrics (--http-tls-cert): OpenSSL's runtime is in the image and the TLS front
# works there. A throwaway self-signed certificate; the key is world-readable only because it
# is a test's.
tls=$work/tls
mkdir -p "$tls"
if openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
  -keyout "$tls/key.pem" -out "$tls/cert.pem" >"$work/openssl.log" 2>&1; then
  chmod 0755 "$tls" && chmod 0644 "$tls/key.pem" "$tls/cert.pem"
  c=jobbroker-image-check-https-$$
  containers+=("$c")
  pm run -d --name "$c" "${run_flags[@]}" --network host -v "$tls:/tls:ro" "$image" \
    --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir /data \
    --http-tls-cert /tls/cert.pem --http-tls-key /tls/key.pem >/dev/null
  if addrs=$(wait_serving "$c"); then
    check "/metrics over HTTPS from the container (--http-tls-cert)" \
      curl -fsS --max-time 5 --cacert "$tls/cert.pem" -o /dev/null "https://${addrs#* }/metrics"
  else
    fail "the broker with --http-tls-cert never printed its serving line"
    show_logs "$c" 20
  fi
  pm rm -f -v -t 0 "$c" >/dev/null 2>&1 || true
else
  fail "openssl could not make a test certificate"
  tail -5 "$work/openssl.log" | sed 's/^/        /'
fi
# ---- the broker on the host network, data in a named volume. Port 0: the broker picks free
# ports and prints them.
pm volume create "$volume" >/dev/null
start_broker() {  # start_broker NAME
  containers+=("$1")
  pm run -d --name "$1" "${run_flags[@]}" --network host -v "$volume:/data" "$image" \
    --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir /data --log-format text >/dev/null
}
c=jobbroker-image-check-$$
t=$(now)
start_broker "$c"
if ! addrs=$(wait_serving "$c"); then
  fail "broker in the container never printed its serving line"
  show_logs "$c" 30
  summary
  exit 1
fi
start_time=$(elapsed "$t")
read -r grpc http <<<"$addrs"
pass "broker serves grpc=$grpc http=$http ($start_time to the serving line)"

cli() { pm exec "$c" jobbroker-cli --address "$grpc" --timeout 5s "$@"; }
check "jobbroker-cli health inside the container" cli health
kept_job=$(cli enqueue image-check '{"kept":"across restarts"}' 2>&1) || kept_job=""
if [[ "$kept_job" =~ ^[0-9A-Z]{26}$ ]]; then pass "enqueue through the container's gRPC: $kept_job"; else fail "enqueue: $kept_job"; fi
# A schedule in a zone other than UTC: the runtime image must carry the tz database.
zoned=$(cli schedule put image-check-nightly \
  '{"cron":"30 2 * * *","timeZone":"Europe/Berlin","template":{"queue":"image-check-nightly"}}' 2>&1) || true
if [[ "$zoned" == "image-check-nightly active, next run "* ]]; then
  pass "a cron schedule in Europe/Berlin is accepted (tzdata in the image)"
else
  fail "schedule put in Europe/Berlin: $zoned"
fi

quickstart=$build_dir/client/cpp/quickstart
acked_job=""
if [ -x "$quickstart" ]; then
  if out=$("$quickstart" "$grpc" 2>&1) && grep -q "is JOB_STATE_COMPLETED" <<<"$out"; then
    acked_job=$(awk '/ is JOB_STATE_COMPLETED/{print $1}' <<<"$out")
    pass "enqueue, lease and ack from the host ($quickstart): $acked_job completed"
  else
    fail "quickstart lease+ack: $out"
  fi
else
  skip "lease+ack: $quickstart is not built (make build)"
fi
host_cli=$build_dir/client/cpp/jobbroker-cli
if [ -x "$host_cli" ]; then
  check "host jobbroker-cli reaches the container" "$host_cli" --address "$grpc" --timeout 5s health
fi

metrics=$(curl -fsS --max-time 5 "http://$http/metrics" 2>&1) || metrics=""
if grep -Eq '^jobbroker_enqueued_total\{[^}]*queue="image-check"[^}]*\} [1-9]' <<<"$metrics"; then
  pass "/metrics: jobbroker_enqueued_total{queue=\"image-check\"} counted the job"
else
  fail "/metrics has no jobbroker_enqueued_total for queue image-check"
  grep '^jobbroker_' <<<"$metrics" | head -10 | sed 's/^/        /'
fi
check "/healthz and /readyz answer 200" curl -fsS --max-time 5 -o /dev/null "http://$http/healthz" \
  -o /dev/null "http://$http/readyz"

pid=$(pm inspect --format '{{.State.Pid}}' "$c")
expect "the broker process runs as UID 10001 (host view, no user namespace)" \
  "$(ps -o uid= -p "$pid" | tr -d ' ')" "$uid"
expect "id inside the container" "$(pm exec "$c" id -u):$(pm exec "$c" id -g)" "$uid:$uid"
expect "/data is the named volume" \
  "$(pm inspect --format '{{range .Mounts}}{{.Destination}}={{.Name}} {{end}}' "$c")" "/data=$volume "
vol_dir=$(pm volume inspect --format '{{.Mountpoint}}' "$volume")
if [ -f "$vol_dir/CURRENT" ] && [ "$(stat -c %u "$vol_dir/CURRENT")" = "$uid" ]; then
  pass "RocksDB files are in the volume, owned by 10001"
else
  fail "RocksDB files in the volume: $(ls -ln "$vol_dir" 2>&1 | head -5)"
fi

# ---- SIGTERM: graceful stop, exit code 0
stop_and_check() {  # stop_and_check CONTAINER LABEL
  local t0 code
  t0=$(now)
  pm stop -t 30 "$1" >/dev/null
  code=$(pm inspect --format '{{.State.ExitCode}}' "$1")
  expect "$2: podman stop (SIGTERM) exits 0 in $(elapsed "$t0")" "$code" 0
}
stop_and_check "$c" "first container"
# conmon may still be writing the last lines when podman stop returns.
logged=no
for _ in $(seq 1 20); do
  if log_has "$c" 'stopped'; then logged=yes; break; fi
  sleep 0.25
done
if [ "$logged" = yes ] && log_has "$c" 'shutting_down'; then
  pass "the broker logged shutting_down and stopped"
else
  fail "the broker's log does not end with shutting_down and stopped"
  show_logs "$c" 5
fi

# ---- a new container on the same volume still has the jobs
c=jobbroker-image-check-restart-$$
start_broker "$c"
if addrs=$(wait_serving "$c"); then
  read -r grpc http <<<"$addrs"
  job_state() { cli --json get "$1" | tr -d ' \n' | grep -o '"state":"[A-Z_]*"' | cut -d'"' -f4; }
  [ -z "$kept_job" ] || expect "the enqueued job survived the restart, still ready" \
    "$(job_state "$kept_job" 2>&1)" JOB_STATE_READY
  [ -z "$acked_job" ] || expect "the acked job survived the restart, completed" \
    "$(job_state "$acked_job" 2>&1)" JOB_STATE_COMPLETED
  stop_and_check "$c" "restarted container"
else
  fail "restarted container never served"
  show_logs "$c" 20
fi

# ---- cluster mode: etcd from the same image (what the Helm chart's chart-managed etcd runs),
# and one node of replication factor 1 on it. Host network, so ports are picked here: etcd's
# cannot be 0.
free_port() {  # prints a port nothing on this machine listens on (nor on the one after it)
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 10000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}
etcd_version=$(pm run --rm "${run_flags[@]}" --network none --entrypoint etcd "$image" --version 2>&1 | head -1) || true
if [[ "$etcd_version" =~ ^etcd\ Version:\ 3\.4\. ]]; then
  pass "etcd is in the image: $etcd_version"
else
  fail "etcd --version in the image: $etcd_version"
fi
etcd_port=$(free_port) || etcd_port=23790
etcd_url=http://127.0.0.1:$etcd_port
peer_url=http://127.0.0.1:$((etcd_port + 1))
e=jobbroker-image-check-etcd-$$
containers+=("$e")
# As the chart runs it: the image's user, the data under /data, logs as JSON on stderr.
pm run -d --name "$e" "${run_flags[@]}" --network host --entrypoint etcd "$image" \
  --name "$e" --data-dir /data/etcd --logger zap --log-outputs stderr \
  --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url" \
  --initial-cluster "$e=$peer_url" --initial-cluster-state new \
  --initial-cluster-token "image-check-$$" >/dev/null
etcd_health=""
for _ in $(seq 1 60); do
  etcd_health=$(curl -fsS --max-time 2 "$etcd_url/health" 2>/dev/null) || etcd_health=""
  [[ "$etcd_health" == *'"health":"true"'* ]] && break
  sleep 0.5
done
if [[ "$etcd_health" == *'"health":"true"'* ]]; then
  pass "etcd from the image serves as UID $(pm exec "$e" id -u) ($etcd_url/health: $etcd_health)"
  c=jobbroker-image-check-node-$$
  containers+=("$c")
  node_id=image-check-0
  pm run -d --name "$c" "${run_flags[@]}" --network host "$image" \
    --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir /data --log-format text \
    --cluster-etcd "$etcd_url" --cluster-name "image-check-$$" --node-id "$node_id" \
    --partitions 2 --replication-factor 1 --min-in-sync 1 >/dev/null
  if addrs=$(wait_serving "$c"); then
    read -r grpc http <<<"$addrs"
    if log_has "$c" "cluster_joined advertised=$grpc"; then
      pass "a cluster node serves grpc=$grpc and joined the cluster in etcd"
    else
      fail "the cluster node's log has no cluster_joined advertised=$grpc"
      show_logs "$c" 20
    fi
    # Both partitions get their leader (this node) within a few ticks of the placement.
    led=0
    for _ in $(seq 1 40); do
      led=$(cli --json cluster 2>/dev/null | grep -o "\"leaderNodeId\": *\"$node_id\"" | wc -l) || led=0
      [ "$led" -eq 2 ] && break
      sleep 0.25
    done
    expect "jobbroker-cli cluster: both partitions led by $node_id" "$led" 2
    cluster_job=$(cli enqueue image-check-cluster '{"cluster":true}' 2>&1) || cluster_job=""
    if [[ "$cluster_job" =~ ^[0-9A-Z]{26}$ ]]; then
      pass "enqueue through the cluster node: $cluster_job"
    else
      fail "enqueue through the cluster node: $cluster_job"
    fi
    if [ -x "$quickstart" ]; then
      if out=$("$quickstart" "$grpc" 2>&1) && grep -q "is JOB_STATE_COMPLETED" <<<"$out"; then
        job=$(awk '/ is JOB_STATE_COMPLETED/{print $1}' <<<"$out")
        expect "enqueue, lease and ack through the cluster node ($quickstart): $job, as the node reads it" \
          "$(cli --json get "$job" 2>&1 | tr -d ' \n' | grep -o '"state":"[A-Z_]*"' | cut -d'"' -f4)" \
          JOB_STATE_COMPLETED
      else
        fail "quickstart lease+ack through the cluster node: $out"
      fi
    else
      skip "cluster lease+ack: $quickstart is not built (make build)"
    fi
    metrics=$(curl -fsS --max-time 5 "http://$http/metrics" 2>&1) || metrics=""
    if grep -Eq "^jobbroker_cluster_partition_leader\{[^}]*\} 1" <<<"$metrics"; then
      pass "/metrics of the cluster node: jobbroker_cluster_partition_leader"
    else
      fail "/metrics of the cluster node has no jobbroker_cluster_partition_leader 1"
      grep '^jobbroker_cluster' <<<"$metrics" | head -10 | sed 's/^/        /'
    fi
    stop_and_check "$c" "cluster node"
    for _ in $(seq 1 20); do
      log_has "$c" 'stopped' && break
      sleep 0.25
    done
    if log_has "$c" ' handed_over '; then
      pass "the cluster node handed its partitions over on SIGTERM (handed_over in its log)"
    else
      fail "the cluster node's log has no handed_over"
      show_logs "$c" 5
    fi
  else
    fail "the cluster node never printed its serving line"
    show_logs "$c" 30
  fi
  pm rm -f -v -t 0 "$c" >/dev/null 2>&1 || true
else
  fail "etcd from the image never answered $etcd_url/health"
  show_logs "$e" 20
fi
pm rm -f -v -t 0 "$e" >/dev/null 2>&1 || true

echo
say "image $image: ${size_mb} MB; base ${base_time}, build ${build_time}, serving in ${start_time}, total $(elapsed "$total_start")"
summary
[ "$failed" -eq 0 ]
