"""Device plugin benchmark: failure-to-update latency and RSS of the running plugin.

Runs the real process (`gpuk8s serve device-plugin`) on a simulator root against the
kubelet-side test harness (real gRPC), then, for each round, injects a failure with
the simulator and measures the time until the kubelet receives the ListAndWatch update
marking the GPU Unhealthy, and after `sim heal` until it is Healthy again. Two failure
kinds: `fault` (reported by the vendor tool: found by the periodic check, so bounded
by the healthy interval) and `remove` (hot-unplug: found by the sysfs presence poll).
Finally prints the plugin's resident memory (target: ≤ 60 MB).

    python benchmarks/deviceplugin.py [--interval 5] [--rounds 3] [--preset c500-8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "src"))

from gpuk8s import sim  # noqa: E402
from gpuk8s.core.model import NodeInventory  # noqa: E402
from gpuk8s.discovery import discover  # noqa: E402
from tests.unit.kubelet_harness import FakeKubelet  # noqa: E402

RSS_TARGET_MB = 60.0


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MB from /proc."""
    values = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def measure(
    kubelet: FakeKubelet, root: str, gpu: int, device_id: str, mode: str, timeout: float
) -> tuple[float, float]:
    watch = kubelet.latest_watch()

    def state(devs: list[tuple[str, str, tuple[int, ...]]]) -> str:
        return dict((d[0], d[1]) for d in devs)[device_id]

    start = len(watch.updates)
    t0 = time.monotonic()
    sim.fail(root, gpu, mode)
    idx, seen = kubelet.wait_update(watch, lambda d: state(d) == "Unhealthy", timeout, start)
    down = seen - t0
    t1 = time.monotonic()
    sim.heal(root, gpu)
    _, seen = kubelet.wait_update(watch, lambda d: state(d) == "Healthy", timeout, idx + 1)
    return down, seen - t1


def run(preset: str, interval: float, rounds: int, removal_poll: float) -> None:
    with tempfile.TemporaryDirectory(prefix="dpbench-") as tmp:
        root = os.path.join(tmp, "sim")
        plugin_dir = os.path.join(tmp, "dp")
        sim.create(root, preset)
        kubelet = FakeKubelet(plugin_dir).start()
        env = dict(os.environ)
        env["PATH"] = f"{os.path.dirname(sys.executable)}:{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.path.join(REPO, "src")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuk8s.cli", "serve", "device-plugin",
             "--host-root", root, "--plugin-dir", plugin_dir,
             "--healthy-interval", str(interval), "--removal-poll", str(removal_poll),
             "--log-level", "error"],
            env=env,
        )  # fmt: skip
        try:
            t0 = time.monotonic()
            kubelet.wait_registrations(1, timeout=120)
            watch = kubelet.latest_watch(timeout=60)
            startup = time.monotonic() - t0
            devices = watch.updates[0]
            print(
                f"preset {preset}: {len(devices)} devices, healthy interval {interval:g}s, "
                f"removal poll {removal_poll:g}s, start-to-first-ListAndWatch {startup:.2f}s"
            )
            ids = [d[0] for d in devices]
            inv = discover(root)
            for mode in ("fault", "remove"):
                downs, ups = [], []
                for r in range(rounds):
                    gpu = (r * 3 + 1) % len(inv.gpus)
                    unit = _unit_of(inv, ids, gpu)
                    down, up = measure(kubelet, root, gpu, unit, mode, interval * 4 + 30)
                    downs.append(down)
                    ups.append(up)
                print(
                    f"  {mode:<6} fail->Unhealthy  min {min(downs):.2f}s  median "
                    f"{statistics.median(downs):.2f}s  max {max(downs):.2f}s   "
                    f"heal->Healthy median {statistics.median(ups):.2f}s  "
                    f"(bound: {'interval + check' if mode == 'fault' else 'removal poll + check'})"
                )
            cur, peak = rss_mb(proc.pid)
            verdict = "OK" if peak <= RSS_TARGET_MB else "OVER TARGET"
            print(
                f"  RSS {cur:.1f} MB, peak {peak:.1f} MB (target ≤ {RSS_TARGET_MB:.0f} MB: "
                f"{verdict})"
            )
        finally:
            proc.terminate()
            proc.wait(30)
            kubelet.stop()


def _unit_of(inv: NodeInventory, ids: list[str], gpu: int) -> str:
    """The first advertised device of GPU ``gpu`` (the GPU itself or its first VF)."""
    g = inv.gpus[gpu]
    unit = g.sriov.vf_addresses[0] if g.sriov.num_vfs else g.pci_address
    if unit not in ids:
        raise SystemExit(f"device {unit} of GPU {gpu} is not advertised")
    return unit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0, help="healthy interval (s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--removal-poll", type=float, default=0.5)
    parser.add_argument(
        "--preset", action="append", help="simulator preset(s) (default c500-8 and c500-8-vf4)"
    )
    args = parser.parse_args()
    for preset in args.preset or ["c500-8", "c500-8-vf4"]:
        run(preset, args.interval, args.rounds, args.removal_poll)
    return 0


if __name__ == "__main__":
    sys.exit(main())
