"""``gpuk8s sim create|fail|heal|vfnum|sync|load|show --root DIR`` (from ``gpuk8s.cli``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..core.errors import ConfigError, GpuK8sError
from . import (
    FAIL_MODES,
    PAYLOAD_KINDS,
    PRESETS,
    clear_load,
    create,
    fail,
    heal,
    refresh,
    set_load,
    set_vfnum,
    state,
    sync,
    tree,
    write_payload,
)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="gpuk8s sim", description="simulated GPU nodes")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("create", help="write a simulated host tree")
    p.add_argument("--preset", required=True, choices=sorted(PRESETS),
                   help="; ".join(f"{k}: {v}" for k, v in PRESETS.items()))
    p.add_argument("--root", required=True)
    p.add_argument("--vfnum", type=int, choices=(0, 1, 2, 4, 8),
                   help="VFs per GPU (MetaX presets with SR-IOV)")
    p.add_argument("--device-nodes", choices=("files", "char"), default="files",
                   help="regular files (default) or real char devices (needs CAP_MKNOD)")
    p.add_argument("--force", action="store_true", help="replace an existing simulated root")

    p = sub.add_parser("fail", help="make a GPU fail")
    p.add_argument("--root", required=True)
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--mode", choices=FAIL_MODES, default="fault")
    p.add_argument("--reason", help="reason the vendor tool reports (mode fault)")

    p = sub.add_parser("heal", help="restore a GPU (or all)")
    p.add_argument("--root", required=True)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--gpu", type=int)
    target.add_argument("--all", action="store_true")

    p = sub.add_parser("vfnum", help="configure SR-IOV VFs per GPU (as the driver would)")
    p.add_argument("--root", required=True)
    p.add_argument("--vfnum", type=int, required=True, choices=(0, 1, 2, 4, 8))
    p.add_argument("--gpu", type=int, action="append", help="only this GPU (repeatable)")

    p = sub.add_parser("refresh", help="re-install the stand-in tools (mx-smi, ...) of this "
                       "gpuk8s into an existing root, keeping its state")
    p.add_argument("--root", required=True)

    p = sub.add_parser("sync", help="apply sriov_numvfs values written into the sysfs")
    p.add_argument("--root", required=True)

    p = sub.add_parser("load", help="set a GPU's load (utilisation, memory, processes)")
    p.add_argument("--root", required=True)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--gpu", type=int, help="GPU index (PCI order)")
    target.add_argument("--clear", action="store_true", help="every GPU idle, no process")
    p.add_argument("--utilization", type=float, help="percent busy, 0..100")
    p.add_argument("--memory-used-mib", type=int,
                   help="memory in use (default: the processes' sum when --process is given)")
    p.add_argument("--temperature", type=float, help="degrees C")
    p.add_argument("--power", type=float, help="board power, W")
    p.add_argument("--ecc-corrected", type=int, help="corrected ECC errors so far")
    p.add_argument("--ecc-uncorrected", type=int, help="uncorrected ECC errors so far")
    p.add_argument("--process", action="append", metavar="PID:MIB[:PCT]",
                   help="a process on the GPU (host pid, memory MiB, optional percent of the "
                   "GPU it keeps busy); repeatable; replaces the GPU's process list")
    p.add_argument("--no-processes", action="store_true", help="remove the GPU's processes")

    p = sub.add_parser("payload", help="write a simulated driver or SDK payload tree "
                       "(what the operator's payload images carry), or the stand-in "
                       "NVIDIA-Linux-x86_64-<version>.run (nvidia-driver)")
    p.add_argument("kind", choices=PAYLOAD_KINDS)
    p.add_argument("--version", required=True)
    p.add_argument("--out", required=True, help="directory to write into")
    p.add_argument("--kernel-release", default=tree.KERNEL_RELEASE,
                   help="driver: the kernel its module is built for (default "
                   f"{tree.KERNEL_RELEASE}, a new simulated root's)")

    p = sub.add_parser("show", help="print the simulated state")
    p.add_argument("--root", required=True)
    p.add_argument("--json", action="store_true")
    return top


def render(current: dict[str, Any]) -> str:
    driver = current["driver"]
    lines = [
        f"preset {current['preset']}: vendor {current['vendor']}, "
        f"driver {driver['version'] if driver['loaded'] else 'not loaded'}, "
        f"sdk {current['sdk'] or '-'}, vfnum {current['vfnum']}, "
        f"device nodes {current['device_nodes']}",
    ]
    for gpu in current["gpus"]:
        status = gpu["status"] + (f" ({gpu['reason']})" if gpu["reason"] else "")
        load = gpu.get("load")
        busy = (f"  util {load.get('utilization', 0)}% mem {load.get('memory_used_mib', 0)} MiB"
                if load else "")
        lines.append(
            f"GPU{gpu['index']:<3} {gpu['bdf']}  {gpu['name']:<22} numa {gpu['numa']}  "
            f"switch {gpu['switch']}  vfs {len(gpu['vfs'])}  {status}{busy}"
        )
    for proc in current.get("processes", []):
        lines.append(f"  process {proc['pid']} on GPU{proc['gpu']}: {proc['memory_mib']} MiB, "
                     f"{proc['utilization']}%")
    if current["links"]:
        lines.append(f"links ({current['link_cell']}): "
                     + " ".join(f"{a}-{b}" for a, b in current["links"]))
    return "\n".join(lines)


def parse_process(text: str) -> dict[str, Any]:
    """``PID:MIB[:PCT]`` -> the dict ``set_load`` takes."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        out: dict[str, Any] = {"pid": int(parts[0]), "memory_mib": int(parts[1])}
        if len(parts) == 3:
            out["utilization"] = float(parts[2])
    except ValueError as err:
        raise ConfigError(
            f"--process {text!r}: expected PID:MIB or PID:MIB:PERCENT, e.g. 4242:2048:35"
        ) from err
    return out


def run_load(args: argparse.Namespace) -> None:
    if args.clear:
        clear_load(args.root)
        return
    processes = [parse_process(p) for p in args.process or []]
    if args.no_processes and processes:
        raise ConfigError("--no-processes and --process exclude each other")
    set_load(
        args.root,
        args.gpu,
        utilization=args.utilization,
        memory_used_mib=args.memory_used_mib,
        temperature=args.temperature,
        power=args.power,
        ecc_corrected=args.ecc_corrected,
        ecc_uncorrected=args.ecc_uncorrected,
        processes=[] if args.no_processes else (processes or None),
    )


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "create":
            create(args.root, args.preset, args.vfnum, args.device_nodes, force=args.force)
            print(f"created {args.preset} at {args.root}")
        elif args.command == "fail":
            fail(args.root, args.gpu, args.mode, args.reason)
        elif args.command == "heal":
            heal(args.root, None if args.all else args.gpu)
        elif args.command == "vfnum":
            set_vfnum(args.root, args.vfnum, args.gpu)
        elif args.command == "refresh":
            refresh(args.root)
        elif args.command == "load":
            run_load(args)
        elif args.command == "payload":
            write_payload(args.kind, args.version, args.out, args.kernel_release)
            print(f"{args.kind} payload {args.version} at {args.out}")
        elif args.command == "sync":
            print("changed" if sync(args.root) else "unchanged")
        else:
            current = state(args.root)
            print(json.dumps(current, indent=2) if args.json else render(current))
    except GpuK8sError as err:
        print(f"gpuk8s sim: {err}", file=sys.stderr)
        return 2
    except PermissionError as err:
        print(f"gpuk8s sim: {err} (char device nodes need root / CAP_MKNOD)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
