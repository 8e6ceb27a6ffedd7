#!/bin/sh
# Build deploy/Dockerfile for real, with Debian's buildah and podman (no
# Docker daemon needed), and check the image.
#
#   ./deploy/image.sh build   build localhost/idemproxy:dev
#   ./deploy/image.sh check   build it if missing, then run it against the
#                             demo upstream: /healthz, a keyed POST executed
#                             once, its duplicate replayed; print the size
#   ./deploy/image.sh clean   remove the images this script made
#
# The base is debian:bookworm-slim when a registry answers; otherwise (no
# registry here) a minimal bookworm made with debootstrap from the Debian
# mirror apt uses, imported as localhost/debian:bookworm-slim. Storage is
# vfs and builds use chroot isolation, which work without overlay mounts or
# user namespaces. When a container cannot be started at all, `check`
# says which command failed and how, then runs the image's own filesystem
# with chroot as the image's user, which still proves that the runtime stage
# has everything the binary needs. Everything listens on 127.0.0.1; only
# what this script started is stopped.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
IMAGE=${IMAGE:-localhost/idemproxy:dev}
BASE=localhost/debian:bookworm-slim
WORK=${IMAGE_WORK:-/var/tmp/idemproxy-image}
STORAGE="--storage-driver vfs"
PODMAN="podman $STORAGE --cgroup-manager cgroupfs --events-backend file"
BUILDAH="buildah $STORAGE"

log() { echo "image.sh: $*"; }

need_packages() {
  missing=""
  for p in podman buildah debootstrap crun; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
      missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  log "installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

mirror() {
  m=$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/* *$/\1/p' \
        /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
  [ -n "$m" ] || m=$(sed -n 's/^deb \(http[^ ]*\) bookworm .*/\1/p' \
                      /etc/apt/sources.list 2>/dev/null | head -n 1)
  echo "${m:-http://deb.debian.org/debian}"
}

# The base image: pulled, or made here.
base_image() {
  if $PODMAN image exists docker.io/library/debian:bookworm-slim 2>/dev/null ||
     timeout 60 $PODMAN pull -q docker.io/library/debian:bookworm-slim \
       >/dev/null 2>&1; then
    echo docker.io/library/debian:bookworm-slim
    return
  fi
  if ! $PODMAN image exists "$BASE" 2>/dev/null; then
    log "no registry answers: debootstrap bookworm from $(mirror)" >&2
    rm -rf "$WORK/rootfs"
    mkdir -p "$WORK"
    debootstrap --variant=minbase bookworm "$WORK/rootfs" "$(mirror)" \
      >"$WORK/debootstrap.log" 2>&1 ||
      { log "debootstrap failed, see $WORK/debootstrap.log" >&2; exit 1; }
    # as the official slim image: no documentation but the copyright
    # files, now and for what apt installs later
    r="$WORK/rootfs"
    cat >"$r/etc/dpkg/dpkg.cfg.d/slim" <<'CFG'
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
           "$r/var/cache/apt/archives/"*.deb "$r/var/lib/apt/lists/"*
    tar -C "$r" -c . | $PODMAN import \
      --change 'CMD ["bash"]' - "$BASE" >/dev/null 2>&1
    rm -rf "$WORK/rootfs"
  fi
  echo "$BASE"
}

build() {
  need_packages
  base=$(base_image)
  log "building $IMAGE from deploy/Dockerfile on $base"
  start=$(date +%s)
  $BUILDAH bud --isolation chroot --layers=false \
    --build-arg "DEBIAN_IMAGE=$base" -f deploy/Dockerfile \
    --ignorefile deploy/Dockerfile.dockerignore -t "$IMAGE" . \
    >"$WORK.build.log" 2>&1 ||
    { tail -n 30 "$WORK.build.log"; log "build failed, log in $WORK.build.log"; exit 1; }
  log "built $IMAGE in $(( $(date +%s) - start )) s (log $WORK.build.log)"
  size
}

size() {
  bytes=$($PODMAN image inspect --format '{{.Size}}' "$IMAGE")
  log "image size: $bytes bytes ($((bytes / 1024 / 1024)) MiB)"
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

started=""
mnt_ctr=""
cleanup() {
  for pid in $started; do kill -TERM "$pid" 2>/dev/null || true; done
  $PODMAN rm -f idemproxy-image-check >/dev/null 2>&1 || true
  if [ -n "$mnt_ctr" ]; then
    $BUILDAH umount "$mnt_ctr" >/dev/null 2>&1 || true
    $BUILDAH rm "$mnt_ctr" >/dev/null 2>&1 || true
  fi
}

wait_ok() {
  i=0
  until curl -fsS -o /dev/null "$1" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 100 ] || return 1
    sleep 0.1
  done
}

# A keyed POST executes once; its duplicate is replayed.
exercise() {
  key="image-$(date +%s)-$$"
  a=$(curl -fsS -D - -X POST "http://127.0.0.1:$PORT/orders" \
        -H "Idempotency-Key: $key" -d '{"item":1}')
  b=$(curl -fsS -D - -X POST "http://127.0.0.1:$PORT/orders" \
        -H "Idempotency-Key: $key" -d '{"item":1}')
  n=$(curl -fsS "http://127.0.0.1:$UP/__stats" |
        /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['keys'].get('$key', 0))")
  echo "$a" | grep -q '^HTTP/1.1 200' || { log "FAIL: keyed POST: $a"; return 1; }
  echo "$b" | grep -qi '^Idempotent-Replayed: true' ||
    { log "FAIL: the duplicate was not replayed: $b"; return 1; }
  [ "$n" = 1 ] || { log "FAIL: executed $n times at the upstream"; return 1; }
  log "keyed POST executed once, its duplicate replayed (Idempotent-Replayed: true)"
}

check() {
  need_packages
  $PODMAN image exists "$IMAGE" 2>/dev/null || build
  [ -x build/tests/support/stub_upstream ] || {
    [ -f build/build.ninja ] || meson setup build -Dbuildtype=release >/dev/null
    meson compile -C build >/dev/null
  }
  trap cleanup EXIT
  UP=$(free_port); PORT=$(free_port); ADMIN=$(free_port)
  build/tests/support/stub_upstream --listen "127.0.0.1:$UP" >"$WORK.stub.log" 2>&1 &
  started="$!"
  wait_ok "http://127.0.0.1:$UP/"
  args="--upstream http://127.0.0.1:$UP --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:$ADMIN"
  # shellcheck disable=SC2086
  if $PODMAN run -d --name idemproxy-image-check --network host "$IMAGE" $args \
       >"$WORK.run.log" 2>&1 && wait_ok "http://127.0.0.1:$ADMIN/healthz"; then
    log "container running: /healthz 200"
    exercise
    log "container: $($PODMAN inspect --format '{{.Config.User}}' "$IMAGE") user, entrypoint idemproxy"
  else
    log "a container cannot run here: '$PODMAN run ... $IMAGE' said:"
    sed 's/^/    /' "$WORK.run.log"
    $PODMAN logs idemproxy-image-check 2>/dev/null | sed 's/^/    /' || true
    $PODMAN rm -f idemproxy-image-check >/dev/null 2>&1 || true
    log "falling back to the image's filesystem under chroot, as uid 10001"
    mnt_ctr=$($BUILDAH from "$IMAGE")
    mnt=$($BUILDAH mount "$mnt_ctr")
    # shellcheck disable=SC2086
    chroot --userspec=10001:10001 "$mnt" /usr/local/bin/idemproxy $args \
      >"$WORK.chroot.log" 2>&1 &
    started="$started $!"
    wait_ok "http://127.0.0.1:$ADMIN/healthz" ||
      { cat "$WORK.chroot.log"; log "FAIL: /healthz"; exit 1; }
    log "image filesystem under chroot: /healthz 200"
    exercise
  fi
  size
  log "check passed"
}

case "${1:-}" in
build) mkdir -p "$WORK"; build ;;
check) mkdir -p "$WORK"; check ;;
clean)
  $PODMAN rmi -f "$IMAGE" "$BASE" >/dev/null 2>&1 || true
  rm -rf "$WORK" "$WORK".*.log
  log "removed $IMAGE, $BASE and $WORK"
  ;;
-h|--help|"")
  sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'
  [ -n "${1:-}" ]
  ;;
*) echo "usage: ./deploy/image.sh build|check|clean" >&2; exit 2 ;;
esac
