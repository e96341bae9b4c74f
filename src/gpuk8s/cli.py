"""`gpuk8s` command line: detect | labels | dra | topo | allocate | top | exporter | sim | serve |
metax-docker."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from .core.allocator import allocate
from .core.dra import DRA_SHARING_MODES, GROUP_DEVICE_MODES, UNHEALTHY_MODES
from .core.errors import GpuK8sError
from .core.labels import compute_labels
from .core.model import NodeInventory
from .core.topology import Topology, Unit, units_for_inventory
from .services.flags import add_kubeconfig_argument

# `gpuk8s serve NAME ...` runs `main(argv)` of the module below; each service owns
# its flags (see each service's page under docs/).
SERVICES: dict[str, str] = {
    "device-plugin": "gpuk8s.services.deviceplugin.main",
    "labeller": "gpuk8s.services.labeller.main",
    "extender": "gpuk8s.services.extender.main",
    "exporter": "gpuk8s.services.exporter.main",
    "driver-manager": "gpuk8s.services.drivermanager.main",
    "container-runtime": "gpuk8s.services.runtime.main",
    "operator-controller": "gpuk8s.services.operator.main",
    "node-cleanup": "gpuk8s.services.operator.cleanup",
    "mps": "gpuk8s.services.mps.main",
    "dra-plugin": "gpuk8s.services.dra.main",
    "dra-pending": "gpuk8s.services.dra.pending",
}


def _discover(root: str) -> NodeInventory:
    from .discovery import discover

    return discover(root)


def _dump(data: object, fmt: str) -> str:
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False))
    return json.dumps(data, indent=2)


def _resolve_ids(units: Sequence[Unit], given: Sequence[str]) -> list[str]:
    """Accept device ids, or GPU indices as a shorthand (all units of that GPU)."""
    known = {u.id for u in units}
    out: list[str] = []
    for item in given:
        for token in (t for t in item.split(",") if t):
            if token in known:
                out.append(token)
            elif token.isdigit() and any(u.gpu == int(token) for u in units):
                out.extend(u.id for u in units if u.gpu == int(token))
            else:
                raise GpuK8sError(
                    f"unknown device {token!r}: use a device id ({', '.join(sorted(known))}) "
                    "or a GPU index"
                )
    return out


def cmd_detect(args: argparse.Namespace) -> int:
    inv = _discover(args.root)
    if args.format in ("json", "yaml"):
        print(_dump(inv.to_dict(), args.format))
        return 0
    print(f"backend: {inv.backend}   GPUs: {len(inv.gpus)}")
    print(
        f"driver: loaded={inv.driver.loaded} version={inv.driver.version or '-'} "
        f"mode={inv.driver.mode}   SDK: {inv.sdk.version or '-'} ({inv.sdk.path or '-'})"
    )
    for g in inv.gpus:
        mem = g.memory_label or "?"
        print(
            f"  GPU{g.index:<3} {g.pci_address}  {g.product:<8} {mem:>6}  numa={g.numa_node} "
            f"switch={g.pcie_switch or '-'} link_group={g.link_group} sriov={g.sriov.state}"
            f"/{g.sriov.num_vfs} bound={g.driver_bound}"
            + (f"  FAULT: {g.fault}" if g.fault else "")
        )
    for problem in inv.problems:
        print(f"  problem: {problem}")
    return 0


def cmd_labels(args: argparse.Namespace) -> int:
    labels = compute_labels(_discover(args.root))
    if args.json:
        print(json.dumps(labels, indent=2))
    else:
        for key, value in labels.items():
            print(f"{key}={value}")
    return 0


def cmd_dra_slices(args: argparse.Namespace) -> int:
    from .core.dra import PoolOptions, group_devices_wanted, node_slices
    from .discovery import check_health

    inv = _discover(args.root)
    health = check_health(args.root, inv) if inv.gpus else {}
    sick = {index: reason for index, reason in health.items() if reason is not None}
    groups, _ = group_devices_wanted(args.group_devices, args.kube_version)
    options = PoolOptions(sharing=args.sharing_mode, groups=groups,
                          unhealthy=args.unhealthy_devices)
    slices = node_slices(args.node_name, inv, options, unhealthy=sick, node_uid=args.node_uid)
    if args.json:
        print(json.dumps(slices, indent=2))
    else:
        print(_dump({"apiVersion": "v1", "kind": "List", "items": slices}, "yaml"), end="")
    return 0


def cmd_topo(args: argparse.Namespace) -> int:
    inv = _discover(args.root)
    if not inv.gpus:
        print("no GPU found")
        return 0
    units = units_for_inventory(inv) if args.vfs else None
    print(Topology.from_inventory(inv, units).matrix_text())
    return 0


def cmd_allocate(args: argparse.Namespace) -> int:
    inv = _discover(args.root)
    units = units_for_inventory(inv)
    topo = Topology.from_inventory(inv, units)
    available = _resolve_ids(units, args.available) if args.available else [u.id for u in units]
    must = _resolve_ids(units, args.must_include) if args.must_include else []
    from .discovery import check_health

    # what the device plugin would not offer: never preferred, even when listed
    health = check_health(args.root, inv)
    unhealthy = [u.id for u in units if health.get(u.gpu) is not None]
    result = allocate(topo, available, args.size, must, unhealthy=unhealthy)
    if args.json:
        print(json.dumps({"devices": list(result.devices), "explain": result.explain}))
    else:
        print(" ".join(result.devices))
        print(result.explain)
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from .core.gpuusage import KINDS
    from .services.exporter import top

    if args.kind is not None and args.kind not in KINDS:
        raise GpuK8sError(f"--kind: {args.kind!r} is not one of {', '.join(KINDS)}")
    samples = top.collect(args.url or [], args.prometheus, args.kubeconfig)
    if args.view == "nodes":
        rows = top.node_rows(samples, args.kind, args.node)
        text = top.render_nodes(rows)
    else:
        rows = top.pod_rows(samples, args.kind, args.namespace, args.node)
        text = top.render_pods(rows)
    print(json.dumps(rows, indent=2) if args.json else text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="gpuk8s", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpuk8s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("detect", help="discover GPUs, driver and SDK of a host root")
    p.add_argument("--root", default="/", help="host root (default /)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="format", action="store_const", const="json")
    fmt.add_argument("--yaml", dest="format", action="store_const", const="yaml")
    p.set_defaults(func=cmd_detect, format="text")

    p = sub.add_parser("labels", help="node labels of SPEC §4 for a host root")
    p.add_argument("--root", default="/")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_labels)

    p = sub.add_parser("dra", help="DRA driver gpu.metax-tech.com: `gpuk8s dra slices`")
    dra = p.add_subparsers(dest="dra_command", required=True)
    p = dra.add_parser("slices", help="the ResourceSlices gpu-dra would publish for a host root")
    p.add_argument("--root", default="/", help="host root (default /)")
    p.add_argument("--node-name", required=True, help="the node (names the pool and slices)")
    p.add_argument("--json", action="store_true", help="JSON instead of YAML")
    p.add_argument("--sharing-mode", choices=DRA_SHARING_MODES, default="exclusive",
                   help="exclusive (default) or sgpu (consumable vcore/vmemory)")
    p.add_argument("--group-devices", choices=GROUP_DEVICE_MODES, default="auto",
                   help="as gpu-dra's flag (default auto: what the plugin decides for "
                        "--kube-version)")
    p.add_argument("--kube-version", default=None,
                   help="the API server's version (v1.<minor>.<patch>) that --group-devices auto "
                        "weighs (default: unknown)")
    p.add_argument("--unhealthy-devices", choices=UNHEALTHY_MODES, default="taint")
    p.add_argument("--node-uid", default="",
                   help="the Node's metadata.uid: the slices' owner reference, as the plugin "
                        "sets it (default: none)")
    p.set_defaults(func=cmd_dra_slices)

    p = sub.add_parser("topo", help="topology matrix (MX/PIX/NODE/SYS)")
    p.add_argument("--root", default="/")
    p.add_argument("--vfs", action="store_true", help="one row per VF when VFs are configured")
    p.set_defaults(func=cmd_topo)

    p = sub.add_parser("allocate", help="preferred allocation for a request")
    p.add_argument("--root", default="/")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--available", action="append", help="device ids or GPU indices, comma list")
    p.add_argument("--must-include", action="append", help="device ids or GPU indices")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_allocate)

    p = sub.add_parser("top", help="GPU usage per node or pod, from gpu-exporter's metrics")
    p.add_argument("view", nargs="?", choices=("nodes", "pods"), default="nodes")
    p.add_argument("--url", action="append",
                   help="scrape this exporter (http://HOST:9400); repeatable")
    p.add_argument("--prometheus", help="query this Prometheus (http://HOST:9090) instead")
    add_kubeconfig_argument(p, used_for="finding the exporters when neither --url nor "
                            "--prometheus is given")
    p.add_argument("--kind", help="only GPUs of this kind: pGPU, vGPU or MPS")
    p.add_argument("-n", "--namespace", help="pods view: only this namespace")
    p.add_argument("--node", help="only this node")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_top)

    sub.add_parser("exporter", help="gpu-exporter's book of GPUs: gpus|forget "
                   "(`gpuk8s exporter -h`)")
    sub.add_parser("sim", help="GPU simulator: create|fail|heal|vfnum|sync|load|show "
                   "(`gpuk8s sim -h`)")
    p = sub.add_parser("serve", help="run a service: " + ", ".join(SERVICES))
    p.add_argument("service", choices=sorted(SERVICES))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list and args_list[0] == "sim":
            from .sim.cli import main as sim_main

            return sim_main(args_list[1:])
        if args_list and args_list[0] == "exporter":
            from .services.exporter.knowngpus import cli_main as exporter_main

            return exporter_main(args_list[1:])
        if args_list and args_list[0] == "metax-docker":
            from .metax_docker.main import main as metax_docker_main

            return metax_docker_main(args_list[1:])
        if len(args_list) >= 2 and args_list[0] == "serve" and args_list[1] in SERVICES:
            module = importlib.import_module(SERVICES[args_list[1]])
            return int(module.main(args_list[2:]))
        args = build_parser().parse_args(args_list)
        return int(args.func(args))
    except GpuK8sError as err:
        print(f"gpuk8s: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # pragma: no cover - e.g. `gpuk8s detect | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
