# shellcheck shell=bash
# as_root "$@": run the calling script again as root through sudo when a user started it,
# so that the README's commands work as typed from a root shell without sudo (many fresh
# Debian machines and containers have none) and from a user shell with it. Sourced by
# lab/lib.sh and scripts/test; the settings this project reads from the environment
# (GPUK8S_*, PIP_*, GO*, proxies, PATH for the Go toolchain) go along. The caller's PATH
# gets root's sbin directories added where it lacks them: a user's PATH on Debian has none,
# and the scripts run sysctl, ip, modprobe and the like as root.
as_root() {
    [ "$(id -u)" -eq 0 ] && return 0
    if ! command -v sudo >/dev/null 2>&1; then
        printf '%s: must run as root, and sudo is not installed: run it from a root shell\n' "$0" >&2
        exit 1
    fi
    local keep=() name path="$PATH" dir
    for dir in /usr/local/sbin /usr/sbin /sbin; do
        case ":$path:" in
            *":$dir:"*) ;;
            *) path="$path:$dir" ;;
        esac
    done
    keep+=("PATH=$path")
    for name in $(compgen -e); do
        case "$name" in
            GPUK8S_*|PIP_*|GO*|KUBECONFIG_LAB|http_proxy|https_proxy|no_proxy|HTTP_PROXY|HTTPS_PROXY|NO_PROXY)
                keep+=("$name=${!name}") ;;
        esac
    done
    # (called before the script changes directory, so $0 still resolves from the caller's)
    exec sudo -- env "${keep[@]}" "$(readlink -f -- "$0")" "$@"
}
