"""The process serving a unix socket: gpuk8s' one way of finding a running daemon such as
containerd (the node's prerequisite checks, the container-runtime agent, its proof and the
``nvidia_container_runtime`` module all ask here).

The socket's peer credentials (``SO_PEERCRED``) name the process that accepted the
connection, so the answer is the daemon the node really uses, even where another process
of the same name runs beside it (a containerd 2.x beside the distribution's 1.x, a k3s
containerd); its program is ``<proc>/<pid>/exe``, the same build even where the file on
disk was replaced since. The pid is the kernel's answer in this process' pid namespace:
0 where the peer is outside it (a pod without hostPID).

Stdlib only, Python 3.8+.
"""

from __future__ import annotations

import os
import socket
import struct


def socket_peer_pid(path: str) -> int:
    """pid of the process serving the unix socket ``path`` (SO_PEERCRED); 0 when not visible
    here. Raises ``OSError`` when nothing can be connected to there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid)


def peer_pid_or_zero(path: str) -> int:
    """``socket_peer_pid``, 0 when nothing serves the socket (or it cannot be reached)."""
    try:
        return socket_peer_pid(path)
    except OSError:
        return 0


def serving_program(path: str, proc: str = "/proc") -> tuple[int, str] | None:
    """(pid, program) of the process serving the unix socket ``path``: the program is
    ``<proc>/<pid>/exe``; None when nothing serves the socket or the process is not visible
    here (another pid namespace)."""
    pid = peer_pid_or_zero(path)
    if pid <= 0:
        return None
    return pid, os.path.join(proc, str(pid), "exe")
