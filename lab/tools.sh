#!/usr/bin/env bash
# Build (once) and print the path of the lab's Go-built tools.
#
#   lab/tools.sh helm          -> absolute path of a ready helm binary
#   lab/tools.sh helm3         -> the same for helm 3 (for kubernetes.core.helm, see lab/README.md)
#   lab/tools.sh kubeconform   -> absolute path of a ready kubeconform binary
#   lab/tools.sh kube          -> absolute path of the directory holding kube-apiserver,
#                                 kube-controller-manager, kube-scheduler, kubelet,
#                                 kube-proxy, kubectl (the lab's KUBE_VERSION, or the release
#                                 GPUK8S_KUBE_VERSION names: lab/gomod/kube/<release>/)
#   lab/tools.sh etcd          -> absolute path of the directory holding etcd, etcdctl
#   lab/tools.sh cdi           -> absolute path of gpuk8s-cdi-check: the reference CDI library
#                                 (tags.cncf.io/container-device-interface) validating specs
#   lab/tools.sh containerd2   -> absolute path of the directory holding containerd 2.x
#                                 (containerd, containerd-shim-runc-v2, ctr; lab/gomod/containerd)
#   lab/tools.sh netpol        -> absolute path of gpuk8s-netpol: kube-network-policies'
#                                 NetworkPolicy controller as a host daemon (lab/gomod/netpol)
#   lab/tools.sh schemas       -> absolute path of the kubeconform JSON schema directory
#                                 (generated from the built kube-apiserver's OpenAPI; see lab/README.md)
#   lab/tools.sh all           -> builds everything (helm first), prints a timing summary
#   lab/tools.sh versions      -> prints the pinned versions
#
# Binaries are cached outside the repo under ${GPUK8S_CACHE:-/var/cache/gpuk8s}/bin/<tool>-<version>/
# and rebuilt only when missing. Builds run serially (2-core machines); each build's wall time is
# printed on stderr. Stdout carries only the requested path, so `$(lab/tools.sh helm)` works.
set -euo pipefail

LAB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lab/versions.sh
. "$LAB_DIR/versions.sh"

CACHE="${GPUK8S_CACHE:-/var/cache/gpuk8s}"
BIN="$CACHE/bin"
LOGS="$CACHE/logs"
KUBE_COMMANDS=(kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kube-proxy)  # integration tier first

log() { printf '[tools] %s\n' "$*" >&2; }
die() { printf '[tools] ERROR: %s\n' "$*" >&2; exit 1; }

find_go() {
    if command -v go >/dev/null 2>&1; then command -v go
    elif [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go
    else die "no Go toolchain found (need go >= 1.25 on PATH or at /usr/local/go/bin/go)"
    fi
}
GO="$(find_go)"

go_env() {
    # -mod=mod: our wrapper modules resolve against the module proxy; no vendor dirs.
    export GOFLAGS=-mod=mod CGO_ENABLED="${CGO_ENABLED:-0}" GOTOOLCHAIN=local
    export GOPATH="${GOPATH:-$("$GO" env GOPATH)}"
    export GOCACHE="${GOCACHE:-$("$GO" env GOCACHE)}"
}

# timed NAME CMD...: run CMD, log its wall time, append it to $CACHE/build-times.log
timed() {
    local name="$1"; shift
    local t0 t1
    t0=$(date +%s)
    mkdir -p "$LOGS"
    log "building $name (log: $LOGS/$name.log)"
    if ! "$@" >"$LOGS/$name.log" 2>&1; then
        tail -n 40 "$LOGS/$name.log" >&2
        die "build of $name failed; full log: $LOGS/$name.log"
    fi
    t1=$(date +%s)
    log "built $name in $((t1 - t0))s"
    printf '%s %s %ss\n' "$(date -u +%FT%TZ)" "$name" "$((t1 - t0))" >>"$CACHE/build-times.log"
}

# Build one module's main package with `go install pkg@version` into a staging dir.
go_install_into() {
    local dest="$1" pkg="$2" ldflags="$3"
    go_env
    GOBIN="$dest.tmp" "$GO" install -trimpath -ldflags="-s -w $ldflags" "$pkg"
}

ensure_helm() {
    local dir="$BIN/helm-$HELM_VERSION"
    if [ ! -x "$dir/helm" ]; then
        lock_builds
        rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
        timed "helm-$HELM_VERSION" go_install_into "$dir" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" \
            "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
        rm -rf "$dir"; mv "$dir.tmp" "$dir"
    fi
    echo "$dir/helm"
}

ensure_helm3() {
    local dir="$BIN/helm-$HELM3_VERSION"
    if [ ! -x "$dir/helm" ]; then
        lock_builds
        rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
        timed "helm-$HELM3_VERSION" go_install_into "$dir" "helm.sh/helm/v3/cmd/helm@$HELM3_VERSION" \
            "-X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION"
        rm -rf "$dir"; mv "$dir.tmp" "$dir"
    fi
    echo "$dir/helm"
}

ensure_kubeconform() {
    local dir="$BIN/kubeconform-$KUBECONFORM_VERSION"
    if [ ! -x "$dir/kubeconform" ]; then
        lock_builds
        rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
        timed "kubeconform-$KUBECONFORM_VERSION" go_install_into "$dir" \
            "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" "-X main.version=$KUBECONFORM_VERSION"
        rm -rf "$dir"; mv "$dir.tmp" "$dir"
    fi
    echo "$dir/kubeconform"
}

# Our wrapper module (lab/gomod/kube/<release>/) requires k8s.io/kubernetes and replaces every
# staging module with its published v0.Y.Z; it is copied to a scratch dir so the repo stays clean.
kube_build_one() {
    local cmd="$1" out="$2"
    local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    local commit="${KUBE_GIT_COMMIT:-0000000000000000000000000000000000000000}"
    local date; date="$(date -u +%FT%TZ)"
    local x=""
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        x+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        x+=" -X $p.gitCommit=$commit -X $p.gitTreeState=clean -X $p.buildDate=$date"
    done
    go_env
    (cd "$KUBE_WORK" && "$GO" build -trimpath -ldflags="-s -w$x" -o "$out" "k8s.io/kubernetes/cmd/$cmd")
}

kube_prepare_workdir() {
    KUBE_WORK="$CACHE/work/kube-$KUBE_VERSION"
    mkdir -p "$KUBE_WORK"
    local mod="$LAB_DIR/gomod/kube/$KUBE_VERSION"
    [ -f "$mod/go.mod" ] && [ -f "$mod/go.sum" ] ||
        die "no lab/gomod/kube/$KUBE_VERSION/go.mod and go.sum (run: lab/gomod/gen-kube-gomod.sh $KUBE_VERSION)"
    cp "$mod/go.mod" "$mod/go.sum" "$LAB_DIR/gomod/kube/tools.go" "$KUBE_WORK/"
    grep -q "k8s.io/kubernetes $KUBE_VERSION" "$KUBE_WORK/go.mod" ||
        die "lab/gomod/kube/$KUBE_VERSION/go.mod does not require k8s.io/kubernetes $KUBE_VERSION"
}

ensure_kube() {
    local dir="$BIN/kube-$KUBE_VERSION" missing=()
    for c in "${KUBE_COMMANDS[@]}"; do [ -x "$dir/$c" ] || missing+=("$c"); done
    if [ "${#missing[@]}" -gt 0 ]; then
        lock_builds
        kube_prepare_workdir
        mkdir -p "$dir"
        for c in "${missing[@]}"; do
            timed "$c-$KUBE_VERSION" kube_build_one "$c" "$dir/$c.tmp"
            mv "$dir/$c.tmp" "$dir/$c"
        done
    fi
    echo "$dir"
}

ensure_etcd() {
    local dir="$BIN/etcd-$ETCD_VERSION"
    if [ ! -x "$dir/etcd" ] || [ ! -x "$dir/etcdctl" ]; then
        lock_builds
        local work="$CACHE/work/etcd-$ETCD_VERSION"
        mkdir -p "$work" "$dir"
        cp "$LAB_DIR/gomod/etcd/go.mod" "$LAB_DIR/gomod/etcd/tools.go" "$work/"
        [ -f "$LAB_DIR/gomod/etcd/go.sum" ] && cp "$LAB_DIR/gomod/etcd/go.sum" "$work/"
        go_env
        timed "etcd-$ETCD_VERSION" bash -c "cd '$work' && '$GO' build -trimpath -ldflags='-s -w' -o '$dir/etcd.tmp' go.etcd.io/etcd/server/v3 && mv '$dir/etcd.tmp' '$dir/etcd'"
        timed "etcdctl-$ETCD_VERSION" bash -c "cd '$work' && '$GO' build -trimpath -ldflags='-s -w' -o '$dir/etcdctl.tmp' go.etcd.io/etcd/etcdctl/v3 && mv '$dir/etcdctl.tmp' '$dir/etcdctl'"
    fi
    echo "$dir"
}

# ensure_gomod DIR NAME VERSION MODULE BINARY: build lab/gomod/DIR, our small main package
# around MODULE (required at VERSION by its go.mod), into $BIN/NAME-VERSION/BINARY unless it
# is there; print its path.
ensure_gomod() {
    local src="$LAB_DIR/gomod/$1" name="$2-$3" version="$3" module="$4" binary="$5"
    local dir="$BIN/$name"
    if [ ! -x "$dir/$binary" ]; then
        lock_builds
        local work="$CACHE/work/$name"
        mkdir -p "$work" "$dir"
        cp "$src/go.mod" "$src/go.sum" "$src/"*.go "$work/"
        grep -q "$module $version" "$work/go.mod" || die "lab/gomod/$1/go.mod does not require $module $version"
        go_env
        timed "$name" bash -c "cd '$work' && nice -n 10 '$GO' build -trimpath -ldflags='-s -w' -o '$dir/$binary.tmp' . && mv '$dir/$binary.tmp' '$dir/$binary'"
    fi
    echo "$dir/$binary"
}

ensure_cdi() {
    ensure_gomod cdi cdi-check "$CDI_VERSION" tags.cncf.io/container-device-interface gpuk8s-cdi-check
}

# NetworkPolicy enforcement: sigs.k8s.io/kube-network-policies' controller in our wrapper
# (lab/gomod/netpol: a kubeconfig instead of in-cluster files, SIGTERM cleans up, iptables
# steering for kernels without nft_queue).
ensure_netpol() {
    ensure_gomod netpol netpol "$NETPOL_VERSION" sigs.k8s.io/kube-network-policies gpuk8s-netpol
}

# containerd 2.x: the daemon, its runc shim and ctr, from github.com/containerd/containerd/v2
# (lab/gomod/containerd pins it). CGO off: no btrfs snapshotter (the lab uses overlayfs).
CONTAINERD2_COMMANDS=(containerd containerd-shim-runc-v2 ctr)
ensure_containerd2() {
    local dir="$BIN/containerd-$CONTAINERD2_VERSION" missing=() c
    for c in "${CONTAINERD2_COMMANDS[@]}"; do [ -x "$dir/$c" ] || missing+=("$c"); done
    if [ "${#missing[@]}" -gt 0 ]; then
        lock_builds
        local work="$CACHE/work/containerd-$CONTAINERD2_VERSION"
        local pkg=github.com/containerd/containerd/v2
        local x="-X $pkg/version.Version=$CONTAINERD2_VERSION -X $pkg/version.Revision=gomod"
        x+=" -X $pkg/version.Package=$pkg"
        mkdir -p "$work" "$dir"
        cp "$LAB_DIR/gomod/containerd/go.mod" "$LAB_DIR/gomod/containerd/go.sum" \
            "$LAB_DIR/gomod/containerd/tools.go" "$work/"
        grep -q "$pkg $CONTAINERD2_VERSION" "$work/go.mod" ||
            die "lab/gomod/containerd/go.mod does not require $pkg $CONTAINERD2_VERSION"
        go_env
        for c in "${missing[@]}"; do
            timed "$c-$CONTAINERD2_VERSION" bash -c "cd '$work' && '$GO' build -trimpath -ldflags='-s -w $x' -o '$dir/$c.tmp' '$pkg/cmd/$c' && mv '$dir/$c.tmp' '$dir/$c'"
        done
    fi
    echo "$dir"
}

# Kubernetes JSON schemas for kubeconform, generated offline from the apiserver we built
# (see lab/schemas.py). Needs a running apiserver, so lab/up produces them; this prints the dir.
schemas_dir() {
    echo "$CACHE/schemas/kube-$KUBE_VERSION"
}

# One build at a time across processes (several engineers call this concurrently). Taken
# only to build: a tool already built is printed at once, even during another's long build.
# After waiting, the script starts over holding the lock (fd 9 stays open across exec), so
# what the other build made is not built twice.
TOOLS_ARGS=("$@")
lock_builds() {
    [ -n "${TOOLS_LOCKED:-}" ] && return 0
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.tools.lock"
    export TOOLS_LOCKED=1
    if ! flock -n 9; then
        log "waiting for another lab/tools.sh build to finish (lock $CACHE/.tools.lock)"
        flock 9
        exec "$0" "${TOOLS_ARGS[@]}"
    fi
}

case "${1:-}" in
    helm) ensure_helm ;;
    helm3) ensure_helm3 ;;
    kubeconform) ensure_kubeconform ;;
    kube) ensure_kube ;;
    etcd) ensure_etcd ;;
    cdi) ensure_cdi ;;
    containerd2) ensure_containerd2 ;;
    netpol) ensure_netpol ;;
    schemas) schemas_dir ;;
    versions) cat "$LAB_DIR/versions.env" ;;
    all)
        lock_builds
        t0=$(date +%s)
        ensure_helm; ensure_kubeconform; ensure_kube; ensure_etcd; ensure_helm3; ensure_cdi; ensure_containerd2; ensure_netpol
        log "all tools ready in $(( $(date +%s) - t0 ))s; build times: $CACHE/build-times.log"
        ;;
    *) echo "usage: $0 helm|helm3|kubeconform|kube|etcd|cdi|containerd2|netpol|schemas|all|versions" >&2; exit 2 ;;
esac
