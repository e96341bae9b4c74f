#!/usr/bin/env bash
# Produce kubeconform JSON schemas for the pinned Kubernetes version, offline, from the
# OpenAPI document (/openapi/v2) of the kube-apiserver we build. Uses the running lab's
# apiserver when there is one, else starts a throwaway etcd + apiserver on spare ports.
# Prints the schema directory. Cached: regenerated only when missing.
#
#   kubeconform -strict -schema-location "$(lab/schemas.sh)/{{.ResourceKind}}{{.KindSuffix}}.json" FILE
set -euo pipefail
LAB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lab/versions.sh
. "$LAB_DIR/versions.sh"
CACHE="${GPUK8S_CACHE:-/var/cache/gpuk8s}"
OUT="$CACHE/schemas/kube-$KUBE_VERSION"
if [ -s "$OUT/deployment-apps-v1.json" ] && [ "${1:-}" != --force ]; then echo "$OUT"; exit 0; fi

swagger="$(mktemp)"
tmp=""
cleanup() {
    if [ -n "${APISERVER_PID:-}" ]; then kill "$APISERVER_PID" 2>/dev/null || true; fi
    if [ -n "${ETCD_PID:-}" ]; then kill "$ETCD_PID" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    rm -f "$swagger"; [ -n "$tmp" ] && rm -rf "$tmp"
    return 0
}
trap cleanup EXIT

# The lab's apiserver only when it runs this release (GPUK8S_KUBE_VERSION may pick another).
lab_api() {
    curl -fsSk --cert /etc/kubernetes/pki/admin.crt --key /etc/kubernetes/pki/admin.key \
        "https://127.0.0.1:6443$1" "${@:2}" 2>/dev/null
}
if [ -s /etc/kubernetes/pki/admin.crt ] &&
    lab_api /version | grep -q "\"gitVersion\": \"$KUBE_VERSION\"" &&
    lab_api /openapi/v2 -o "$swagger"; then
    :
else
    kube="$("$LAB_DIR/tools.sh" kube)"; etcd="$("$LAB_DIR/tools.sh" etcd)"
    tmp="$(mktemp -d)"
    openssl genrsa -out "$tmp/sa.key" 2048 2>/dev/null
    "$etcd/etcd" --data-dir "$tmp/etcd" --listen-client-urls http://127.0.0.1:22379 \
        --advertise-client-urls http://127.0.0.1:22379 --listen-peer-urls http://127.0.0.1:22380 \
        --initial-advertise-peer-urls http://127.0.0.1:22380 --initial-cluster default=http://127.0.0.1:22380 \
        --log-level error >"$tmp/etcd.log" 2>&1 &
    ETCD_PID=$!
    "$kube/kube-apiserver" --etcd-servers http://127.0.0.1:22379 --bind-address 127.0.0.1 \
        --secure-port 16443 --cert-dir "$tmp/certs" --authorization-mode AlwaysAllow --anonymous-auth=true \
        --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$tmp/sa.key" \
        --service-account-signing-key-file "$tmp/sa.key" --service-cluster-ip-range 10.96.0.0/12 \
        >"$tmp/apiserver.log" 2>&1 &
    APISERVER_PID=$!
    for _ in $(seq 1 120); do
        curl -fsSk https://127.0.0.1:16443/openapi/v2 -o "$swagger" 2>/dev/null && break
        sleep 1
    done
    [ -s "$swagger" ] || { tail -20 "$tmp/apiserver.log" >&2; echo "[schemas] apiserver did not serve /openapi/v2" >&2; exit 1; }
fi
rm -rf "$OUT.tmp"
python3 "$LAB_DIR/schemas.py" "$swagger" "$OUT.tmp" >&2
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo "$OUT"
