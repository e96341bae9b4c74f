#!/usr/bin/env bash
# Build the offline package (SPEC §8). `make package VERSION=x.y.z` calls this.
#
#   package/build.sh VERSION [--images LIST] [--out DIR]
#
# Produces, in DIR (default <repo>/dist), the names of the manual (SPEC §8):
#   metax-gpu-k8s-package.VERSION.tar.gz       both charts + every component image
#   metax-gpu-k8s-package.VERSION-base.tar.gz  GPU Extensions only: no operator chart, and
#                                              only the images that chart uses
# each holding, at the archive's top level (the manual extracts with
# `mkdir k8s; tar -C k8s -xvzf metax-gpu-k8s-package.VERSION.tar.gz` and runs
# ./k8s/metax-k8s-images.VERSION.run):
#   metax-k8s-images.VERSION.run       self-contained: push DOMAIN/PROJECT | load | list
#   metax-gpu-extensions-VERSION.tgz   helm chart (version and appVersion = VERSION)
#   metax-operator-VERSION.tgz         helm chart (full package only)
#   metax-docker_VERSION.tar           metax-docker installers (package/metax_docker.py;
#                                      gzip-compressed, as the manual's `tar -xvzf` wants)
#   SHA256SUMS, README.txt
#
# Images: LIST is a file of "ARCHIVE REFERENCE" lines (the images.txt that images/build.sh
# writes), one OCI archive per component, each tagged VERSION. Without --images,
# `IMAGE_VERSION=VERSION images/build.sh components` builds them first.
# helm: $HELM, else `lab/tools.sh helm`, else PATH.
set -euo pipefail

PKG_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$PKG_DIR/.." && pwd)"
DETECT_ENGINE="$REPO_DIR/roles/gpu_artifacts_images/files/detect-engine.sh"
EXT_IMAGES=(gpu-device gpu-dra gpu-label gpu-aware gpu-exporter)
DEFAULT_REGISTRY="cr.metax-tech.com/cloud"  # the charts' default `registry`
OP_IMAGES=(driver-manager container-runtime operator-controller)

log() { printf '[package] %s\n' "$*" >&2; }
die() { printf '[package] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

VERSION="" IMAGES_LIST="" OUT_DIR="$REPO_DIR/dist"
while [ $# -gt 0 ]; do
    case "$1" in
        --images) IMAGES_LIST="${2:?--images needs a file}"; shift 2 ;;
        --out) OUT_DIR="${2:?--out needs a directory}"; shift 2 ;;
        -h|--help) usage ;;
        -*) die "unknown option $1" ;;
        *) [ -z "$VERSION" ] || die "one VERSION only"; VERSION="$1"; shift ;;
    esac
done
[ -n "$VERSION" ] || usage
# Helm chart versions are SemVer 2; the same string tags the images.
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
    die "VERSION must be SemVer like 1.2.3 or 1.2.3-rc.1 (it is the charts' version and the images' tag), not '$VERSION'"

find_helm() {
    if [ -n "${HELM:-}" ]; then echo "$HELM"; return; fi
    local h
    if [ -x "$REPO_DIR/lab/tools.sh" ] && h="$("$REPO_DIR/lab/tools.sh" helm)" && [ -x "$h" ]; then
        echo "$h"; return
    fi
    command -v helm || die "no helm: set HELM=/path/to/helm or make lab/tools.sh helm work"
}
HELM_BIN="$(find_helm)"
command -v skopeo >/dev/null || die "skopeo is needed to copy the image archives (apt-get install skopeo)"

if [ -z "$IMAGES_LIST" ]; then
    log "building the component images (version $VERSION) with images/build.sh"
    built="$(IMAGE_VERSION="$VERSION" "$REPO_DIR/images/build.sh" components)"
    IMAGES_LIST="$(mktemp)"
    trap 'rm -f "$IMAGES_LIST"' EXIT
    printf '%s\n' "$built" >"$IMAGES_LIST"
fi
[ -s "$IMAGES_LIST" ] || die "image list $IMAGES_LIST is empty or missing"

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"; [ -z "${built:-}" ] || rm -f "$IMAGES_LIST"' EXIT

# name -> archive, from "ARCHIVE REF" lines; the tag must be VERSION.
declare -A ARCHIVE=()
while read -r archive ref; do
    [ -n "${archive:-}" ] || continue
    case "$archive" in \#*) continue ;; esac
    name="${ref##*/}"; tag="${name##*:}"; name="${name%:*}"
    [ "$name:$tag" = "${ref##*/}" ] || die "$ref: image reference without a tag"
    [ -f "$archive" ] || die "$archive (for $ref) does not exist"
    ARCHIVE[$name]="$archive"
    if [[ " ${EXT_IMAGES[*]} ${OP_IMAGES[*]} " == *" $name "* ]] && [ "$tag" != "$VERSION" ]; then
        die "$ref is tagged $tag, but the charts of version $VERSION expect :$VERSION (rebuild with IMAGE_VERSION=$VERSION)"
    fi
done <"$IMAGES_LIST"
missing=()
for name in "${EXT_IMAGES[@]}" "${OP_IMAGES[@]}"; do
    [ -n "${ARCHIVE[$name]:-}" ] || missing+=("$name")
done
[ ${#missing[@]} -eq 0 ] || die "no image archive for: ${missing[*]} (in $IMAGES_LIST)"

# Reproducible archives: fixed owner, order and time.
EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$REPO_DIR" log -1 --format=%ct 2>/dev/null || echo 0)}"
[ -n "$EPOCH" ] || EPOCH=0
TAR_FLAGS=(--sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" --format=gnu)

# make_run OUT NAME... : the self-contained images script with those images. The payload
# holds one OCI image layout for all of them, so the layers they share (the base) are
# stored once.
make_run() {
    local out="$1"; shift
    local payload="$STAGE/payload" name
    rm -rf "$payload"; mkdir -p "$payload"
    : >"$payload/images.txt"
    for name in "$@"; do
        # Copied by skopeo (same blobs) under the name NAME:VERSION only, not the builder's
        # registry: `load` then gives nodes exactly the references the charts use.
        skopeo copy --quiet "oci-archive:${ARCHIVE[$name]}" "oci:$payload/oci:$name:$VERSION" \
            || die "skopeo could not read ${ARCHIVE[$name]} as an OCI archive"
        echo "$name $VERSION" >>"$payload/images.txt"
    done
    # manifest.json: the same tar is also a docker archive (docker/podman load read it as is)
    "${PYTHON:-python3}" "$PKG_DIR/docker_manifest.py" "$payload" "$DEFAULT_REGISTRY"
    tar -C "$payload" "${TAR_FLAGS[@]}" -cf "$STAGE/payload.tar" images.txt manifest.json oci
    local lines sha template="$STAGE/images.run.in" detect="$STAGE/detect-engine.sh"
    # the engine detection is the role's own script (one implementation), inlined
    sed -n '/^# >>> detect_engine$/,/^# <<< detect_engine$/p' "$DETECT_ENGINE" >"$detect"
    grep -q '^detect_engine() {$' "$detect" || die "$DETECT_ENGINE: no detect_engine between its markers"
    sed -e "/^@DETECT_ENGINE@$/{r $detect" -e 'd;}' "$PKG_DIR/images.run.in" >"$template"
    grep -q '^detect_engine() {$' "$template" || die "images.run.in: no @DETECT_ENGINE@ line"
    lines="$(wc -l <"$template")"
    sha="$(sha256sum "$STAGE/payload.tar" | cut -d' ' -f1)"
    sed -e "s/@VERSION@/$VERSION/g" -e "s/@PAYLOAD_LINE@/$((lines + 1))/g" \
        -e "s/@PAYLOAD_SHA256@/$sha/g" -e "s|@DEFAULT_REGISTRY@|$DEFAULT_REGISTRY|g" \
        "$template" >"$out"
    [ "$(wc -l <"$out")" -eq "$lines" ] || die "images.run.in: substitution changed the line count"
    rm -f "$template" "$detect"
    cat "$STAGE/payload.tar" >>"$out"
    chmod 0755 "$out"
    rm -rf "$payload" "$STAGE/payload.tar"
}

# make_package SUFFIX CHART... : DIR/metax-gpu-k8s-package.VERSION[SUFFIX].tar.gz, its
# files at the top level
make_package() {
    local suffix="$1" run; shift
    local top="metax-gpu-k8s-package.$VERSION$suffix" chart
    local dir="$STAGE/$top"
    mkdir -p "$dir"
    run="$dir/metax-k8s-images.$VERSION.run"
    if [ "$suffix" = -base ]; then
        make_run "$run" "${EXT_IMAGES[@]}"
    else
        make_run "$run" "${EXT_IMAGES[@]}" "${OP_IMAGES[@]}"
    fi
    for chart in "$@"; do
        cp "$STAGE/charts/$chart-$VERSION.tgz" "$dir/"
    done
    cp "$STAGE/metax-docker_$VERSION.tar" "$dir/"
    cat >"$dir/README.txt" <<EOF
$top: gpuk8s $VERSION, offline package (see docs/package.md in the source).

Unpack:  mkdir k8s; tar -C k8s -xvzf $top.tar.gz   (the files are at the top level)
Images:  ./k8s/metax-k8s-images.$VERSION.run list | push DOMAIN/PROJECT | load [REGISTRY]
         (docker alone will do: docker login DOMAIN first; skopeo is used when installed)
Charts:  helm registry login DOMAIN; helm push CHART-$VERSION.tgz oci://DOMAIN/PROJECT
Install: helm install oci://DOMAIN/PROJECT/metax-gpu-extensions --create-namespace \\
           -n metax-gpu-extensions --generate-name --wait --set registry=DOMAIN/PROJECT
EOF
    (cd "$dir" && sha256sum -- * | grep -v ' SHA256SUMS$' >SHA256SUMS)
    (cd "$dir" && tar "${TAR_FLAGS[@]}" -cf - -- *) | gzip -n -6 >"$OUT_DIR/$top.tar.gz.tmp"
    mv "$OUT_DIR/$top.tar.gz.tmp" "$OUT_DIR/$top.tar.gz"
    log "wrote $OUT_DIR/$top.tar.gz ($(du -h "$OUT_DIR/$top.tar.gz" | cut -f1))"
    echo "$OUT_DIR/$top.tar.gz"
}

mkdir -p "$OUT_DIR" "$STAGE/charts"
for chart in metax-gpu-extensions metax-operator; do
    # The library chart is a symlink in the tree; helm package copies its files in.
    "$HELM_BIN" package "$REPO_DIR/charts/$chart" --version "$VERSION" --app-version "$VERSION" \
        -d "$STAGE/charts" 2> >(grep -v 'found symbolic link in path' >&2) >/dev/null
    [ -f "$STAGE/charts/$chart-$VERSION.tgz" ] || die "helm package $chart did not produce $chart-$VERSION.tgz"
done
"${PYTHON:-python3}" "$PKG_DIR/metax_docker.py" "$VERSION" --out "$STAGE" >/dev/null
make_package "" metax-gpu-extensions metax-operator
make_package -base metax-gpu-extensions
