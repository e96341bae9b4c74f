"""The CDI spec's ``createContainer`` hooks for NVIDIA driver libraries, run by the OCI
runtime (runc) as ``gpuk8s-oci-runtime hook <command> ...``, with the arguments of
nvidia-container-toolkit's ``nvidia-cdi-hook`` (so a spec may name either program):

* ``create-symlinks --link TARGET::LINK ...``: symlinks in the container (the soname links
  ``libcuda.so.1 -> libcuda.so.<version>`` and the ``.so`` links a host has);
* ``update-ldcache --folder DIR ...``: adds the folders to the container's
  ``/etc/ld.so.conf.d`` and rebuilds its ``/etc/ld.so.cache`` with the host's ``ldconfig
  -r`` (which chroots into the container's root), so ``dlopen("libcuda.so.1")`` finds the
  mounted libraries whatever the image's distribution.

createContainer hooks run in the container's mount namespace before ``pivot_root``: the
container's root is the bundle's ``root.path``, with its mounts in place. Everything is
written from a child process chrooted into that root, so a symlink planted in the image
(``/usr/lib/x86_64-linux-gnu -> /etc``) cannot lead a write out of the container.

Stdlib only, Python 3.8+ (packed into the runtime wrapper).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence

CONF_NAME = "/etc/ld.so.conf.d/00-gpuk8s-nvidia.conf"
LDCONFIG_CANDIDATES = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")


class HookError(Exception):
    """The hook cannot do its work; the container must not start half-equipped."""


def container_root(state: dict[str, object]) -> str:
    """The container's root directory from the OCI state on stdin (bundle + config)."""
    bundle = state.get("bundle")
    if not isinstance(bundle, str) or not bundle:
        raise HookError("the OCI state on stdin names no bundle")
    with open(os.path.join(bundle, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    root = ((config.get("root") or {}).get("path")) or "rootfs"
    path = root if os.path.isabs(root) else os.path.join(bundle, root)
    if os.path.realpath(path) == "/":
        raise HookError("the container's root is the host's /: refusing to edit it")
    return path


def in_root(root: str, work: Callable[[], None]) -> None:
    """Run ``work`` in a child process chrooted into ``root``."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.chroot(root)
            os.chdir("/")
            work()
        except BaseException as err:  # reported through the exit status
            sys.stderr.write(f"gpuk8s cdi hook: {err}\n")
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return
    raise HookError(f"editing the container's root {root} failed")


def make_links(links: Sequence[tuple[str, str]]) -> None:
    """Create each ``link -> target`` (inside a chroot); an existing link is replaced, an
    existing file is left alone (the image's own copy wins)."""
    for target, link in links:
        if not link.startswith("/"):
            raise HookError(f"--link {target}::{link}: the link must be an absolute path")
        if os.path.lexists(link):
            if not os.path.islink(link) or os.readlink(link) == target:
                continue
            os.unlink(link)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(target, link)


def write_conf(folders: Sequence[str]) -> None:
    """Our folders in ``/etc/ld.so.conf.d`` (inside a chroot), and the include line in
    ``/etc/ld.so.conf`` where an image has none."""
    os.makedirs(os.path.dirname(CONF_NAME), exist_ok=True)
    with open(CONF_NAME, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{f}\n" for f in folders))
    main_conf = "/etc/ld.so.conf"
    text = ""
    if os.path.isfile(main_conf):
        with open(main_conf, encoding="utf-8") as handle:
            text = handle.read()
    if "ld.so.conf.d" not in text:
        with open(main_conf, "a", encoding="utf-8") as handle:
            handle.write(("" if not text or text.endswith("\n") else "\n")
                         + "include /etc/ld.so.conf.d/*.conf\n")


def ldconfig() -> str:
    for path in LDCONFIG_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    raise HookError(f"no ldconfig on the host ({', '.join(LDCONFIG_CANDIDATES)})")


def parse(args: Sequence[str]) -> tuple[str, list[tuple[str, str]], list[str]]:
    """(command, links, folders) from nvidia-cdi-hook's arguments."""
    if not args or args[0] not in ("create-symlinks", "update-ldcache"):
        raise HookError("usage: hook create-symlinks --link TARGET::LINK ... | "
                        "update-ldcache --folder DIR ...")
    links: list[tuple[str, str]] = []
    folders: list[str] = []
    rest = list(args[1:])
    while rest:
        flag = rest.pop(0)
        value = None
        if "=" in flag:
            flag, value = flag.split("=", 1)
        elif rest:
            value = rest.pop(0)
        if value is None:
            raise HookError(f"{flag} needs a value")
        if flag == "--link":
            target, sep, link = value.partition("::")
            if not sep or not target or not link:
                raise HookError(f"--link {value}: write TARGET::LINK")
            links.append((target, link))
        elif flag == "--folder":
            if not value.startswith("/"):
                raise HookError(f"--folder {value}: an absolute path")
            folders.append(value)
        elif flag in ("--container-spec", "--ldconfig-path"):
            continue  # nvidia-cdi-hook's options we do not need: accepted for compatibility
        else:
            raise HookError(f"unknown option {flag}")
    return args[0], links, folders


def main(args: Sequence[str], stdin: str | None = None) -> int:
    try:
        command, links, folders = parse(args)
        state = json.loads(sys.stdin.read() if stdin is None else stdin)
        root = container_root(state)
        if command == "create-symlinks":
            in_root(root, lambda: make_links(links))
        elif folders:
            in_root(root, lambda: write_conf(folders))
            done = subprocess.run([ldconfig(), "-r", root], capture_output=True, text=True,
                                  check=False)
            if done.returncode != 0:
                raise HookError(f"ldconfig -r {root}: {done.stderr.strip()}")
    except (HookError, OSError, ValueError) as err:
        sys.stderr.write(f"gpuk8s cdi hook: {err}\n")
        return 1
    return 0
