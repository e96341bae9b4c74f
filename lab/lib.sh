# shellcheck shell=bash
# shellcheck disable=SC2034  # settings used by the scripts that source this file
# Shared settings and helpers for lab/up, lab/down, lab/status, lab/ctl (sourced, not run).

LAB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$LAB_DIR/.." && pwd)"
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
