#!/bin/sh
# Build deploy/Dockerfile for real, with Debian's buildah and podman (no
# Docker daemon needed), and check the image.
#
#   ./deploy/image.sh build   build localhost/idemproxy:dev
#   ./deploy/image.sh check   build it if missing, then run it against the
#                             stub upstream: /healthz, a keyed POST executed
#                             once, its duplicate replayed, the image's own
#                             HEALTHCHECK, SIGTERM; print the size
#   ./deploy/image.sh clean   remove the images and files this script made
#
# The base is debian:bookworm-slim when a registry answers; otherwise a
# minimal bookworm made with debootstrap from the Debian mirror apt uses,
# slimmed like the official image and imported as
# localhost/debian:bookworm-slim (the Dockerfile's DEBIAN_IMAGE). Storage is
# vfs and builds use chroot isolation: no overlay mount, user namespace or
# daemon needed. The image is built in docker format, which keeps the
# HEALTHCHECK (the OCI format drops it).
#
# `check` runs the container with host networking, trying crun then runc,
# each with podman's default resource limits and then with limits no higher
# than this shell's (a host without CAP_SYS_RESOURCE refuses to raise them),
# and says which command failed and how. When no container can start at
# all, it runs the image's own filesystem with chroot as the image's user,
# which still proves the runtime stage has everything the binary needs.
# Everything listens on 127.0.0.1; every step is bounded in time; only the
# processes and the container this script started are stopped.
#
# Environment: IMAGE (localhost/idemproxy:dev), IMAGE_WORK
# (/var/tmp/idemproxy-image), IMAGE_HOST_BUILD (build-img: the host build
# directory for the stub upstream).
# shellcheck disable=SC2086 # $PODMAN, $BUILDAH, $ARGS are word lists
set -eu
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/idemproxy:dev}
BASE=localhost/debian:bookworm-slim
HUB_BASE=docker.io/library/debian:bookworm-slim
WORK=${IMAGE_WORK:-/var/tmp/idemproxy-image}
HOST_BUILD=${IMAGE_HOST_BUILD:-build-img}
CTR=idemproxy-image-check-$$
PODMAN="podman --storage-driver vfs --cgroup-manager cgroupfs --events-backend file"
BUILDAH="buildah --storage-driver vfs"

log() { echo "image.sh: $*"; }
die() { log "FAIL: $*"; exit 1; }
indent() { sed 's/^/    /' "$@"; }

need_packages() {
  missing=""
  for p in podman buildah debootstrap crun runc curl python3; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
      missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  log "installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq
  timeout 900 apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# The Debian archive (not debian-security) in apt's sources.
mirror() {
  m=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)\/* *$/\1/p' \
        /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
  [ -n "$m" ] || m=$(sed -n 's/^deb \(http[^ ]*\/debian\)\/* bookworm .*/\1/p' \
                      /etc/apt/sources.list 2>/dev/null | head -n 1)
  echo "${m:-http://deb.debian.org/debian}"
}

# Make $BASE: debootstrap, then what the official slim image does.
make_base() {
  r="$WORK/rootfs"
  rm -rf "$r"
  log "debootstrap --variant=minbase bookworm from $(mirror) (log $WORK/debootstrap.log)"
  t0=$(date +%s)
  timeout 1200 debootstrap --variant=minbase bookworm "$r" "$(mirror)" \
    >"$WORK/debootstrap.log" 2>&1 ||
    { tail -n 20 "$WORK/debootstrap.log"; die "debootstrap (log $WORK/debootstrap.log)"; }
  # apt inside the image uses the archives the host's apt uses, updates
  # and security included (debootstrap writes only the main suite).
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$r/etc/apt/sources.list.d/"
    rm -f "$r/etc/apt/sources.list"
  elif grep -q '^deb ' /etc/apt/sources.list 2>/dev/null; then
    grep '^deb ' /etc/apt/sources.list >"$r/etc/apt/sources.list"
  fi
  # No documentation but the copyright files, now and for what apt
  # installs later.
  cat >"$r/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
CFG
  find "$r/usr/share/doc" -type f ! -name copyright -delete
  rm -rf "$r/usr/share/man/"* "$r/usr/share/info/"* "$r/usr/share/locale/"* \
         "$r/usr/share/lintian/"* "$r/var/cache/apt/"*.bin \
         "$r/var/cache/apt/archives/"*.deb "$r/var/lib/apt/lists/"* \
         "$r/var/log/"*.log
  tar -C "$r" -c . | timeout 600 $PODMAN import --change 'CMD ["bash"]' - "$BASE" \
    >"$WORK/import.log" 2>&1 || { indent "$WORK/import.log"; die "podman import"; }
  rm -rf "$r"
  log "made $BASE in $(( $(date +%s) - t0 )) s: $(( $($PODMAN image inspect --format '{{.Size}}' "$BASE") / 1000000 )) MB"
}

# The base image's name: pulled, or made here. Messages on stderr.
base_image() {
  if $PODMAN image exists "$HUB_BASE" 2>/dev/null ||
     timeout 120 $PODMAN pull -q "$HUB_BASE" >"$WORK/pull.log" 2>&1; then
    echo "$HUB_BASE"
    return
  fi
  if ! $PODMAN image exists "$BASE" 2>/dev/null; then
    log "$HUB_BASE cannot be pulled:" >&2
    indent "$WORK/pull.log" >&2
    make_base >&2
  fi
  echo "$BASE"
}

build() {
  need_packages
  base=$(base_image)
  log "building $IMAGE from deploy/Dockerfile on $base (log $WORK/build.log)"
  t0=$(date +%s)
  timeout 2400 $BUILDAH bud --isolation chroot --layers=false --format docker \
    --build-arg "DEBIAN_IMAGE=$base" -f deploy/Dockerfile \
    --ignorefile deploy/Dockerfile.dockerignore -t "$IMAGE" . \
    >"$WORK/build.log" 2>&1 ||
    { tail -n 30 "$WORK/build.log"; die "buildah bud (log $WORK/build.log)"; }
  log "built $IMAGE in $(( $(date +%s) - t0 )) s"
  size
}

size() {
  bytes=$($PODMAN image inspect --format '{{.Size}}' "$IMAGE")
  log "image size: $bytes bytes ($((bytes / 1000000)) MB, $((bytes / 1048576)) MiB)"
}

started=""
mnt_ctr=""
ctr_made=""
cleanup() {
  for pid in $started; do kill -TERM "$pid" 2>/dev/null || true; done
  [ -z "$ctr_made" ] || $PODMAN rm -f -t 0 "$CTR" >/dev/null 2>&1 || true
  if [ -n "$mnt_ctr" ]; then
    $BUILDAH umount "$mnt_ctr" >/dev/null 2>&1 || true
    $BUILDAH rm "$mnt_ctr" >/dev/null 2>&1 || true
  fi
}

# wait_ok URL [PID]: up to 10 s for a 2xx; gives up early when PID ends.
wait_ok() {
  i=0
  until curl -fsS --max-time 2 -o /dev/null "$1" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 100 ] || return 1
    [ -z "${2:-}" ] || kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
}

# The stub upstream from a host build; its port is the one it reports.
start_stub() {
  if [ ! -x "$HOST_BUILD/tests/support/stub_upstream" ]; then
    command -v meson >/dev/null || die "meson missing: run ./deploy/install-deps.sh"
    [ -f "$HOST_BUILD/build.ninja" ] ||
      timeout 300 meson setup "$HOST_BUILD" -Dbuildtype=release >"$WORK/stub-build.log" 2>&1 ||
      { indent "$WORK/stub-build.log"; die "meson setup $HOST_BUILD"; }
    timeout 600 meson compile -C "$HOST_BUILD" stub_upstream >>"$WORK/stub-build.log" 2>&1 ||
      { tail -n 30 "$WORK/stub-build.log"; die "meson compile -C $HOST_BUILD stub_upstream"; }
  fi
  "$HOST_BUILD/tests/support/stub_upstream" --listen 127.0.0.1:0 \
    >"$WORK/stub.log" 2>&1 &
  started="$started $!"
  i=0
  until UP=$(sed -n 's/^listening 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$WORK/stub.log") &&
        [ -n "$UP" ]; do
    i=$((i + 1))
    [ $i -lt 100 ] || { indent "$WORK/stub.log"; die "stub upstream did not start"; }
    sleep 0.1
  done
  log "stub upstream on 127.0.0.1:$UP"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A keyed POST executes once; its duplicate is replayed.
exercise() {
  key="image-$(date +%s)-$$"
  a=$(curl -sS --max-time 10 -D - -X POST "http://127.0.0.1:$PORT/orders" \
        -H "Idempotency-Key: $key" -H 'Content-Type: application/json' \
        -d '{"item":1}') || die "keyed POST: curl failed"
  b=$(curl -sS --max-time 10 -D - -X POST "http://127.0.0.1:$PORT/orders" \
        -H "Idempotency-Key: $key" -H 'Content-Type: application/json' \
        -d '{"item":1}') || die "duplicate POST: curl failed"
  n=$(curl -fsS --max-time 10 "http://127.0.0.1:$UP/__stats" |
        python3 -c "import json,sys; print(json.load(sys.stdin)['keys'].get('$key', 0))")
  echo "$a" | head -n 1 | grep -q '^HTTP/1.1 200' || die "keyed POST: $a"
  echo "$b" | head -n 1 | grep -q '^HTTP/1.1 200' || die "duplicate POST: $b"
  echo "$b" | grep -qi '^Idempotent-Replayed: true' ||
    die "the duplicate was not replayed: $b"
  [ "$n" = 1 ] || die "executed $n times at the upstream"
  log "keyed POST executed once, its duplicate replayed (Idempotent-Replayed: true; upstream count $n)"
}

# Limits no higher than podman's own: it keeps RLIMIT_NOFILE at the hard
# limit it can reach and lowers RLIMIT_NPROC to 32768.
limits() {
  nofile=$(prlimit --nofile --noheadings -o HARD | tr -d ' ')
  nproc=$(prlimit --nproc --noheadings -o HARD | tr -d ' ')
  [ "$nofile" != unlimited ] || nofile=1048576
  [ "$nproc" != unlimited ] && [ "$nproc" -lt 32768 ] || nproc=32768
  echo "--ulimit nofile=$nofile:$nofile --ulimit nproc=$nproc:$nproc"
}

# try_run RUNTIME LIMITS: start the container; 0 once /healthz answers.
try_run() {
  cmd="$PODMAN --runtime $1 run -d --name $CTR --network host --log-driver k8s-file $2 -e IDEMPROXY_LISTEN=127.0.0.1:$PORT -e IDEMPROXY_ADMIN_LISTEN=127.0.0.1:$ADMIN $IMAGE $ARGS"
  ctr_made=1
  if timeout 120 $cmd >"$WORK/run.log" 2>&1 &&
     wait_ok "http://127.0.0.1:$ADMIN/healthz"; then
    return 0
  fi
  log "'$cmd' failed:"
  indent "$WORK/run.log"
  $PODMAN logs "$CTR" 2>/dev/null | indent || true
  $PODMAN rm -f -t 0 "$CTR" >/dev/null 2>&1 || true
  ctr_made=""
  return 1
}

in_container() {
  log "container running (runtime $runtime${lim:+, $lim}): /healthz 200"
  exercise
  uid=$(timeout 60 $PODMAN exec "$CTR" id -u 2>&1) || die "podman exec id -u: $uid"
  [ "$uid" = 10001 ] || die "runs as uid $uid, not 10001"
  log "runs as uid $uid, entrypoint $($PODMAN image inspect --format '{{json .Config.Entrypoint}}' "$IMAGE")"
  hc=$(timeout 60 $PODMAN healthcheck run "$CTR" 2>&1) ||
    die "podman healthcheck run: $hc"
  log "the image's HEALTHCHECK: ${hc:-healthy}"
  t0=$(date +%s)
  timeout 60 $PODMAN stop -t 25 "$CTR" >/dev/null 2>&1 || die "podman stop"
  rc=$($PODMAN inspect --format '{{.State.ExitCode}}' "$CTR")
  [ "$rc" = 0 ] || { $PODMAN logs "$CTR" | indent; die "SIGTERM: exit status $rc"; }
  log "podman stop (SIGTERM): exit status 0 after $(( $(date +%s) - t0 )) s"
}

in_chroot() {
  log "no container can start here (each command and its error above);" \
      "running the image's filesystem under chroot as uid 10001 instead"
  mnt_ctr=$($BUILDAH from "$IMAGE")
  mnt=$($BUILDAH mount "$mnt_ctr")
  env -i IDEMPROXY_LISTEN=127.0.0.1:$PORT IDEMPROXY_ADMIN_LISTEN=127.0.0.1:$ADMIN \
    /usr/sbin/chroot --userspec=10001:10001 "$mnt" /usr/local/bin/idemproxy $ARGS \
    >"$WORK/chroot.log" 2>&1 &
  pid=$!
  started="$started $pid"
  wait_ok "http://127.0.0.1:$ADMIN/healthz" "$pid" ||
    { indent "$WORK/chroot.log"; die "/healthz"; }
  log "image filesystem under chroot: /healthz 200"
  exercise
  kill -TERM "$pid"
  rc=0; wait "$pid" || rc=$?
  [ "$rc" = 0 ] || { indent "$WORK/chroot.log"; die "SIGTERM: exit status $rc"; }
  log "SIGTERM: exit status 0"
}

check() {
  need_packages
  $PODMAN image exists "$IMAGE" 2>/dev/null || build
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  start_stub
  PORT=$(free_port); ADMIN=$(free_port)
  # the addresses as the image is told them, by environment: its
  # HEALTHCHECK asks the port of IDEMPROXY_ADMIN_LISTEN
  ARGS="--upstream http://127.0.0.1:$UP"
  ok=""
  for runtime in crun runc; do
    for lim in "" "$(limits)"; do
      if try_run "$runtime" "$lim"; then ok=1; break 2; fi
    done
  done
  if [ -n "$ok" ]; then in_container; else in_chroot; fi
  size
  log "check passed"
}

case "${1:-}" in
build) mkdir -p "$WORK"; build ;;
check) mkdir -p "$WORK"; check ;;
clean)
  $PODMAN rmi -f "$IMAGE" "$BASE" >/dev/null 2>&1 || true
  rm -rf "$WORK"
  log "removed $IMAGE, $BASE and $WORK ($HOST_BUILD is left)"
  ;;
-h|--help) sed -n '2,/^set -eu/p' "$0" | sed '/^# shellcheck/d; $d; s/^# \{0,1\}//' ;;
*) echo "usage: ./deploy/image.sh build|check|clean|--help" >&2; exit 2 ;;
esac
