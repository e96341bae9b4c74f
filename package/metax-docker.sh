#!/usr/bin/env bash
# Build the metax-docker installers (SPEC §10). `make metax-docker VERSION=x.y.z` and
# package/build.sh (the offline package) call this.
#
#   package/metax-docker.sh VERSION [--out DIR] [--arch "x86_64 aarch64"]
#
# Writes DIR/metax-docker_VERSION.tar (default DIR <repo>/dist) holding one installer per
# architecture, metax-docker_VERSION.ARCH.run (see package/metax-docker.run.in: install /
# uninstall / verify / version). Each carries the same zipapp: src/gpuk8s/metax_docker with
# gpuk8s.core and gpuk8s.discovery, stdlib only, run by the host's python3 (>= 3.8).
# Reproducible: fixed order, owner and times (SOURCE_DATE_EPOCH, else the last commit's).
set -euo pipefail

PKG_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$PKG_DIR/.." && pwd)"
die() { printf '[metax-docker] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

VERSION="" OUT_DIR="$REPO_DIR/dist" ARCHES="x86_64 aarch64"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT_DIR="${2:?--out needs a directory}"; shift 2 ;;
        --arch) ARCHES="${2:?--arch needs a list}"; shift 2 ;;
        -h|--help) usage ;;
        -*) die "unknown option $1" ;;
        *) [ -z "$VERSION" ] || die "one VERSION only"; VERSION="$1"; shift ;;
    esac
done
[ -n "$VERSION" ] || usage
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
    die "VERSION must be SemVer like 1.2.3 or 1.2.3-rc.1, not '$VERSION'"
for arch in $ARCHES; do
    [[ "$arch" =~ ^[a-z0-9_]+$ ]] || die "architecture '$arch' is not a uname -m name (x86_64, aarch64 ...)"
done
PYTHON="${PYTHON:-python3}"

EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$REPO_DIR" log -1 --format=%ct 2>/dev/null || echo 0)}"
[ -n "$EPOCH" ] || EPOCH=0
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT

# The zipapp: only the stdlib-only packages (import-linter keeps metax_docker on core and
# discovery), entries sorted with fixed times, so the bytes depend on the sources only.
"$PYTHON" - "$REPO_DIR/src" "$STAGE/metax-docker.pyz" "$EPOCH" <<'PY'
import sys
import time
import zipfile
from pathlib import Path

src, out, epoch = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
stamp = time.gmtime(max(epoch, 315532800))[:6]  # zip dates start in 1980
files = [src / "gpuk8s/__init__.py"]
for package in ("core", "discovery", "metax_docker"):
    files += sorted((src / "gpuk8s" / package).glob("*.py"))
entries = [(f.relative_to(src).as_posix(), f.read_bytes()) for f in files]
entries.append(("__main__.py", b"import sys\n\nfrom gpuk8s.metax_docker.main import main\n\n"
                               b"sys.exit(main())\n"))
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
    for name, data in sorted(entries):
        info = zipfile.ZipInfo(name, stamp)
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(info, data)
PY

TEMPLATE="$PKG_DIR/metax-docker.run.in"
lines="$(wc -l <"$TEMPLATE")"
sha="$(sha256sum "$STAGE/metax-docker.pyz" | cut -d' ' -f1)"
names=()
for arch in $ARCHES; do
    name="metax-docker_${VERSION}.${arch}.run"
    sed -e "s/@VERSION@/$VERSION/g" -e "s/@ARCH@/$arch/g" -e "s/@PAYLOAD_LINE@/$((lines + 1))/g" \
        -e "s/@PAYLOAD_SHA256@/$sha/g" "$TEMPLATE" >"$STAGE/$name"
    [ "$(wc -l <"$STAGE/$name")" -eq "$lines" ] || die "metax-docker.run.in: substitution changed the line count"
    cat "$STAGE/metax-docker.pyz" >>"$STAGE/$name"
    chmod 0755 "$STAGE/$name"
    touch -d "@$EPOCH" "$STAGE/$name"
    names+=("$name")
done
mkdir -p "$OUT_DIR"
mapfile -t names < <(printf '%s\n' "${names[@]}" | LC_ALL=C sort)
tar -C "$STAGE" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" --format=gnu \
    -cf "$OUT_DIR/metax-docker_${VERSION}.tar.tmp" "${names[@]}"
mv "$OUT_DIR/metax-docker_${VERSION}.tar.tmp" "$OUT_DIR/metax-docker_${VERSION}.tar"
printf '[metax-docker] wrote %s\n' "$OUT_DIR/metax-docker_${VERSION}.tar" >&2
echo "$OUT_DIR/metax-docker_${VERSION}.tar"
