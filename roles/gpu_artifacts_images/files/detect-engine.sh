#!/usr/bin/env bash
# detect-engine.sh: which container engine a node's images go to, printed as containerd,
# docker or podman; nothing, and exit status 1, when there is none.
#
# containerd when the kubelet uses it (its namespace k8s.io exists); else a running
# docker (whose own containerd holds only docker's namespace, moby: images imported
# there are invisible to a kubelet on docker); else containerd; else podman.
# CONTAINERD_ADDRESS names another containerd socket.
#
# The one implementation: the images .run inlines the function between the markers
# (package/build.sh) for its `load`, and the gpu_artifacts_images role runs this file
# (ansible.builtin.script) when gpu_artifacts_images_engine is auto.
# >>> detect_engine
detect_engine() {
    local ctr_ok=0
    if command -v ctr >/dev/null && [ -S "${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}" ]; then
        ctr_ok=1
        if ctr namespaces ls -q 2>/dev/null | grep -qx 'k8s.io'; then echo containerd; return 0; fi
    fi
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        echo docker
    elif [ "$ctr_ok" = 1 ]; then
        echo containerd
    elif command -v podman >/dev/null; then
        echo podman
    else
        return 1
    fi
}
# <<< detect_engine
detect_engine
