#!/usr/bin/env bash
# Build the project's container images without a Docker daemon and without pulling.
#
#   images/build.sh system     [--import] [--push]   pause, kube-scheduler, lab-busybox (from scratch)
#   images/build.sh components [--import] [--push]   gpu-device, gpu-dra, gpu-label, gpu-aware, gpu-exporter,
#                                                     driver-manager, container-runtime, operator-controller
#   images/build.sh payloads   [--import] [--push]   the operator's payload images for the lab: a
#                                                     simulated driver (driver-image), its SDK
#                                                     (maca-c500), a newer driver and a broken
#                                                     driver image
#   images/build.sh base                              the debootstrapped Debian + python3 base tarball
#   images/build.sh all        [--import] [--push]
#
# Outputs OCI archives under ${GPUK8S_BUILD_DIR:-<repo>/build}/images/ (one per image) and a
# manifest images.txt (archive, reference). --import loads them into containerd's k8s.io
# namespace (ctr); --push copies them to the registry with skopeo.
#
# Component images: the Containerfile is built with buildah, else podman, else docker
# (IMAGE_BUILDER=buildah|podman|docker to choose). BASE is, unless given, a minimal
# Debian bookworm + python3 bootstrapped here with debootstrap (cached under
# ${GPUK8S_CACHE:-/var/cache/gpuk8s}/rootfs) and imported as localhost/gpuk8s/base:bookworm.
#
# Environment: IMAGE_REGISTRY (default 127.0.0.1:5000/gpuk8s), IMAGE_VERSION (default: the
# package version), PUSH_TLS_VERIFY (default false), DEBIAN_MIRROR.
set -euo pipefail

IMAGES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$IMAGES_DIR/.." && pwd)"
# shellcheck source=lab/versions.sh
. "$REPO_DIR/lab/versions.sh"
CACHE="${GPUK8S_CACHE:-/var/cache/gpuk8s}"
BUILD_DIR="${GPUK8S_BUILD_DIR:-$REPO_DIR/build}"
OUT="$BUILD_DIR/images"
IMAGE_REGISTRY="${IMAGE_REGISTRY:-127.0.0.1:5000/gpuk8s}"
PUSH_TLS_VERIFY="${PUSH_TLS_VERIFY:-false}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_IMAGE_LOCAL=localhost/gpuk8s/base:bookworm
COMPONENTS=(gpu-device gpu-dra gpu-label gpu-aware gpu-exporter driver-manager container-runtime operator-controller)
PAUSE_REF="${PAUSE_REF:-registry.k8s.io/pause:3.10-gpuk8s}"
SCHEDULER_REF="registry.k8s.io/kube-scheduler:$KUBE_VERSION"
BUSYBOX_REF="${IMAGE_REGISTRY%/*}/gpuk8s/lab-busybox:1.0"

log() { printf '[images %s] %s\n' "$(date -u +%T)" "$*" >&2; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

PYTHON="${PYTHON:-$(command -v python3)}"

package_version() {
    "$PYTHON" - "$REPO_DIR/src/gpuk8s/__init__.py" <<'EOF'
import re, sys
m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', open(sys.argv[1]).read(), re.M)
print(m.group(1) if m else "0.0.0")
EOF
}
IMAGE_VERSION="${IMAGE_VERSION:-$(package_version)}"

# record ARCHIVE REF: remember what was built (images.txt), for --import/--push and packaging.
record() {
    mkdir -p "$OUT"
    touch "$OUT/images.txt"
    grep -v " $2\$" "$OUT/images.txt" >"$OUT/images.txt.tmp" || true
    echo "$1 $2" >>"$OUT/images.txt.tmp"
    mv "$OUT/images.txt.tmp" "$OUT/images.txt"
    echo "$1 $2"
}

# ---------------------------------------------------------------- from-scratch system images
build_pause() {
    local work="$BUILD_DIR/work/pause"
    mkdir -p "$work"
    gcc -static -Os -Wall -Werror -o "$work/pause" "$IMAGES_DIR/pause/pause.c"
    strip "$work/pause"
    "$PYTHON" "$IMAGES_DIR/ociimage.py" --ref "$PAUSE_REF" --out "$OUT/pause.oci.tar" \
        --layer "$work/pause=/pause:0755" --entrypoint /pause --user 65535:65535 >/dev/null
    record "$OUT/pause.oci.tar" "$PAUSE_REF"
}

build_scheduler() {
    local bin="$CACHE/bin/kube-$KUBE_VERSION/kube-scheduler"
    [ -x "$bin" ] || bin="$("$REPO_DIR/lab/tools.sh" kube)/kube-scheduler"
    # kube-scheduler is static (CGO_ENABLED=0); the image is just the binary, like upstream's
    # distroless one. /tmp is needed for its self-signed serving cert.
    "$PYTHON" "$IMAGES_DIR/ociimage.py" --ref "$SCHEDULER_REF" --out "$OUT/kube-scheduler.oci.tar" \
        --layer "$bin=/usr/local/bin/kube-scheduler:0755,@$(mktemp -d)=/tmp" \
        --entrypoint /usr/local/bin/kube-scheduler --env PATH=/usr/local/bin:/bin >/dev/null
    record "$OUT/kube-scheduler.oci.tar" "$SCHEDULER_REF"
}

build_busybox() {
    # A small image for lab tests (sh, sleep, ls, cat, env, wget). From Debian's busybox-static.
    local bb=/bin/busybox
    if [ ! -x "$bb" ] || ! { ldd "$bb" 2>&1 || true; } | grep -q 'not a dynamic'; then
        die "a static /bin/busybox is needed (apt-get install busybox-static)"
    fi
    local specs="$bb=/bin/busybox:0755" applet
    for applet in sh ls cat env sleep echo wget ps grep head tail mount id true false test date hostname nslookup mkdir seq httpd nc stat; do
        specs+=",L:/bin/$applet=busybox"
    done
    "$PYTHON" "$IMAGES_DIR/ociimage.py" --ref "$BUSYBOX_REF" --out "$OUT/lab-busybox.oci.tar" \
        --layer "$specs" --cmd sh >/dev/null
    record "$OUT/lab-busybox.oci.tar" "$BUSYBOX_REF"
}

# ---------------------------------------------------------------- payload images (lab)
# What driver-manager's payload containers run (docs/operator.md: payload images): the simulator's
# driver / SDK trees (gpuk8s sim payload) plus a static busybox for sh, cp and sleep.
LAB_DRIVER_VERSION="${LAB_DRIVER_VERSION:-2.33.0.6}"
LAB_SDK_VERSION="${LAB_SDK_VERSION:-2.33.0.4}"
LAB_SDK_TAG="$LAB_SDK_VERSION-ubuntu22.04-amd64"
# a tag whose image holds another driver version than it says ("wrong version inside")
LAB_BAD_DRIVER_TAG="${LAB_BAD_DRIVER_TAG:-2.34.0.1}"
# a second good driver, newer: the target of the fleet's rolling upgrade (test_fleet_schemes.py)
LAB_DRIVER_NEXT_VERSION="${LAB_DRIVER_NEXT_VERSION:-2.35.0.6}"

payload_image() {  # payload_image NAME TAG TREE IMAGEDIR
    local name="$1" tag="$2" tree="$3" where="$4" specs="/bin/busybox=/bin/busybox:0755" applet
    for applet in sh cp mkdir rm mv cat sleep test echo ls; do specs+=",L:/bin/$applet=busybox"; done
    local ref="$IMAGE_REGISTRY/$name:$tag" archive="$OUT/payload-$name-$tag.oci.tar"
    "$PYTHON" "$IMAGES_DIR/ociimage.py" --ref "$ref" --out "$archive" \
        --layer "$specs" --layer "@$tree=$where" --env PATH=/bin --cmd sh >/dev/null
    record "$archive" "$ref"
}

build_payloads() {
    local gpuk8s work="$BUILD_DIR/work/payloads"
    gpuk8s="$("$REPO_DIR/lab/pyenv.sh")/bin/gpuk8s"
    rm -rf "$work"; mkdir -p "$work"
    "$gpuk8s" sim payload driver --version "$LAB_DRIVER_VERSION" --out "$work/driver" >/dev/null
    "$gpuk8s" sim payload maca --version "$LAB_SDK_VERSION" --out "$work/maca" >/dev/null
    payload_image driver-image "$LAB_DRIVER_VERSION" "$work/driver" /driver
    payload_image driver-image "$LAB_BAD_DRIVER_TAG" "$work/driver" /driver
    "$gpuk8s" sim payload driver --version "$LAB_DRIVER_NEXT_VERSION" --out "$work/driver-next" >/dev/null
    payload_image driver-image "$LAB_DRIVER_NEXT_VERSION" "$work/driver-next" /driver
    payload_image maca-c500 "$LAB_SDK_TAG" "$work/maca" /opt/maca
}

# ---------------------------------------------------------------- base rootfs (debootstrap)
base_tarball() {
    local tarball="$CACHE/rootfs/bookworm-python3.tar"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || die "debootstrap missing (apt-get install debootstrap)"
        local t0 root
        t0=$(date +%s)
        root="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
        mkdir -p "$CACHE/rootfs"
        log "debootstrap bookworm (minbase + python3) into $root"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" \
            "$DEBIAN_MIRROR" >"$CACHE/rootfs/debootstrap.log" 2>&1 ||
            { tail -20 "$CACHE/rootfs/debootstrap.log" >&2; die "debootstrap failed"; }
        # Small: no docs, man pages, locales, apt caches or lists.
        rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
            "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/* "$root"/tmp/*
        find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
        echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >>"$root/etc/passwd"
        echo 'nonroot:x:65532:' >>"$root/etc/group"
        mkdir -p "$root/home/nonroot" && chown 65532:65532 "$root/home/nonroot"
        tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$root"
        log "base tarball $(du -h "$tarball" | cut -f1) in $(( $(date +%s) - t0 ))s"
    fi
    echo "$tarball"
}

# ---------------------------------------------------------------- component images
choose_builder() {
    if [ -n "${IMAGE_BUILDER:-}" ]; then echo "$IMAGE_BUILDER"; return; fi
    local b
    for b in buildah podman docker; do
        if command -v "$b" >/dev/null 2>&1; then
            # docker without a reachable daemon cannot build.
            if [ "$b" = docker ] && ! docker info >/dev/null 2>&1; then continue; fi
            echo "$b"; return
        fi
    done
    die "no image builder: install buildah (apt-get install buildah) or podman, or run a Docker daemon"
}

import_base() {
    local builder="$1" tarball
    tarball="$(base_tarball)"
    case "$builder" in
        buildah)
            if ! buildah inspect --type image "$BASE_IMAGE_LOCAL" >/dev/null 2>&1; then
                local ctr
                ctr="$(buildah from scratch)"
                buildah add --quiet "$ctr" "$tarball" / >/dev/null
                buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
                    --cmd /bin/bash "$ctr"
                buildah commit --quiet --rm "$ctr" "$BASE_IMAGE_LOCAL" >/dev/null
            fi ;;
        podman|docker)
            "$builder" image inspect "$BASE_IMAGE_LOCAL" >/dev/null 2>&1 ||
                "$builder" import --change 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE_LOCAL" >/dev/null ;;
    esac
}

# Wheels for the image: the gpuk8s wheel from this checkout plus its dependencies as
# manylinux wheels for CPython 3.11 (bookworm's python3), so the image build is offline.
build_wheels() {
    local ctx="$1" wheels="$1/wheels"
    rm -rf "$wheels"; mkdir -p "$wheels" "$CACHE/wheels"
    "$PYTHON" -m pip wheel -q --no-deps -w "$wheels" "$REPO_DIR" >"$BUILD_DIR/work/pip-wheel.log" 2>&1 ||
        { tail -20 "$BUILD_DIR/work/pip-wheel.log" >&2; die "pip wheel of $REPO_DIR failed"; }
    local whl
    whl="$(ls "$wheels"/gpuk8s-*.whl)"
    # pip download copies the gpuk8s wheel into the cache and, next time, skips it as
    # "already downloaded" and resolves from that stale copy (same file name, old code,
    # old dependencies): keep gpuk8s itself out of the cache.
    rm -f "$CACHE"/wheels/gpuk8s-*.whl
    # Offline first (the cache usually holds everything), then from PyPI.
    local pipargs=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi abi3
        --abi none --platform manylinux_2_36_x86_64 --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
    "$PYTHON" -m pip download -q -d "$CACHE/wheels" --no-index --find-links "$CACHE/wheels" "${pipargs[@]}" \
        "$whl" >"$BUILD_DIR/work/pip-download.log" 2>&1 ||
    "$PYTHON" -m pip download -q -d "$CACHE/wheels" --only-binary=:all: \
        --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
        --platform manylinux_2_36_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
        "$whl" >"$BUILD_DIR/work/pip-download.log" 2>&1 ||
        { tail -20 "$BUILD_DIR/work/pip-download.log" >&2; die "pip download of the dependencies failed"; }
    rm -f "$CACHE"/wheels/gpuk8s-*.whl
    # Only what this wheel needs (the cache may hold older versions too).
    "$PYTHON" -m pip install -q --dry-run --ignore-installed --no-index --find-links "$CACHE/wheels" \
        --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
        --platform manylinux_2_36_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any --target "$BUILD_DIR/work/dry" \
        --report "$BUILD_DIR/work/pip-report.json" "$whl" >/dev/null 2>&1 || true
    if [ -s "$BUILD_DIR/work/pip-report.json" ]; then
        "$PYTHON" - "$BUILD_DIR/work/pip-report.json" "$CACHE/wheels" "$wheels" <<'EOF'
import json, os, shutil, sys, urllib.parse
report, cache, dest = sys.argv[1:]
for item in json.load(open(report))["install"]:
    url = item["download_info"]["url"]
    path = urllib.parse.unquote(urllib.parse.urlparse(url).path)
    if os.path.dirname(path) == cache:
        shutil.copy2(path, dest)
EOF
    else
        cp "$CACHE"/wheels/*.whl "$wheels/"
    fi
}

build_components() {
    local builder ctx t0
    builder="$(choose_builder)"
    log "component images with $builder, version $IMAGE_VERSION, registry $IMAGE_REGISTRY"
    mkdir -p "$BUILD_DIR/work" "$OUT"
    ctx="$BUILD_DIR/work/context"
    rm -rf "$ctx"; mkdir -p "$ctx"
    t0=$(date +%s); build_wheels "$ctx"; log "wheels in $(( $(date +%s) - t0 ))s"
    local base="${BASE_IMAGE:-$BASE_IMAGE_LOCAL}"
    # Same inputs as the last build and every archive present: reuse them (warm lab/up).
    local stamp c ref archive
    stamp="$(cd "$ctx" && { cat "$IMAGES_DIR/Containerfile"; echo "$base $IMAGE_REGISTRY $IMAGE_VERSION";
        "$PYTHON" -c 'import sys, zipfile, hashlib; z = zipfile.ZipFile(sys.argv[1]); h = hashlib.sha256()
for n in sorted(z.namelist()): h.update(n.encode() + z.read(n))
print(h.hexdigest())' wheels/gpuk8s-*.whl; sha256sum wheels/*.whl | grep -v ' wheels/gpuk8s-'; } |
        sha256sum | cut -c1-32)"
    if [ "$(cat "$OUT/components.stamp" 2>/dev/null)" = "$stamp" ]; then
        local all=1
        for c in "${COMPONENTS[@]}"; do [ -s "$OUT/$c.oci.tar" ] || all=0; done
        if [ "$all" = 1 ]; then
            log "component images up to date (inputs unchanged): reusing $OUT"
            for c in "${COMPONENTS[@]}"; do record "$OUT/$c.oci.tar" "$IMAGE_REGISTRY/$c:$IMAGE_VERSION"; done
            return 0
        fi
    fi
    rm -f "$OUT/components.stamp"
    if [ -z "${BASE_IMAGE:-}" ]; then t0=$(date +%s); import_base "$builder"; log "base in $(( $(date +%s) - t0 ))s"; fi
    for c in "${COMPONENTS[@]}"; do
        t0=$(date +%s)
        ref="$IMAGE_REGISTRY/$c:$IMAGE_VERSION"
        archive="$OUT/$c.oci.tar"
        rm -f "$archive"
        case "$builder" in
            buildah)
                buildah bud --quiet --layers --isolation chroot --network host --build-arg "BASE=$base" \
                    -f "$IMAGES_DIR/Containerfile" --target "$c" -t "$ref" "$ctx" >/dev/null
                buildah push --quiet "$ref" "oci-archive:$archive:$ref" >/dev/null ;;
            podman)
                podman build --quiet --layers --build-arg "BASE=$base" -f "$IMAGES_DIR/Containerfile" \
                    --target "$c" -t "$ref" "$ctx" >/dev/null
                podman save --format oci-archive -o "$archive" "$ref" ;;
            docker)
                docker build --quiet --build-arg "BASE=$base" -f "$IMAGES_DIR/Containerfile" \
                    --target "$c" -t "$ref" "$ctx" >/dev/null
                docker save -o "$archive" "$ref" ;;
        esac
        log "$c: $ref in $(( $(date +%s) - t0 ))s"
        record "$archive" "$ref"
    done
    echo "$stamp" >"$OUT/components.stamp"
}

# ---------------------------------------------------------------- import / push
import_images() {
    local archive ref
    while read -r archive ref; do
        [ -n "$archive" ] || continue
        ctr -n k8s.io images import "$archive" >/dev/null
        # (no `ctr | grep -q`: with pipefail, grep's early exit fails the pipeline)
        case $'\n'"$(ctr -n k8s.io images ls -q)"$'\n' in
            *$'\n'"$ref"$'\n'*) ;;
            *) die "import of $archive did not yield $ref" ;;
        esac
        log "imported $ref into containerd (k8s.io)"
    done <"$1"
}

push_images() {
    local archive ref dest
    while read -r archive ref; do
        [ -n "$archive" ] || continue
        case "$ref" in
            registry.k8s.io/*) dest="${IMAGE_REGISTRY%/*}/${ref#registry.k8s.io/}" ;;
            *) dest="$ref" ;;
        esac
        skopeo copy --quiet --dest-tls-verify="$PUSH_TLS_VERIFY" "oci-archive:$archive" "docker://$dest" >/dev/null
        log "pushed $dest"
    done <"$1"
}

what="${1:-}"; shift || true
DO_IMPORT=0 DO_PUSH=0
for a in "$@"; do
    case "$a" in
        --import) DO_IMPORT=1 ;;
        --push) DO_PUSH=1 ;;
        *) die "unknown option $a" ;;
    esac
done
mkdir -p "$OUT" "$BUILD_DIR/work"
LIST="$(mktemp)"
trap 'rm -f "$LIST"' EXIT
case "$what" in
    system) { build_pause; build_scheduler; build_busybox; } >>"$LIST" ;;
    components) build_components >>"$LIST" ;;
    payloads) build_payloads >>"$LIST" ;;
    base) base_tarball; exit 0 ;;
    all) { build_pause; build_scheduler; build_busybox; build_components; } >>"$LIST" ;;
    *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
[ "$DO_PUSH" = 1 ] && push_images "$LIST"
[ "$DO_IMPORT" = 1 ] && import_images "$LIST"
cat "$LIST"
