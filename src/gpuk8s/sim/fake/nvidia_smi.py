#!/usr/bin/env python3
"""Simulated ``nvidia-smi``, installed as ``<root>/usr/bin/nvidia-smi``.

Standalone (stdlib only): finds the simulated root from its own location and reads
``<root>/var/lib/gpuk8s-sim/state.json``. Answers with no argument (the status table the
accelerator manual shows: ``Driver Version: ...  CUDA Version: ...``), ``-L``,
``--query-gpu=... --format=csv[,noheader][,nounits]`` (``compute_cap``, ``driver_version``
included; ``-l SEC`` repeats it every SEC seconds until interrupted, the heading once),
``--query-compute-apps=...`` and ``topo -m``; load set with ``gpuk8s sim load``
shows in the utilisation, memory, temperature, power, ECC and process fields. A GPU in
fault is reported like a GPU that fell off the bus ("Unable to determine the device handle
...", exit status 15).

Like the real one, it is an NVML client: without ``libnvidia-ml.so.1`` (under the root; in
a container, through the dynamic loader's cache) it exits 12, while the driver is not
loaded it exits 9 ("couldn't communicate with the NVIDIA driver"), it sees only the GPUs
whose ``/dev/nvidia<minor>`` it can reach (in a container: the ones it was given), and
with none it prints "No devices were found" (exit 6).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

UNITS = {"memory.total": "MiB", "memory.used": "MiB", "utilization.gpu": "%",
         "power.draw": "W", "used_memory": "MiB"}


def root_dir() -> str:
    here = os.path.realpath(__file__)
    for _ in range(3):  # <root>/usr/bin/nvidia-smi
        here = os.path.dirname(here)
    return here


NVML_SONAME = "libnvidia-ml.so.1"
NVML_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu", "usr/lib")
NO_NVML = ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure "
           "that the NVIDIA Display Driver is properly installed and present in your system.\n"
           "Please also try adding directory that contains libnvidia-ml.so to your system PATH.")
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")


def has_nvml(root: str) -> bool:
    """Whether NVML can be found the way the real nvidia-smi looks for it."""
    if root != "/":
        return any(os.path.isfile(os.path.join(root, d, NVML_SONAME)) for d in NVML_DIRS)
    import ctypes  # the whole host (or a container): the dynamic loader decides

    try:
        ctypes.CDLL(NVML_SONAME)
    except OSError:
        return False
    return True


def load() -> dict[str, Any]:
    path = os.path.join(root_dir(), "var/lib/gpuk8s-sim/state.json")
    with open(path, encoding="utf-8") as handle:
        state: dict[str, Any] = json.load(handle)
    return state


def bus_id(gpu: dict[str, Any]) -> str:
    return "0000" + str(gpu["bdf"]).upper()


def gpu_load(gpu: dict[str, Any]) -> dict[str, Any]:
    defaults = {"utilization": 0, "memory_used_mib": 0, "temperature": 36, "power": 69.0,
                "ecc_corrected": 0, "ecc_uncorrected": 0}
    return {**defaults, **gpu.get("load", {})}


def value(state: dict[str, Any], gpu: dict[str, Any], n: int, name: str) -> str:
    load = gpu_load(gpu)
    values: dict[str, object] = {
        "utilization.gpu": int(load["utilization"]),
        "memory.used": int(load["memory_used_mib"]),
        "temperature.gpu": int(load["temperature"]),
        "power.draw": f"{float(load['power']):.2f}",
        "ecc.errors.corrected.volatile.total": int(load["ecc_corrected"]),
        "ecc.errors.uncorrected.volatile.total": int(load["ecc_uncorrected"]),
        "index": n,
        "pci.bus_id": bus_id(gpu),
        "name": gpu["name"],
        "memory.total": gpu["memory_mib"],
        "serial": gpu["serial"],
        "uuid": gpu["uuid"],
        "driver_version": state["driver"]["version"],
        "minor_number": gpu["index"],
        "compute_cap": gpu.get("compute_capability", "[N/A]"),
        "pci.device_id": f"0x{gpu['device']:04X}{gpu['vendor']:04X}",
    }
    return str(values.get(name, "[N/A]"))


def app_values(gpu: dict[str, Any], proc: dict[str, Any]) -> dict[str, object]:
    return {
        "gpu_bus_id": bus_id(gpu),
        "gpu_uuid": gpu["uuid"],
        "pid": proc["pid"],
        "process_name": proc.get("name") or "python3",
        "used_memory": int(proc["memory_mib"]),
    }


def csv_query(query: str, fmt: str, rows: list[dict[str, object]]) -> int:
    """``--query-...=FIELDS --format=csv[,noheader][,nounits]`` over ``rows``."""
    fields = [f.strip() for f in query.split(",")]
    opts = set(fmt.split(","))
    if "csv" not in opts:
        print("'--format' requires 'csv'", file=sys.stderr)
        return 2
    units = "nounits" not in opts
    if "noheader" not in opts:
        print(", ".join(f + (f" [{UNITS[f]}]" if f in UNITS and units else "") for f in fields))
    for row in rows:
        print(", ".join(str(row.get(f, "[N/A]")) + (f" {UNITS[f]}" if f in UNITS and units
                                                    else "") for f in fields))
    return 0


def table(state: dict[str, Any], gpus: list[dict[str, Any]]) -> None:
    """The status table of ``nvidia-smi`` with no argument (the layout of driver 550)."""
    driver = state["driver"]
    print(time.strftime("%a %b %d %H:%M:%S %Y"))
    rule = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    print("+" + "-" * 89 + "+")
    head = (f"| NVIDIA-SMI {driver['version']:<22}Driver Version: {driver['version']:<15}"
            f"CUDA Version: {driver.get('cuda') or 'N/A':<9}")
    print(head.ljust(90) + "|")
    print(rule.replace("+", "|", 1)[:-1] + "+")
    print("| GPU  Name                 Persistence-M | Bus-Id          Disp.A |"
          " Volatile Uncorr. ECC |")
    print("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage |"
          " GPU-Util  Compute M. |")
    print("|                                         |                        |"
          "               MIG M. |")
    print("|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|")
    for n, gpu in enumerate(gpus):
        load_ = gpu_load(gpu)
        print(f"| {n:>3}  {gpu['name'][:28]:<28}   On  | {bus_id(gpu):>18} Off |"
              f" {load_['ecc_uncorrected']:>20} |")
        power = f"{round(float(load_['power']))}W /  700W"
        memory = f"{int(load_['memory_used_mib'])}MiB / {gpu['memory_mib']}MiB"
        print(f"| N/A   {int(load_['temperature']):>2}C    P0 {power:>23} | {memory:>22} |"
              f" {int(load_['utilization']):>6}%      Default |")
        print("|                                         |                        |"
              "             Disabled |")
        print(rule)
    print()
    print("+" + "-" * 89 + "+")
    print("| Processes:".ljust(90) + "|")
    print("|  GPU   GI   CI        PID   Type   Process name".ljust(79) + "GPU Memory |")
    print("|        ID   ID".ljust(79) + "Usage      |")
    print("|" + "=" * 89 + "|")
    positions = {g["index"]: n for n, g in enumerate(gpus)}
    procs = [p for p in state.get("processes", []) if p["gpu"] in positions]
    if not procs:
        print("|  No running processes found".ljust(90) + "|")
    for proc in procs:
        kind = "M+C" if proc.get("mps") else "C"  # an MPS client, as the real tool marks it
        print(f"|  {positions[proc['gpu']]:>3}   N/A  N/A  {proc['pid']:>9}   {kind:>4}   "
              f"{(proc.get('name') or 'python3')[:40]:<40} {int(proc['memory_mib']):>8}MiB |")
    print("+" + "-" * 89 + "+")


def loop_seconds(argv: list[str]) -> tuple[float | None, list[str]]:
    """``-l [SEC]`` / ``--loop=SEC`` (nvidia-smi's default 5 s): the period, and argv
    without it."""
    for i, arg in enumerate(argv):
        if arg.startswith("--loop="):
            return float(arg.split("=", 1)[1]), argv[:i] + argv[i + 1:]
        if arg in ("-l", "--loop"):
            given = argv[i + 1] if i + 1 < len(argv) else ""
            if given.replace(".", "", 1).isdigit():
                return float(given), argv[:i] + argv[i + 2:]
            return 5.0, argv[:i] + argv[i + 1:]
    return None, argv


def main(argv: list[str]) -> int:
    seconds, argv = loop_seconds(argv)
    if seconds is None:
        return once(argv)
    # repeat until interrupted, as the real one does; the CSV heading only once
    later = [a + ",noheader" if a.startswith("--format=") else a for a in argv]
    rc = once(argv)
    while rc == 0:
        sys.stdout.flush()
        time.sleep(seconds)
        rc = once(later)
    return rc


def once(argv: list[str]) -> int:
    if not has_nvml(root_dir()):
        print(NO_NVML)
        return 12
    try:
        state = load()
    except (OSError, ValueError):
        print(NO_DRIVER)
        return 9
    if not state["driver"].get("loaded"):
        print(NO_DRIVER)
        return 9
    root = root_dir()
    present = [g for g in state["gpus"] if g["status"] in ("ok", "fault")
               and os.path.lexists(os.path.join(root, f"dev/nvidia{g['index']}"))]
    gpus = [g for g in present if g["status"] == "ok"]
    if not gpus and not present:
        print("No devices were found")
        return 6
    broken = [g for g in present if g["status"] == "fault"]
    for gpu in broken:
        print(f"Unable to determine the device handle for GPU{bus_id(gpu)}: "
              f"{gpu['reason'] or 'Unknown Error'}", file=sys.stderr)
    rc = 15 if broken else 0
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    apps = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-compute-apps=")),
                None)
    fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "")
    if apps is not None:
        by_index = {g["index"]: g for g in gpus}
        rows = [app_values(by_index[p["gpu"]], p) for p in state.get("processes", [])
                if p["gpu"] in by_index]
        return csv_query(apps, fmt, rows) or rc
    if query is not None:
        names = [f.strip() for f in query.split(",")]
        return csv_query(query, fmt, [{f: value(state, g, n, f) for f in names}
                                      for n, g in enumerate(gpus)]) or rc
    if argv[:2] == ["topo", "-m"]:
        linked = {frozenset(p) for p in state["links"]}
        # the real tool underlines the heading with ANSI escapes, piped or not (seen with
        # driver 580.159.04 on an H100)
        print("\t\x1b[4m" + "\t".join(f"GPU{n}" for n in range(len(gpus)))
              + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m")
        for n, a in enumerate(gpus):
            cells = []
            for b in gpus:
                if a is b:
                    cells.append(" X ")
                elif frozenset((a["index"], b["index"])) in linked:
                    cells.append(state["link_cell"])
                elif a["switch"] == b["switch"]:
                    cells.append("PIX")
                elif a["numa"] == b["numa"]:
                    cells.append("NODE")
                else:
                    cells.append("SYS")
            cpus = "0-55,112-167" if a["numa"] == 0 else "56-111,168-223"
            print(f"GPU{n}\t" + "\t".join(cells) + f"\t{cpus}\t{a['numa']}\t\tN/A")
        print("\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the "
              "SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n  NODE = Connection "
              "traversing PCIe as well as the interconnect between PCIe Host Bridges within "
              "a NUMA node\n  PIX  = Connection traversing at most a single PCIe bridge\n"
              "  NV#  = Connection traversing a bonded set of # NVLinks")
        return rc
    if not argv:
        table(state, gpus)
        return rc
    if argv[:1] == ["-L"]:
        for n, gpu in enumerate(gpus):
            print(f"GPU {n}: {gpu['name']} (UUID: {gpu['uuid']})")
        return rc
    print(f"Invalid combination of input arguments: {' '.join(argv)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
