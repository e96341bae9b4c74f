#!/usr/bin/env python3
"""Simulated ``nvidia-smi``, installed as ``<root>/usr/bin/nvidia-smi``.

Standalone (stdlib only): finds the simulated root from its own location and reads
``<root>/var/lib/gpuk8s-sim/state.json``. Answers ``-L``, ``--query-gpu=... --format=csv
[,noheader][,nounits]``, ``--query-compute-apps=...`` and ``topo -m``; load set with
``gpuk8s sim load`` shows in the utilisation, memory, temperature, power, ECC and
process fields. A GPU in fault is reported like a GPU that fell
off the bus ("Unable to determine the device handle ...", exit status 15).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

UNITS = {"memory.total": "MiB", "memory.used": "MiB", "utilization.gpu": "%",
         "power.draw": "W", "used_memory": "MiB"}


def root_dir() -> str:
    here = os.path.realpath(__file__)
    for _ in range(3):  # <root>/usr/bin/nvidia-smi
        here = os.path.dirname(here)
    return here


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


def main(argv: list[str]) -> int:
    try:
        state = load()
    except (OSError, ValueError) as err:
        print(f"NVIDIA-SMI has failed: {err}", file=sys.stderr)
        return 9
    present = [g for g in state["gpus"] if g["status"] in ("ok", "fault")]
    gpus = [g for g in present if g["status"] == "ok"]
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
        print("\t" + "\t".join(f"GPU{n}" for n in range(len(gpus)))
              + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID")
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
    if argv[:1] == ["-L"] or not argv:
        for n, gpu in enumerate(gpus):
            print(f"GPU {n}: {gpu['name']} (UUID: {gpu['uuid']})")
        return rc
    print(f"Invalid combination of input arguments: {' '.join(argv)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
