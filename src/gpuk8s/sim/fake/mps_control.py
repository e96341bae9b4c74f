#!/usr/bin/env python3
"""Simulated ``nvidia-cuda-mps-control``, installed as ``<root>/usr/bin/nvidia-cuda-mps-control``.

Standalone (stdlib only). Behaves like the real control program for what gpuk8s uses:

* ``nvidia-cuda-mps-control -d``: exits 244 when ``libcuda.so.1`` cannot be loaded by
  soname (as the real one did in a pod-like mount namespace); else daemonises (the
  command returns once the daemon is up) and serves the pipe directory
  ``$CUDA_MPS_PIPE_DIRECTORY`` (default
  ``/tmp/nvidia-mps``): the ``control`` socket, ``control_lock``, the ``log`` FIFO and
  ``nvidia-cuda-mps-control.pid``; it logs to ``$CUDA_MPS_LOG_DIRECTORY/control.log``
  (default ``/var/log/nvidia-mps``). A second ``-d`` on the same pipe directory fails.
* ``nvidia-cuda-mps-control`` (no argument): sends each line of stdin to the daemon of
  ``$CUDA_MPS_PIPE_DIRECTORY`` and prints its answers; exit status 1 when no daemon
  answers. Commands: ``quit`` (the daemon removes its pid file and exits),
  ``get_default_active_thread_percentage``, ``set_default_active_thread_percentage N``,
  ``set_default_device_pinned_mem_limit DEV VALUE``, ``get_server_list``.

The daemon keeps the environment it was started with (``CUDA_VISIBLE_DEVICES``,
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) in its ``/proc/<pid>/environ``, as the real one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time

PID_FILE = "nvidia-cuda-mps-control.pid"


def pipe_dir() -> str:
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"


def log_dir() -> str:
    return os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"


def running_pid(directory: str) -> int | None:
    try:
        with open(os.path.join(directory, PID_FILE), encoding="utf-8") as handle:
            pid = int(handle.read().strip() or "0")
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return None
    return pid if fields and fields[0] not in ("Z", "X") else None  # a zombie has quit


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    try:
        with open(os.path.join(log_dir(), "control.log"), "a", encoding="utf-8") as handle:
            handle.write(f"[{stamp}] {message}\n")
    except OSError:
        pass


def read_line(conn: socket.socket) -> str:
    """One newline-terminated message (commands and answers are one line each)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


def percentage_text(value: float) -> str:
    return f"{value:.1f}"


def serve(server: socket.socket, directory: str) -> None:
    """The daemon's loop: one command per connection."""
    default = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") or "100"
    try:
        percentage = float(default)
    except ValueError:
        percentage = 100.0
    limits: dict[str, str] = {}
    log(f"Startup (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')})")
    while True:
        conn, _ = server.accept()
        with conn:
            words = read_line(conn).split()
            reply = ""
            quit_now = False
            if not words:
                reply = ""
            elif words == ["quit"]:
                log("Received quit")
                quit_now = True
            elif words == ["get_default_active_thread_percentage"]:
                reply = percentage_text(percentage)
            elif words[0] == "set_default_active_thread_percentage" and len(words) == 2:
                try:
                    value = float(words[1])
                    if not 0 < value <= 100:
                        raise ValueError
                    percentage = value
                    reply = percentage_text(percentage)
                except ValueError:
                    reply = "Invalid percentage"
            elif words[0] == "set_default_device_pinned_mem_limit" and len(words) == 3:
                limits[words[1]] = words[2]
                reply = ""
            elif words == ["get_server_list"]:
                reply = ""
            else:
                reply = f"Unrecognized command: {' '.join(words)}"
            log(f"Command {' '.join(words)}")
            conn.sendall((reply + "\n").encode())
        if quit_now:
            break
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(directory, PID_FILE))
    log("Exit")


def driver_loadable() -> bool:
    """The real daemon links ``libcuda.so.1``: started where the loader cannot find it (a
    pod with the host at /host and no LD_LIBRARY_PATH for the driver), it exited 244 on an
    H100 with driver 580.159.04, and started with the driver's directory on it."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def daemon() -> int:
    directory = pipe_dir()
    if not driver_loadable():
        print("libcuda.so.1: cannot open shared object file", file=sys.stderr)
        return 244
    if running_pid(directory) is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    for path in (directory, log_dir()):
        os.makedirs(path, exist_ok=True)
    control = os.path.join(directory, "control")
    if os.path.lexists(control):
        os.unlink(control)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(control)
    except OSError as err:
        print(f"Failed to create the control socket {control}: {err}", file=sys.stderr)
        return 1
    server.listen(16)
    for name in ("control_lock",):
        open(os.path.join(directory, name), "a").close()
    fifo = os.path.join(directory, "log")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    if os.path.lexists(os.path.join(directory, PID_FILE)):  # left by a daemon that died
        os.unlink(os.path.join(directory, PID_FILE))
    if os.fork() > 0:  # the caller's process: return once the daemon wrote its pid
        pid_path = os.path.join(directory, PID_FILE)
        for _ in range(500):
            if os.path.exists(pid_path):
                return 0
            time.sleep(0.01)
        return 1
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    tmp = os.path.join(directory, f".{PID_FILE}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(f"{os.getpid()}\n")
    os.replace(tmp, os.path.join(directory, PID_FILE))
    try:
        serve(server, directory)
    finally:
        server.close()
    os._exit(0)


def client() -> int:
    directory = pipe_dir()
    rc = 0
    for line in sys.stdin.read().splitlines():
        if not line.strip():
            continue
        if running_pid(directory) is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(5)
                conn.connect(os.path.join(directory, "control"))
                conn.sendall((line.strip() + "\n").encode())
                text = read_line(conn).rstrip("\n")
        except OSError as err:
            print(f"Cannot connect to MPS control daemon: {err}", file=sys.stderr)
            return 1
        if text:
            print(text)
        if text.startswith("Unrecognized") or text.startswith("Invalid"):
            rc = 1
    return rc


def main(argv: list[str]) -> int:
    if argv == ["-d"]:
        return daemon()
    if not argv:
        return client()
    print(f"Unsupported option(s): {' '.join(argv)} (use -d, or commands on stdin)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
