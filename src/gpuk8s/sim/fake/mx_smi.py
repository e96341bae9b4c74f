#!/usr/bin/env python3
"""Simulated MetaX ``mx-smi``, installed as ``<root>/opt/mxdriver/bin/mx-smi``.

Standalone (stdlib only): it finds the simulated root from its own location and reads
``<root>/var/lib/gpuk8s-sim/state.json``. Output follows the real tool's layout: the
banner with the ``MetaX System Management Interface Log`` header, then one
``GPU#n  NAME  BDF`` section per visible GPU. GPUs that are unbound or removed are not
visible (as with the real tool); numbering is over visible GPUs in PCI order.

Load (``gpuk8s sim load``) shows in ``--show-memory``, ``--show-usage``,
``--show-temperature``, ``--show-board-power``, ``--count-ecc``, ``--show-process`` and
``dmon ... --format csv -c 1``. The process table and the dmon CSV follow what public
mx-smi consumers parse (a ``GPU PID NAME MEMORY(MiB)`` table; a CSV with a header row,
a units row, then one row per GPU); per-section field names are our best knowledge.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

VERSION = "2.2.4"
BIOS = "1.25.1.0"
COL = 50


def root_dir() -> str:
    here = os.path.realpath(__file__)
    for _ in range(4):  # <root>/opt/mxdriver/bin/mx-smi
        here = os.path.dirname(here)
    return here


def load() -> dict[str, Any]:
    path = os.path.join(root_dir(), "var/lib/gpuk8s-sim/state.json")
    with open(path, encoding="utf-8") as handle:
        state: dict[str, Any] = json.load(handle)
    return state


def visible(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in state["gpus"] if g["status"] in ("ok", "fault")]


def kv(key: str, value: object, indent: int) -> str:
    left = " " * indent + key
    return f"{left.ljust(COL)}: {value}"


def banner(count: int) -> list[str]:
    return [
        f"mx-smi  version: {VERSION}",
        "",
        "=================== MetaX System Management Interface Log ===================",
        kv("Timestamp", time.strftime("%a %b %d %H:%M:%S %Y"), 0),
        "",
        kv("Attached GPUs", count, 0),
    ]


def sections(state: dict[str, Any], title: str, rows: Any) -> list[str]:
    gpus = visible(state)
    out = banner(len(gpus))
    for n, gpu in enumerate(gpus):
        out.append(f"GPU#{n}  {gpu['name']}  {gpu['bdf']}")
        out.append(f"    {title}")
        out.extend(kv(k, v, 8) for k, v in rows(gpu))
        out.append("")
    out.append("End of Log")
    return out


def hwinfo(gpu: dict[str, Any]) -> list[tuple[str, object]]:
    return [
        ("Device Name", gpu["name"]),
        ("Vendor ID", f"0x{gpu['vendor']:04x}"),
        ("Device ID", f"0x{gpu['device']:04x}"),
        ("UUID", gpu["uuid"]),
        ("Serial Number", gpu["serial"]),
        ("BIOS Version", BIOS),
        ("Bus-id", gpu["bdf"]),
    ]


def gpu_load(gpu: dict[str, Any]) -> dict[str, Any]:
    defaults = {"utilization": 0, "memory_used_mib": 0, "temperature": 36, "power": 69.0,
                "ecc_corrected": 0, "ecc_uncorrected": 0}
    return {**defaults, **gpu.get("load", {})}


def memory(gpu: dict[str, Any]) -> list[tuple[str, object]]:
    kib = gpu["memory_mib"] * 1024
    used = int(gpu_load(gpu)["memory_used_mib"]) * 1024
    return [
        ("vis_vram total", f"{kib} KB"),
        ("vis_vram used", "0 KB"),
        ("vram total", f"{kib} KB"),
        ("vram used", f"{used} KB"),
        ("xtt total", "0 KB"),
        ("xtt used", "0 KB"),
    ]


def usage(gpu: dict[str, Any]) -> list[tuple[str, object]]:
    return [("GPU", f"{int(gpu_load(gpu)['utilization'])} %"), ("VPUE", "0 %"), ("VPUD", "0 %")]


def temperature(gpu: dict[str, Any]) -> list[tuple[str, object]]:
    hot = float(gpu_load(gpu)["temperature"])
    return [("hotspot", f"{hot:.2f} C"), ("soc", f"{hot - 3:.2f} C")]


def board_power(gpu: dict[str, Any]) -> list[tuple[str, object]]:
    return [("board power", f"{float(gpu_load(gpu)['power']):.2f} W")]


def ecc(gpu: dict[str, Any]) -> list[tuple[str, object]]:
    load = gpu_load(gpu)
    return [
        ("sram correctable", 0),
        ("sram uncorrectable", 0),
        ("dram correctable", int(load["ecc_corrected"])),
        ("dram uncorrectable", int(load["ecc_uncorrected"])),
    ]


def processes(state: dict[str, Any]) -> list[str]:
    gpus = visible(state)
    position = {g["index"]: n for n, g in enumerate(gpus)}
    rows = [p for p in state.get("processes", []) if p["gpu"] in position]
    width = 81
    out = banner(len(gpus))
    out += ["", "Process Information", "+" + "-" * width + "+",
            f"| {'GPU':<6}{'PID':<12}{'Process Name':<45}{'GPU Memory':<17}|",
            f"| {'':<6}{'':<12}{'':<45}{'Usage(MiB)':<17}|",
            "|" + "=" * width + "|"]
    if not rows:
        out.append(f"| {'no process found':<{width - 1}}|")
    for proc in rows:
        name = str(proc.get("name") or "python3")[:44]
        out.append(f"| {position[proc['gpu']]:<6}{proc['pid']:<12}{name:<45}"
                   f"{int(proc['memory_mib']):<17}|")
    out.append("+" + "-" * width + "+")
    return out


def dmon(state: dict[str, Any], args: list[str]) -> list[str] | None:
    """``dmon --show-temperature --show-board-power --show-usage --show-memory
    --total-memory --show-bdf --format csv -c 1`` (the columns asked for, in that order)."""
    if "--format" not in args or args[args.index("--format") + 1 : ][:1] != ["csv"]:
        return None
    columns: list[tuple[str, str, Any]] = [("dev", "Idx", None)]
    flags = {
        "--show-bdf": [("bdfid", "BDF", lambda n, g: g["bdf"])],
        "--show-temperature": [("hottemp", "C", lambda n, g: int(gpu_load(g)["temperature"]))],
        "--show-board-power": [("power", "W", lambda n, g: round(gpu_load(g)["power"]))],
        "--show-usage": [("gpu", "%", lambda n, g: int(gpu_load(g)["utilization"]))],
        "--show-memory": [("vram", "%", lambda n, g: round(
            100 * gpu_load(g)["memory_used_mib"] / g["memory_mib"]))],
        "--total-memory": [("total", "GB", lambda n, g: g["memory_mib"] // 1024)],
    }
    order = ["--show-bdf", "--show-temperature", "--show-board-power", "--show-usage",
             "--show-memory", "--total-memory"]
    for flag in order:
        if flag in args:
            columns += flags[flag]
    lines = [",".join(c[0] for c in columns), ",".join(c[1] for c in columns)]
    for n, gpu in enumerate(visible(state)):
        lines.append(",".join(str(n) if c[2] is None else str(c[2](n, gpu)) for c in columns))
    return lines


def reason(gpu: dict[str, Any]) -> list[tuple[str, object]]:
    return [("Unavailable Reason", gpu["reason"] if gpu["status"] == "fault" else "N/A")]


def topo(state: dict[str, Any]) -> list[str]:
    gpus = visible(state)
    linked = {frozenset(p) for p in state["links"]}
    out = banner(len(gpus))
    out.append("        " + "".join(f"GPU{n:<6}" for n in range(len(gpus))) + "NUMA Affinity")
    for n, a in enumerate(gpus):
        cells = []
        for b in gpus:
            if a is b:
                cells.append("X")
            elif frozenset((a["index"], b["index"])) in linked:
                cells.append("MX")
            elif a["switch"] == b["switch"]:
                cells.append("PIX")
            elif a["numa"] == b["numa"]:
                cells.append("NODE")
            else:
                cells.append("SYS")
        out.append(f"GPU{n:<5}" + "".join(f"{c:<9}" for c in cells) + f"{a['numa']}")
    out += [
        "",
        "Legend:",
        "  X    = Self",
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes",
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host "
        "Bridges within a NUMA node",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "  MX   = Connection traversing MetaXLink",
    ]
    return out


def summary(state: dict[str, Any]) -> list[str]:
    gpus = visible(state)
    out = banner(len(gpus))
    out.append("+" + "-" * 81 + "+")
    out.append(f"| MX-SMI {VERSION:<29}Kernel Mode Driver Version: "
               f"{state['driver']['version']:<16}|")
    out.append(f"| MACA Version: {state['sdk'] or 'N/A':<22}BIOS Version: {BIOS:<30}|")
    out.append("|" + "-" * 36 + "+" + "-" * 21 + "+" + "-" * 22 + "+")
    out.append(f"| {'GPU         NAME':<34} | {'Bus-id':<19} | {'GPU-Util':<20} |")
    out.append(f"| {'Temp        Pwr:Usage/Cap':<34} | {'Memory-Usage':<19} | {'GPU-State':<20} |")
    out.append("|" + "=" * 36 + "+" + "=" * 21 + "+" + "=" * 22 + "|")
    for n, gpu in enumerate(gpus):
        state_text = "Unavailable" if gpu["status"] == "fault" else "Available"
        load = gpu_load(gpu)
        mem = f"{int(load['memory_used_mib'])}/{gpu['memory_mib']} MiB"
        util = f"{int(load['utilization'])}%"
        power = f"{round(load['power'])}W / 350W"
        out.append(f"| {n:<11} {gpu['name']:<22} | {gpu['bdf']:<19} | {util:<20} |")
        out.append(f"| {str(int(load['temperature'])) + 'C':<11} {power:<22} | {mem:<19} | "
                   f"{state_text:<20} |")
        out.append("+" + "-" * 36 + "+" + "-" * 21 + "+" + "-" * 22 + "+")
    return out


def vm(state: dict[str, Any], args: list[str]) -> int:
    """``vm --show-vf`` / ``vm --enable-vf N [-i 0,1]`` / ``vm --disable-vf [-i ...]``."""
    root = root_dir()
    sys.path.insert(0, os.path.join(root, "var/lib/gpuk8s-sim/lib"))
    import gpuk8s_sim_tree as kernel  # type: ignore[import-not-found]  # inside the root

    gpus = visible(state)
    chosen = None
    if "-i" in args:
        wanted = {int(i) for i in args[args.index("-i") + 1].split(",")}
        chosen = [g["index"] for n, g in enumerate(gpus) if n in wanted]
    try:
        if "--enable-vf" in args:
            kernel.set_vfnum(root, int(args[args.index("--enable-vf") + 1]), chosen)
        elif "--disable-vf" in args:
            kernel.set_vfnum(root, 0, chosen)
        elif "--show-vf" not in args:
            print("mx-smi vm: expected --show-vf, --enable-vf N or --disable-vf",
                  file=sys.stderr)
            return 2
    except (kernel.SimError, ValueError, IndexError) as err:
        print(f"mx-smi vm: {err}", file=sys.stderr)
        return 1
    state = load()
    lines = sections(state, "Virtualization", lambda g: [
        ("SR-IOV", "Enabled" if g["vfs"] else "Disabled"),
        ("Total VFs", g["total_vfs"]),
        ("Enabled VFs", len(g["vfs"])),
        *((f"VF{n} Bus-id", vf["bdf"]) for n, vf in enumerate(g["vfs"])),
    ])
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    try:
        state = load()
    except (OSError, ValueError) as err:
        print(f"mx-smi: failed to initialize mxsml: {err}", file=sys.stderr)
        return 2
    args = [a for a in argv if a]
    if not args:
        lines = summary(state)
    elif args[:2] == ["topo", "-m"]:
        lines = topo(state)
    elif args[0] == "-L":
        gpus = visible(state)
        lines = [*banner(len(gpus)), *(f"GPU#{n}  {g['name']}  {g['bdf']}  (UUID: {g['uuid']})"
                                       for n, g in enumerate(gpus))]
    elif args[0] == "--show-hwinfo":
        lines = sections(state, "Hardware Information", hwinfo)
    elif args[0] == "--show-sn":
        lines = sections(state, "Board Information", lambda g: [("Serial Number", g["serial"])])
    elif args[0] == "--show-memory":
        lines = sections(state, "Memory", memory)
    elif args[0] == "--show-usage":
        lines = sections(state, "Utilization", usage)
    elif args[0] == "--show-temperature":
        lines = sections(state, "Temperature", temperature)
    elif args[0] == "--show-board-power":
        lines = sections(state, "Board Power", board_power)
    elif args[0] == "--count-ecc":
        lines = sections(state, "ECC Error Count", ecc)
    elif args[0] == "--show-process":
        lines = processes(state)
    elif args[0] == "dmon":
        found = dmon(state, args[1:])
        if found is None:
            print("mx-smi dmon: only --format csv is simulated", file=sys.stderr)
            return 2
        lines = found
    elif args[0] == "--show-unavailable-reason":
        lines = sections(state, "Availability", reason)
    elif args[0] == "vm":
        return vm(state, args[1:])
    elif args[0] == "--show-version":
        lines = sections(state, "Version", lambda g: [
            ("Kernel Mode Driver Version", state["driver"]["version"]),
            ("MACA Version", state["sdk"] or "N/A"),
            ("BIOS Version", BIOS),
        ])
    else:
        print(f"mx-smi: unrecognized arguments: {' '.join(args)}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
