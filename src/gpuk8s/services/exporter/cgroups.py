"""Which container a host process runs in, from ``/proc/<pid>/cgroup``.

The kubelet puts every container in a cgroup whose path names the pod UID and the
container ID, with either cgroup driver::

    systemd:  .../kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope
              (docker-<id>.scope, crio-<id>.scope)
    cgroupfs: .../kubepods/burstable/pod<uid>/<id>

The path is read through the host's procfs (mounted at ``--proc-dir``), so the exporter
needs neither hostPID nor the container runtime's socket. In another cgroup namespace
the path is relative (``/../../kubepods...``): only the last components matter here.
"""

from __future__ import annotations

import os
import re

_POD_RE = re.compile(r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}"
                     r"[-_][0-9a-fA-F]{12})")
_CONTAINER_RE = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")


def parse_cgroup(text: str) -> tuple[str, str] | None:
    """(pod UID, container ID) from the content of ``/proc/<pid>/cgroup``, or None
    when the process is not in a Kubernetes container."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        pod = _POD_RE.search(path)
        container = _CONTAINER_RE.search(path)
        if pod and container:
            return pod.group(1).replace("_", "-").lower(), container.group(1)
    return None


def container_of(proc_dir: str, pid: int) -> tuple[str, str] | None:
    """(pod UID, container ID) of host PID ``pid``; None when it is gone or not a
    container's."""
    try:
        with open(os.path.join(proc_dir, str(pid), "cgroup"), encoding="utf-8") as handle:
            return parse_cgroup(handle.read(64 * 1024))
    except OSError:
        return None
