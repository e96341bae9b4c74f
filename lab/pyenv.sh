#!/usr/bin/env bash
# Print the path of a virtualenv (under the cache) with this checkout installed editable,
# for the lab's host-side use of the `gpuk8s` CLI (simulator, fake nodes, benchmarks)
# and the e2e tests (pytest, ansible-playbook).
# Reinstalls when pyproject.toml changes.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${GPUK8S_CACHE:-/var/cache/gpuk8s}"
VENV="$CACHE/venv"
# the interpreter too: root's python3 (pyenv, say) and a sudo user's PATH's (Debian's) may
# differ, and `python3 -m venv` over a venv another interpreter made leaves it broken
python="$(readlink -f "$(python3 -c 'import sys; print(sys.executable)')")"
stamp="$(sha256sum "$REPO_DIR/pyproject.toml" | cut -c1-16)-$(echo "$REPO_DIR" | sha256sum | cut -c1-8)-$(echo "$python" | sha256sum | cut -c1-8)"
if [ ! -x "$VENV/bin/gpuk8s" ] || [ "$(cat "$VENV/.gpuk8s-stamp" 2>/dev/null)" != "$stamp" ]; then
    clear=()
    if [ -e "$VENV/bin/python3" ] && [ "$(readlink -f "$VENV/bin/python3")" != "$python" ]; then
        clear=(--clear)  # made by another interpreter: start again
    fi
    python3 -m venv ${clear[@]+"${clear[@]}"} "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip >"$CACHE/venv-install.log" 2>&1 || true
    # [dev]: pytest and ansible (with the collections the playbooks use) for the e2e tier.
    "$VENV/bin/pip" install -q -e "${REPO_DIR}[dev]" >>"$CACHE/venv-install.log" 2>&1 ||
        { tail -20 "$CACHE/venv-install.log" >&2; echo "[lab] ERROR: pip install -e $REPO_DIR failed" >&2; exit 1; }
    echo "$stamp" >"$VENV/.gpuk8s-stamp"
fi
echo "$VENV"
