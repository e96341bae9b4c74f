"""``gpuk8s sim create|fail|heal|vfnum|sync|show --root DIR`` (from ``gpuk8s.cli``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..core.errors import GpuK8sError
from . import FAIL_MODES, PRESETS, create, fail, heal, set_vfnum, state, sync, write_payload


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

    p = sub.add_parser("sync", help="apply sriov_numvfs values written into the sysfs")
    p.add_argument("--root", required=True)

    p = sub.add_parser("payload", help="write a simulated driver or SDK payload tree "
                       "(what the operator's payload images carry)")
    p.add_argument("kind", choices=("driver", "maca"))
    p.add_argument("--version", required=True)
    p.add_argument("--out", required=True, help="directory to write into")
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
        lines.append(
            f"GPU{gpu['index']:<3} {gpu['bdf']}  {gpu['name']:<22} numa {gpu['numa']}  "
            f"switch {gpu['switch']}  vfs {len(gpu['vfs'])}  {status}"
        )
    if current["links"]:
        lines.append(f"links ({current['link_cell']}): "
                     + " ".join(f"{a}-{b}" for a, b in current["links"]))
    return "\n".join(lines)


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
        elif args.command == "payload":
            write_payload(args.kind, args.version, args.out)
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
