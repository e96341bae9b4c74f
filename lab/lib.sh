# shellcheck shell=bash
# shellcheck disable=SC2034  # settings used by the scripts that source this file
# Shared settings and helpers for lab/up, lab/down, lab/status, lab/ctl (sourced, not run).

LAB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$LAB_DIR/.." && pwd)"
# the lab's Kubernetes release (lab/up --kube records it; GPUK8S_KUBE_VERSION must agree)
VERSIONS_FOR_LAB=1
# shellcheck source=lab/versions.sh
. "$LAB_DIR/versions.sh"

CACHE="${GPUK8S_CACHE:-/var/cache/gpuk8s}"
STATE="${GPUK8S_LAB_STATE:-/var/lib/gpuk8s-lab}"
RUN_DIR="$STATE/run"          # pid files
LOG_DIR="$STATE/log"          # one log per daemon
SIM_ROOT="$STATE/simroot"     # the simulated GPU host root (gpuk8s sim create --root)
KUBE_ETC=/etc/kubernetes
PKI="$KUBE_ETC/pki"
KUBELET_DIR=/var/lib/kubelet
CNI_CONF=/etc/cni/net.d/10-gpuk8s-lab.conflist
CONTAINERD_CONF="$STATE/containerd/config.toml"        # containerd 1.6 (Debian), version 2
CONTAINERD2_CONF="$STATE/containerd/config-v3.toml"    # containerd 2.x (lab/up --containerd 2)
CONTAINERD2_ROOT="$STATE/containerd2"                  # 2.x keeps its own root and state:
CONTAINERD2_STATE=/run/gpuk8s-lab/containerd2          # no downgrade of 1.6's store by 2.x
CONTAINERD_SOCK=/run/containerd/containerd.sock
REGISTRY_ADDR="${GPUK8S_REGISTRY:-127.0.0.1:5000}"

NODE_NAME="${GPUK8S_LAB_NODE:-$(hostname -s | tr '[:upper:]' '[:lower:]')}"
NODE_IP="${GPUK8S_LAB_NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')}"
NODE_IP="${NODE_IP:-127.0.0.1}"
POD_CIDR=10.244.0.0/16
NODE_POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/12
KUBERNETES_SVC_IP=10.96.0.1
APISERVER="https://$NODE_IP:6443"
SCHEDULER_IMAGE="registry.k8s.io/kube-scheduler:$KUBE_VERSION"
PAUSE_IMAGE="registry.k8s.io/pause:3.10-gpuk8s"

export KUBECONFIG="${KUBECONFIG_LAB:-$KUBE_ETC/admin.conf}"

log() { printf '[lab %s] %s\n' "$(date -u +%T)" "$*" >&2; }
die() { printf '[lab] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/as-root.sh
. "$REPO_DIR/scripts/as-root.sh"

# Timed phases: phase NAME FUNC...; a summary is printed by phase_summary.
PHASES=()
phase() {
    local name="$1"; shift
    local t0 t1
    t0=$(date +%s)
    log "== $name"
    "$@"
    t1=$(date +%s)
    PHASES+=("$(printf '%-28s %4ss' "$name" "$((t1 - t0))")")
}
phase_summary() {
    log "phase timings:"
    local p
    for p in "${PHASES[@]}"; do printf '    %s\n' "$p" >&2; done
}

# record_timing NAME SECONDS: what the newcomer run costs, kept for scripts/test's summary
# ($STATE/timings/NAME: "<seconds> <UTC end time>").
# GPUK8S_RECORD_TIMING=0 (set by scripts/test: its own lab/up, the e2e tier's) records nothing.
record_timing() {
    [ "${GPUK8S_RECORD_TIMING:-1}" != 0 ] || return 0
    mkdir -p "$STATE/timings" 2>/dev/null || return 0
    printf '%s %s\n' "$2" "$(date -u +%FT%TZ)" >"$STATE/timings/$1" 2>/dev/null || true
}

kube_bin() { echo "$CACHE/bin/kube-$KUBE_VERSION/$1"; }
kubectl() { "$(kube_bin kubectl)" --kubeconfig "$KUBE_ETC/admin.conf" "$@"; }

# write_if_changed FILE < content: replace FILE atomically, and only when the content differs
# (kube-proxy exits when its config file changes; a rewrite must not look like a change).
write_if_changed() {
    local dest="$1" tmp
    tmp="$(mktemp "$dest.XXXXXX")"
    cat >"$tmp"
    if [ -f "$dest" ] && cmp -s "$tmp" "$dest"; then rm -f "$tmp"; else chmod 644 "$tmp"; mv "$tmp" "$dest"; fi
}

# Daemons: started detached (setsid), pid file in $RUN_DIR, log in $LOG_DIR.
# proc_start_time PID: when PID started (field 22 of /proc/PID/stat, clock ticks since boot);
# a pid reused by another process, or one alive on a machine restored from a copy of this
# state, has another. The fields are read after the last ')': the command name may hold any.
proc_start_time() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    # shellcheck disable=SC2086  # split into the stat fields, from field 3 (state) on
    set -- $stat
    [ -n "${20:-}" ] || return 1
    echo "${20}"
}

# daemon_pid NAME: the pid of the running NAME, else fail. The pid file alone is not proof:
# a stale one (the lab's state copied to a new machine, a reboot) may name a live process
# that is something else entirely, and lab/up would wait on it, lab/down kill it. So the
# process must have started when the one start_daemon started did ($RUN_DIR/NAME.start).
# A lab started before .start was recorded has none; its process must be running the
# recorded command instead (recorded_cmd_runs).
daemon_pid() {
    local f="$RUN_DIR/$1.pid" pid started
    [ -f "$f" ] || return 1
    pid="$(cat "$f")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    if [ -f "$RUN_DIR/$1.start" ]; then
        started="$(cat "$RUN_DIR/$1.start")"
        [ -n "$started" ] && [ "$(proc_start_time "$pid")" = "$started" ] || return 1
    else
        recorded_cmd_runs "$1" "$pid" || return 1
    fi
    echo "$pid"
}

# recorded_cmd_runs NAME PID: PID's command line ends with NAME's recorded one, less the
# leading `env VAR=...` words (env execs the rest; a script is run as `bash SCRIPT ARGS`).
recorded_cmd_runs() {
    local want have
    [ -f "$RUN_DIR/$1.cmd" ] && [ -r "/proc/$2/cmdline" ] || return 1
    want="$(tr '\0' '\n' <"$RUN_DIR/$1.cmd" |
        awk -v lead=1 'lead && ($0 == "env" || $0 ~ /^[A-Za-z_][A-Za-z0-9_]*=/) { next } { lead = 0; print }')"
    have="$(tr '\0' '\n' <"/proc/$2/cmdline")"
    [ -n "$want" ] && [[ "$have" == "$want" || "$have" == *$'\n'"$want" ]]
}
daemon_running() { daemon_pid "$1" >/dev/null; }

# start_daemon NAME CMD...: run CMD detached. A NAME already running with the same command
# line (and the same contents of the files listed in $DAEMON_INPUTS, e.g. its config file)
# is left alone; one whose command line or inputs changed (new flags or feature gates, an
# edited config) is stopped and started again, so lab/up applies what it changed.
start_daemon() {
    local name="$1"; shift
    mkdir -p "$RUN_DIR" "$LOG_DIR"
    local inputs=""
    # shellcheck disable=SC2086  # DAEMON_INPUTS is a list of paths
    [ -z "${DAEMON_INPUTS:-}" ] || inputs="$(cat $DAEMON_INPUTS | sha256sum | cut -c1-32)"
    if daemon_running "$name"; then
        if cmp -s "$RUN_DIR/$name.cmd" <(printf '%s\0' "$@") &&
            [ "$(cat "$RUN_DIR/$name.inputs" 2>/dev/null)" = "$inputs" ]; then
            log "$name already running (pid $(daemon_pid "$name"))"
            return 0
        fi
        log "$name: command line or configuration changed, restarting it"
        stop_daemon "$name"
    fi
    # The command line, NUL-separated, so lab/ctl can restart the daemon the same way.
    printf '%s\0' "$@" >"$RUN_DIR/$name.cmd"
    printf '%s' "$inputs" >"$RUN_DIR/$name.inputs"
    # setsid: the daemon survives the shell that started it; its stdin is closed. Every
    # other inherited descriptor is closed too: lab/up runs under `flock LOCK lab/up`, whose
    # lock descriptor would otherwise live on in the daemon and hold the lab lock forever.
    (
        for fd in /proc/$BASHPID/fd/*; do
            n="${fd##*/}"
            if [ "$n" -gt 2 ] 2>/dev/null; then eval "exec $n>&-" 2>/dev/null || true; fi
        done
        # every signal at its default, as systemd starts a service (see lab/supervise)
        exec setsid env --default-signal "$@" </dev/null >>"$LOG_DIR/$name.log" 2>&1
    ) &
    echo $! >"$RUN_DIR/$name.pid"
    proc_start_time $! >"$RUN_DIR/$name.start" || true
    log "started $name (pid $!, log $LOG_DIR/$name.log)"
}

stop_daemon() {
    local name="$1" pid i
    if pid="$(daemon_pid "$name")"; then
        kill "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
        log "stopped $name (pid $pid)"
    fi
    rm -f "$RUN_DIR/$name.pid" "$RUN_DIR/$name.start"
}

# wait_for DESC TIMEOUT_S CMD...: poll CMD every second until it succeeds.
wait_for() {
    local desc="$1" timeout="$2"; shift 2
    local i
    for ((i = 0; i < timeout; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    die "timed out after ${timeout}s waiting for $desc"
}

# The node's containerd generation: "2" when the running (recorded) containerd is the 2.x
# that lab/tools.sh builds, else "1.6" (Debian's).
containerd_generation() {
    if [ -f "$RUN_DIR/containerd.cmd" ] && grep -qz "^$CACHE/bin/containerd-v" "$RUN_DIR/containerd.cmd"; then
        echo 2
    else
        echo 1.6
    fi
}

# node_ctr_path: the ctr of the running containerd's generation; node_ctr ARGS...: run it.
node_ctr_path() {
    if [ "$(containerd_generation)" = 2 ]; then
        echo "$CACHE/bin/containerd-$CONTAINERD2_VERSION/ctr"
    else
        command -v ctr || echo /usr/bin/ctr
    fi
}
node_ctr() { "$(node_ctr_path)" --address "$CONTAINERD_SOCK" "$@"; }

# Kill every container of the lab's pods through containerd, then containerd and the shims
# that outlive it (lab/down; lab/up when it switches the containerd generation).
kill_node_containers() {
    local t c
    if daemon_running containerd; then
        for t in $(node_ctr -n k8s.io tasks ls -q 2>/dev/null); do node_ctr -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1 || true; done
        sleep 1
        for t in $(node_ctr -n k8s.io tasks ls -q 2>/dev/null); do node_ctr -n k8s.io tasks rm -f "$t" >/dev/null 2>&1 || true; done
        for c in $(node_ctr -n k8s.io containers ls -q 2>/dev/null); do node_ctr -n k8s.io containers rm "$c" >/dev/null 2>&1 || true; done
    fi
    stop_daemon containerd
    local p
    for p in $(pgrep -f "containerd-shim-runc-v2 -namespace k8s.io .*-address $CONTAINERD_SOCK" || true); do kill "$p" 2>/dev/null || true; done
}

# drop_chains REGEX: remove the iptables chains whose names match (and every jump to them)
# in the nat, filter and mangle tables.
drop_chains() {
    local re="$1" table chain rule
    for table in nat filter mangle; do
        for chain in $(iptables -t "$table" -S 2>/dev/null | awk -v re="$re" '$1=="-N" && $2 ~ re {print $2}'); do
            while read -r rule; do
                [ -n "$rule" ] || continue
                eval "iptables -t $table ${rule/-A /-D }" 2>/dev/null || true
            done < <(iptables -t "$table" -S 2>/dev/null | grep -E -- "-j $chain( |\$)" || true)
        done
        for chain in $(iptables -t "$table" -S 2>/dev/null | awk -v re="$re" '$1=="-N" && $2 ~ re {print $2}'); do
            iptables -t "$table" -F "$chain" 2>/dev/null || true
        done
        for chain in $(iptables -t "$table" -S 2>/dev/null | awk -v re="$re" '$1=="-N" && $2 ~ re {print $2}'); do
            iptables -t "$table" -X "$chain" 2>/dev/null || true
        done
    done
}

# umount_under REGEX: unmount the mounts whose path matches, deepest first.
umount_under() {
    # nothing mounted there is no error (grep's status 1 under pipefail): lab/down twice
    awk '{print $2}' /proc/mounts | { grep -E "$1" || true; } | sort -r \
        | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

# ---------------------------------------------------------------- PKI (openssl)
# cert NAME CN ORG KEYUSAGE [SANS]: signs $CERT_DIR/NAME.crt (default $PKI) with the cluster
# CA in $PKI unless present (lab/up: the lab's certificates; lab/fleetctl: each node's).
cert() {
    local name="$1" cn="$2" org="$3" usage="$4" sans="${5:-}" dir="${CERT_DIR:-$PKI}"
    [ -s "$dir/$name.crt" ] && [ -s "$dir/$name.key" ] && return 0
    local subj="/CN=$cn"; [ -n "$org" ] && subj="/O=$org$subj"
    local ext; ext="$(mktemp)"
    {
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$usage"
        [ -n "$sans" ] && echo "subjectAltName=$sans"
    } >"$ext"
    openssl req -new -newkey rsa:2048 -nodes -keyout "$dir/$name.key" -subj "$subj" -out "$dir/$name.csr" 2>/dev/null
    openssl x509 -req -in "$dir/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
        -days 3650 -sha256 -extfile "$ext" -out "$dir/$name.crt" 2>/dev/null
    rm -f "$ext" "$dir/$name.csr"
    chmod 600 "$dir/$name.key"
}

# kubeconfig FILE USER CERTNAME [SERVER]: a kubeadm-style kubeconfig with embedded credentials
# (the certificate from $CERT_DIR, default $PKI).
kubeconfig() {
    local file="$1" user="$2" certname="$3" server="${4:-$APISERVER}"
    [ -s "$file" ] && grep -q "server: $server" "$file" && return 0
    cat >"$file" <<EOF
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
    server: $server
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: $user
  name: $user@kubernetes
current-context: $user@kubernetes
kind: Config
preferences: {}
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 <"${CERT_DIR:-$PKI}/$certname.crt")
    client-key-data: $(base64 -w0 <"${CERT_DIR:-$PKI}/$certname.key")
EOF
    chmod 600 "$file"
}

# ---------------------------------------------------------------- node configuration
# A node's files, printed: lab/up writes the lab node's, lab/fleet/node-init a fleet node's
# (where its dialect under lab/fleet/dialects/ has no file of its own).

# cni_conflist SUBNET: the bridge CNI conflist of a node whose pods get SUBNET.
cni_conflist() {
    cat <<EOF
{
  "cniVersion": "0.4.0",
  "name": "gpuk8s-lab",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "$1" }]],
                "routes": [{ "dst": "0.0.0.0/0" }] }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } },
    { "type": "firewall" }
  ]
}
EOF
}

# registry_hosts_toml URL: containerd's hosts.toml that sends a registry's pulls to URL.
registry_hosts_toml() {
    cat <<EOF
# gpuk8s-lab: the local registry speaks plain HTTP.
server = "$1"
[host."$1"]
  capabilities = ["pull", "resolve", "push"]
EOF
}

# containerd_config 1.6|2: the containerd config for Debian's 1.6 (version 2) or for the 2.x
# lab/tools.sh builds (version 3; its own root and state, see CONTAINERD2_ROOT).
containerd_config() {
    if [ "$1" = 2 ]; then
        cat <<EOF
version = 3
root = "$CONTAINERD2_ROOT"
state = "$CONTAINERD2_STATE"
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "/etc/containerd/certs.d"
[plugins."io.containerd.cri.v1.runtime"]
  # Machines of this kind deny lowering oom_score_adj (see the 1.6 config above).
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
EOF
    else
        cat <<EOF
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Machines of this kind deny lowering oom_score_adj (no CAP_SYS_RESOURCE): without this,
  # runc fails every pod sandbox (the kubelet asks -998) with "can't get final child's PID".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
EOF
    fi
}

# kubelet_config: the KubeletConfiguration of a node (its files under $KUBE_ETC).
kubelet_config() {
    cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 host (hybrid hierarchy): Kubernetes 1.35 refuses it unless this is false.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
staticPodPath: $KUBE_ETC/manifests
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: $PKI/ca.crt }
authorization: { mode: Webhook }
tlsCertFile: $PKI/kubelet-server.crt
tlsPrivateKeyFile: $PKI/kubelet-server.key
failSwapOn: false
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
maxPods: 110
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: { memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%" }
syncFrequency: 10s
fileCheckFrequency: 5s
# Report allocatable changes (device plugin health) within a second.
nodeStatusUpdateFrequency: 1s
nodeStatusReportFrequency: 1m
# The alpha DRA parts gpu-dra uses (lab/versions.env, as the control plane has them).
featureGates:
$(tr ',' '\n' <<<"$KUBE_FEATURE_GATES" | sed -E 's/^([^=]+)=(.*)$/  \1: \2/')
EOF
}

# kube_proxy_config: the KubeProxyConfiguration of node $NODE_NAME.
kube_proxy_config() {
    cat <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: { kubeconfig: $KUBE_ETC/proxy.conf }
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
# Leave the host's conntrack sysctls alone (not writable in every VM).
conntrack: { maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s }
EOF
}

# run_kubelet [FLAG...]: start node $NODE_NAME's kubelet on $KUBELET_DIR/config.yaml.
run_kubelet() {
    DAEMON_INPUTS="$KUBELET_DIR/config.yaml" start_daemon kubelet "$(kube_bin kubelet)" --config="$KUBELET_DIR/config.yaml" \
        --kubeconfig="$KUBE_ETC/kubelet.conf" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" \
        --root-dir="$KUBELET_DIR" --v=1 "$@"
}

# fill_template FILE: FILE with the lab's values for its placeholders, the one set every node
# template uses (lab/manifests/, lab/fleet/dialects/): @SANDBOX_IMAGE@ the pause image,
# @IMAGE@ kube-scheduler's image, @FEATURE_GATES@ the cluster's feature gates.
fill_template() {
    sed -e "s|@SANDBOX_IMAGE@|$PAUSE_IMAGE|g" -e "s|@IMAGE@|$SCHEDULER_IMAGE|g" \
        -e "s|@FEATURE_GATES@|$KUBE_FEATURE_GATES|g" "$1"
}

# scheduler_manifest: kube-scheduler's static pod, the file kubeadm writes.
scheduler_manifest() { fill_template "$LAB_DIR/manifests/kube-scheduler.yaml"; }
