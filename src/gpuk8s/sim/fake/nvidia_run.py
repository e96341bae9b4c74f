"""The simulator's ``NVIDIA-Linux-x86_64-<version>.run`` (``__main__`` of the zip that
``gpuk8s.sim.write_payload("nvidia-driver", ...)`` builds).

Behaves like NVIDIA's installer for what the accelerator manual does with it
(``chmod a+x``, then ``./NVIDIA-Linux-x86_64-<v>.run --dkms``) and what gpuk8s needs:

* ``--version``; ``--uninstall`` (``-s``/``--silent`` accepted everywhere); ``--dkms``;
* install: refused, with the installer's own message and nothing changed, without ``cc``,
  without the running kernel's headers, without ``dkms`` when ``--dkms`` is given, while
  the nouveau driver is loaded, or while processes use a loaded NVIDIA driver; an older
  driver installed by a ``.run`` is uninstalled first (as the real one does); then the
  files are installed (``gpuk8s_sim_nvidia.install``), DKMS builds the modules, and the
  module is loaded;
* ``nvidia-installer`` / ``nvidia-uninstall`` are installed beside, so the driver can be
  removed later without the ``.run``.

It installs only into a *simulated* root: the directory above its own location that holds
``var/lib/gpuk8s-sim/state.json``; anywhere else it refuses and changes nothing.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile

STATE = "var/lib/gpuk8s-sim/state.json"


def here() -> str:
    return os.path.realpath(sys.argv[0])


def simulated_root(start: str) -> str | None:
    path = os.path.dirname(start)
    while True:
        if os.path.isfile(os.path.join(path, STATE)):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def payload() -> tuple[dict[str, str], bytes | None, dict[str, str], bytes]:
    """(payload.json, NVML library, tool sources, this installer's own bytes)."""
    me = here()
    with open(me, "rb") as handle:
        whole = handle.read()
    with zipfile.ZipFile(me) as archive:
        meta = json.loads(archive.read("payload.json"))
        names = set(archive.namelist())
        nvml = archive.read("libnvidia-ml.so") if "libnvidia-ml.so" in names else None
        tools = {n[len("tools/"):]: archive.read(n).decode() for n in names
                 if n.startswith("tools/")}
    return meta, nvml, tools, whole


def main(argv: list[str]) -> int:
    import gpuk8s_sim_nvidia as driver  # type: ignore[import-not-found]  # inside the zip

    meta, nvml, tools, whole = payload()
    version = meta["version"]
    if os.path.basename(sys.argv[0]) == "nvidia-uninstall":
        argv = ["--uninstall", *argv]
    name = f"NVIDIA-Linux-x86_64-{version}.run"
    if "--version" in argv or "-v" in argv:
        print(f"nvidia-installer:  version {version}")
        return 0
    root = simulated_root(here())
    if root is None:
        print(f"ERROR: {name} is the gpuk8s simulator's stand-in for NVIDIA's installer: it "
              "installs only into a simulated root, and there is none above "
              f"{os.path.dirname(here())}.", file=sys.stderr)
        return 1
    try:
        if "--uninstall" in argv:
            done = driver.uninstall(root)
            if done is None:
                print("ERROR: No NVIDIA driver is currently installed.", file=sys.stderr)
                return 1
            print(f"Uninstallation of existing driver: NVIDIA Accelerated Graphics Driver for "
                  f"Linux-x86_64 ({done['version']}) is complete.")
            return 0
        if os.path.isdir(os.path.join(root, "sys/module/nouveau")):
            raise driver.DriverError(
                "ERROR: The Nouveau kernel driver is currently in use by your system.  This "
                "driver is incompatible with the NVIDIA driver, and must be disabled before "
                "proceeding.")
        driver.check_build_environment(root, "--dkms" in argv)
        previous = driver.read_manifest(root)
        with open(os.path.join(root, STATE), encoding="utf-8") as handle:
            state = json.load(handle)
        if state["driver"].get("loaded") and state.get("processes"):
            raise driver.DriverError(
                "ERROR: An NVIDIA kernel module 'nvidia' appears to already be loaded in your "
                "kernel.  This may be because it is in use (for example, by an X server, a "
                "CUDA program, or the NVIDIA Persistence Daemon) ...")
        if previous is not None:
            print(f"There appears to already be a driver installed on your system (version: "
                  f"{previous['version']}).  As part of installing this driver (version: "
                  f"{version}), the existing driver will be uninstalled.")
            driver.uninstall(root)
        else:
            driver.unload(root)  # a driver not installed by a .run: replaced in place
        driver.install(root, version, nvml=nvml, tools=tools, dkms="--dkms" in argv,
                       installer=whole)
        driver.load(root)
    except driver.DriverError as err:
        print(str(err), file=sys.stderr)
        print("ERROR: Installation has failed.  Please see the file "
              "'/var/log/nvidia-installer.log' for details.", file=sys.stderr)
        return 1
    print(f"Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: "
          f"{version}) is now complete.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
