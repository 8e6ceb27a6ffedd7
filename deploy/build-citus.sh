#!/bin/sh
# Build and install Citus 13.2.2 (the distributed store of docs/scale.md)
# into this machine's PostgreSQL 15, from the source tarball: Debian 12 has
# no package for it. Safe to run any number of times: when the installed
# extension is already this version nothing is done, and the unpacked,
# compiled tree is kept in a cache directory so that a reinstall does not
# compile again.
#
#   deploy/build-citus.sh            # build if needed, install
#   IDEMPROXY_CITUS_TARBALL=/path/citus-13.2.2.tar.gz deploy/build-citus.sh
#
# Exit status is non-zero, with a line saying why, when the tarball cannot
# be found, does not match its checksum, or the build fails: the tests that
# need Citus fail then, they do not skip.
set -eu
cd "$(dirname "$0")/.."

VERSION=13.2.2
SHA256=dd2453caec20a830e5e63f1def5c5a98cb6f57ae510407cdcd800916fcdab430
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
CACHE=${IDEMPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idemproxy}
SRC="$CACHE/citus-$VERSION"

say() { echo "build-citus: $*"; }
die() { echo "build-citus: $*" >&2; exit 1; }

installed_version() {
  ctl="$("$PG_CONFIG" --sharedir)/extension/citus.control"
  so="$("$PG_CONFIG" --pkglibdir)/citus.so"
  [ -f "$ctl" ] && [ -f "$so" ] || return 1
  # The marker is written by this script after a successful install.
  cat "$("$PG_CONFIG" --pkglibdir)/citus.idemproxy-version" 2>/dev/null
}

if [ "$(installed_version || true)" = "$VERSION" ]; then
  say "citus $VERSION is installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

DEPS="postgresql-server-dev-15 liblz4-dev libzstd-dev libkrb5-dev
  libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev make gcc"
missing=""
for p in $DEPS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing="$missing $p"
  fi
done
if [ -n "$missing" ]; then
  say "installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# Where the tarball is: named, or the shared directory beside the clone
# (../shared/citus), or the machine's shared tree.
tarball=""
for t in "${IDEMPROXY_CITUS_TARBALL:-}" "../shared/citus/citus-$VERSION.tar.gz" \
         "/work/shared/citus/citus-$VERSION.tar.gz"; do
  if [ -n "$t" ] && [ -f "$t" ]; then
    tarball=$t
    break
  fi
done
[ -n "$tarball" ] ||
  die "citus-$VERSION.tar.gz not found (set IDEMPROXY_CITUS_TARBALL, or put it in ../shared/citus/)"

if [ ! -f "$SRC/.built" ]; then
  got=$(sha256sum "$tarball" | cut -d' ' -f1)
  [ "$got" = "$SHA256" ] || die "$tarball: sha256 $got, expected $SHA256"
  rm -rf "$SRC"
  mkdir -p "$CACHE"
  tar -xzf "$tarball" -C "$CACHE"
  [ -d "$SRC" ] || die "$tarball did not unpack to citus-$VERSION/"
  # PostgreSQL 15.14 and later export have_createdb_privilege() from
  # commands/dbcommands.h; Citus' compatibility header defines a static
  # one of the same name for PostgreSQL < 16. Rename Citus' copy.
  compat="$SRC/src/include/pg_version_compat.h"
  if ! grep -q 'idemproxy: renamed' "$compat"; then
    awk '
      /have_createdb_privilege\(void\)/ && !done {
        print "/* idemproxy: renamed, PostgreSQL 15.14+ exports this name */"
        print "#define have_createdb_privilege citus_have_createdb_privilege"
        done = 1
      }
      { print }
    ' "$compat" > "$compat.new"
    mv "$compat.new" "$compat"
  fi
  say "building citus $VERSION in $SRC (a few minutes)"
  (cd "$SRC" && ./configure --without-libcurl PG_CONFIG="$PG_CONFIG" >configure.log 2>&1) ||
    die "configure failed: see $SRC/configure.log"
  (cd "$SRC" && make -j"$(nproc)" >make.log 2>&1) ||
    die "make failed: see $SRC/make.log"
  touch "$SRC/.built"
fi

(cd "$SRC" && $SUDO make install >install.log 2>&1) ||
  die "make install failed: see $SRC/install.log"
echo "$VERSION" | $SUDO tee "$("$PG_CONFIG" --pkglibdir)/citus.idemproxy-version" >/dev/null
say "citus $VERSION installed into $("$PG_CONFIG" --pkglibdir)"
