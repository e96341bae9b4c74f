#!/usr/bin/env bash
# NetworkPolicy enforcement on the lab node: sigs.k8s.io/kube-network-policies' controller
# (nftables + nfqueue; lab/tools.sh netpol builds it) as a host daemon, the way its
# DaemonSet (hostNetwork, privileged) runs it on a real node. The bridge CNI enforces no
# policy itself; with this daemon the lab's NetworkPolicies take effect (docs/security.md).
#
#   lab/netpol.sh start   ServiceAccount kube-system/kube-network-policies with the
#                         upstream ClusterRole (list/watch pods, namespaces,
#                         networkpolicies), a kubeconfig with its token, then the daemon
#                         (log: $LOG_DIR/netpol.log, metrics: NETPOL_METRICS below)
#   lab/netpol.sh stop    the daemon (it deletes its nftables table on SIGTERM), then the
#                         table if a hard kill left it
#
# lab/up runs `start`, lab/down `stop`.
set -euo pipefail
# shellcheck source=lab/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
as_root "$@"

NETPOL_DIR="$STATE/netpol"
NETPOL_KUBECONFIG="$NETPOL_DIR/kubeconfig"
NETPOL_METRICS=127.0.0.1:9080
NETPOL_QUEUE=100

netpol_rbac() {
    kubectl apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: ServiceAccount
metadata: { name: kube-network-policies, namespace: kube-system }
---
apiVersion: v1
kind: Secret
type: kubernetes.io/service-account-token
metadata:
  name: kube-network-policies-token
  namespace: kube-system
  annotations: { kubernetes.io/service-account.name: kube-network-policies }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: { name: kube-network-policies }
rules:
  - apiGroups: [""]
    resources: [pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: { name: kube-network-policies }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-network-policies }
subjects:
  - { kind: ServiceAccount, name: kube-network-policies, namespace: kube-system }
EOF
}

netpol_token() {
    kubectl -n kube-system get secret kube-network-policies-token -o jsonpath='{.data.token}' |
        base64 -d | grep -q .
}

# The daemon's kubeconfig: the ServiceAccount's token (the token controller fills the
# Secret), written atomically and readable by root only.
netpol_kubeconfig() {
    wait_for "the token of kube-system/kube-network-policies" 60 netpol_token
    local token
    token="$(kubectl -n kube-system get secret kube-network-policies-token -o jsonpath='{.data.token}' | base64 -d)"
    mkdir -p "$NETPOL_DIR"
    local tmp; tmp="$(mktemp "$NETPOL_KUBECONFIG.XXXXXX")"   # mode 600
    cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
    server: $APISERVER
  name: kubernetes
contexts:
- context: { cluster: kubernetes, user: kube-network-policies }
  name: kube-network-policies
current-context: kube-network-policies
users:
- name: kube-network-policies
  user:
    token: $token
EOF
    if [ -f "$NETPOL_KUBECONFIG" ] && cmp -s "$tmp" "$NETPOL_KUBECONFIG"; then rm -f "$tmp"
    else mv "$tmp" "$NETPOL_KUBECONFIG"; fi
}

netpol_start() {
    local bin; bin="$("$LAB_DIR/tools.sh" netpol)"
    netpol_rbac
    netpol_kubeconfig
    # supervised (restart on exit, as the kubelet restarts the DaemonSet's pod): while none
    # runs, new connections of the pods a policy selects are dropped (fail closed)
    DAEMON_INPUTS="$NETPOL_KUBECONFIG" start_daemon netpol "$LAB_DIR/supervise" "$bin" \
        --kubeconfig="$NETPOL_KUBECONFIG" \
        --hostname-override="$NODE_NAME" --nfqueue-id="$NETPOL_QUEUE" \
        --metrics-bind-address="$NETPOL_METRICS" --v=2
    wait_for "netpol (kube-network-policies) metrics on $NETPOL_METRICS" 60 \
        curl -fsS "http://$NETPOL_METRICS/metrics"
}

netpol_stop() {
    stop_daemon netpol
    local bin="$CACHE/bin/netpol-$NETPOL_VERSION/gpuk8s-netpol"
    if [ -x "$bin" ]; then "$bin" --cleanup >&2; fi
}

case "${1:-}" in
    start) netpol_start ;;
    stop) netpol_stop ;;
    *) die "usage: lab/netpol.sh start|stop" ;;
esac
