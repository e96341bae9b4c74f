"""The NVIDIA side of gpuk8s on a real GPU host: one prepared run, everything recorded.

Run by ``scripts/device/nvidia-check.sh`` on a machine with an NVIDIA GPU and driver (the
device machine some tasks are lent), or with ``--root`` on a simulated tree to try the
script itself. Each step runs on its own: a step that fails is recorded with its error and
the others still run. What it writes under ``--out``:

* ``result.json``: each step's findings (what the product reported, what was checked);
* ``raw.json``: every command run, with argv, exit status, stdout and stderr -- the real
  tools' output, for the simulator's fixtures;
* ``metrics.txt``: gpu-exporter's ``/metrics``, idle, under load and under MPS;
* ``cdi.json``: the CDI spec container-runtime wrote and ``nvidia-ctk cdi generate``'s.

Steps: host facts; the product's discovery, labels, host checks and telemetry (nvidia-smi
and NVML); the same as the services run in a pod (the host bound at /tmp/host, the
process's own /usr/local/nvidia hidden), gpu-mps' daemons included; gpu-exporter as a
process; the CDI spec against ``nvidia-ctk cdi generate``, a container through the runtime
wrapper and runc, and the nvidia_container_check module's code; MPS through gpu-mps and
the device plugin's environment, on the host and in containers; NVML's per-process
attribution under load, without and with MPS. ``--skip`` leaves steps out by name.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

RESULT: dict[str, Any] = {}
RAW: list[dict[str, Any]] = []
METRICS: list[str] = []

LOAD = r"""
import os, sys, time, torch
seconds = float(sys.argv[1])
a = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
n, t0 = 0, time.time()
while time.time() - t0 < seconds:
    for _ in range(8):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    n += 8
print(f"pid {os.getpid()} matmuls/s {n / (time.time() - t0):.1f}", flush=True)
"""


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def sh(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 60,
       stdin: str | None = None, record: bool = True) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout,
                              input=stdin, check=False)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = 124, "", f"timed out after {timeout} s"
    except OSError as exc:
        rc, out, err = 127, "", str(exc)
    if record:
        RAW.append({"argv": argv, "rc": rc, "stdout": out[-20000:], "stderr": err[-4000:]})
    return rc, out, err


def step(name: str, fn: Callable[[], Any]) -> None:
    log(f"== {name}")
    started = time.monotonic()
    try:
        RESULT[name] = fn()
    except BaseException as exc:
        RESULT[name] = {"error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc()[-3000:]}
        log(f"   failed: {type(exc).__name__}: {exc}")
    RESULT.setdefault("_seconds", {})[name] = round(time.monotonic() - started, 1)


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def to_json(value: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


# -- steps -------------------------------------------------------------------------------
def facts(root: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for argv in (["uname", "-a"], ["nvidia-smi"], ["nvidia-smi", "-L"], ["nvidia-smi", "-q"],
                 ["nvidia-smi", "topo", "-m"],
                 ["nvidia-smi", "--query-gpu=uuid,compute_cap,driver_version",
                  "--format=csv,noheader"],
                 ["sh", "-c", "ls -la /dev/nvidia* /dev/nvidia-caps 2>&1; "
                  "cat /proc/driver/nvidia/version; cat /proc/driver/nvidia/gpus/*/information; "
                  "cat /sys/module/nvidia/version; mount | grep -i nvidia; "
                  "ldconfig -p | grep -Ei 'nvidia|libcuda'; "
                  "for t in nvidia-smi nvidia-cuda-mps-control nvidia-cuda-mps-server "
                  "nvidia-persistenced nvidia-debugdump; do echo \"$t: $(command -v $t)\"; done; "
                  "ls /usr/local/nvidia /usr/local/nvidia/* 2>&1 | head -80; "
                  "ls -R /lib/firmware/nvidia 2>&1 | head -20; "
                  "ls /sys/fs/cgroup | head; cat /etc/os-release"],
                 [sys.executable, "-c", "import pynvml, torch; print(pynvml.__file__, "
                  "torch.__version__)"]):
        found[" ".join(argv)[:80]] = sh(argv, timeout=60)[0]
    pci = []
    base = os.path.join(root, "sys/bus/pci/devices")
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        vendor = (read(os.path.join(base, name, "vendor")) or "").strip()
        if vendor == "0x10de":
            pci.append({"address": name,
                        "device": (read(os.path.join(base, name, "device")) or "").strip(),
                        "class": (read(os.path.join(base, name, "class")) or "").strip(),
                        "driver": os.path.basename(os.path.realpath(
                            os.path.join(base, name, "driver")))})
    found["nvidia_pci"] = pci
    return found


def product(root: str) -> dict[str, Any]:
    from gpuk8s.discovery import check_health, discover, telemetry
    from gpuk8s.discovery.tools import runner_for
    from gpuk8s.host import nvidia_checks

    base = runner_for(root)

    def recording(argv: list[str]) -> tuple[int, str, str]:
        rc, out, err = base(argv)
        RAW.append({"argv": argv, "rc": rc, "stdout": out[-20000:], "stderr": err[-4000:],
                    "by": "discovery"})
        return rc, out, err

    inventory = discover(root, runner=recording)
    found: dict[str, Any] = {"inventory": to_json(inventory)}
    found["health"] = to_json(check_health(root, inventory, runner=recording))
    found["telemetry_nvidia_smi"] = to_json(telemetry(root, "nvidia", runner=recording))
    for args in (["detect", "--json"], ["labels", "--json"], ["topo"]):
        rc, out, err = sh([sys.executable, "-m", "gpuk8s.cli", *args, "--root", root])
        try:
            found["cli " + args[0]] = json.loads(out) if "--json" in args else out
        except ValueError:
            found["cli " + args[0]] = {"rc": rc, "stdout": out[-3000:], "stderr": err[-3000:]}
    facts_ = nvidia_checks.gather(root, runner=recording, host_python=sys.executable)
    found["host_facts"] = to_json(facts_)
    for label, wants in (("mps+cuda12.4", nvidia_checks.Wants(mps=True, cuda_runtime="12.4")),
                         ("cuda99.0", nvidia_checks.Wants(cuda_runtime="99.0"))):
        found[f"checks {label}"] = [to_json(c) for c in nvidia_checks.evaluate(
            facts_, wants, ["nvidia_gpu", "nvidia_smi", "mps", "cuda", "container_toolkit"])]
    return found


def nvml_read(root: str, reader: Any = None) -> dict[str, Any]:
    from gpuk8s.services.exporter.nvml import NvmlReader

    reader = reader or NvmlReader(root)
    found: dict[str, Any] = to_json(reader.read())
    return found


class Exporter:
    def __init__(self, root: str, port: int) -> None:
        self.port = port
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuk8s.cli", "serve", "exporter", "--host-root", root,
             "--port", str(port), "--interval", "1", "--pod-resources-socket", "",
             "--state-file", "", "--node-name", ""],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except Exception as exc:
            return 0, str(exc)

    def wait(self, seconds: float = 30) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.get("/healthz")[0] == 200:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.5)
        return False

    def scrape(self, label: str) -> list[str]:
        status, body = self.get("/metrics")
        METRICS.append(f"# ==== {label} (HTTP {status})\n{body}")
        return [line for line in body.splitlines()
                if line.startswith(("gpu_process", "gpu_utilization", "gpu_memory_used",
                                    "gpuk8s_", "gpu_up", "gpu_info"))][:60]

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out[-4000:]


def load(seconds: float, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", LOAD, str(seconds)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def sample_under(root: str, clients: list[subprocess.Popen[str]], exporter: Exporter | None,
                 label: str, seconds: float) -> dict[str, Any]:
    from gpuk8s.services.exporter.nvml import NvmlReader

    reader = NvmlReader(root)
    samples = []
    deadline = time.monotonic() + seconds
    scraped = None
    while time.monotonic() < deadline:
        time.sleep(1.5)
        got = reader.read()
        samples.append({"gpus": [to_json(g) for g in got.gpus],
                        "processes": to_json(got.processes), "problems": list(got.problems),
                        "nvml": raw_nvml()})
        if scraped is None and len(samples) >= 3 and exporter is not None:
            scraped = exporter.scrape(label)
    sh(["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid,used_memory,process_name",
        "--format=csv,noheader,nounits"])
    out = sh(["nvidia-smi"])[1]
    outputs = []
    for client in clients:
        try:
            outputs.append(client.communicate(timeout=40)[0].strip()[-800:])
        except subprocess.TimeoutExpired:
            client.kill()
            outputs.append("timed out")
    return {"client_pids": [c.pid for c in clients], "clients": outputs,
            "samples": samples[-4:], "exporter": scraped,
            "nvidia_smi_process_lines": [line for line in out.splitlines()
                                         if "python" in line or "M+C" in line or " C " in line]}


AS_POD = r"""
import json, sys
from gpuk8s.discovery import discover, telemetry
from gpuk8s.services.exporter.nvml import NvmlReader
inv = discover("/tmp/host")
print(json.dumps({
    "gpus": [[g.pci_address, g.name, g.memory_mib, g.uuid] for g in inv.gpus],
    "cuda": None if inv.driver.cuda is None else str(inv.driver.cuda),
    "problems": list(inv.problems),
    "smi": [[s.address, s.memory_total_bytes] for s in telemetry("/tmp/host", "nvidia").gpus],
    "nvml": [[s.address, s.memory_total_bytes] for s in NvmlReader("/tmp/host").read().gpus],
}))
"""


AS_POD_MPS = r"""
import json, os, subprocess, sys
from gpuk8s.discovery import discover
from gpuk8s.host.mps import MpsDaemons, MpsSettings, pipe_directory
uuid = discover("/tmp/host").gpus[0].uuid
settings = MpsSettings(host_root="/tmp/host", mps_dir="/run/gpuk8s-pod-mps")
daemons = MpsDaemons(settings)
out = {"tool": daemons.tool(), "pass": daemons.reconcile([uuid]).summary()}
env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
env.update(CUDA_MPS_PIPE_DIRECTORY=pipe_directory(settings.mps_dir, uuid),
           CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2048M",
           LD_LIBRARY_PATH="/tmp/host/usr/local/nvidia/lib64")
for mib in ("1024", "3072"):
    run = subprocess.run([sys.argv[1], "alloc", mib], env=env, capture_output=True, text=True,
                         timeout=30)
    out["alloc " + mib] = (run.returncode, run.stdout[-300:], run.stderr[-300:])
log = settings.mps_dir + "/" + uuid + "/log"
out["logs"] = {n: open(os.path.join(log, n)).read()[-1500:] for n in os.listdir(log)
               if n.endswith(".log")} if os.path.isdir(log) else None
out["stop"] = daemons.reconcile([]).summary()
print(json.dumps(out))
"""


def as_pod(root: str) -> dict[str, Any]:
    """The services as they run in their pods: the host at /tmp/host (a recursive bind of
    /), and the caller's own /usr/local/nvidia hidden (a pod has no driver of its own), so a
    host tool that execs /usr/local/nvidia/... by its host path fails as it would there."""
    if os.path.realpath(root) != "/":
        return {"skipped": "only on a real host"}
    script = ("mkdir -p /tmp/host && mount --rbind / /tmp/host && "
              "mount -t tmpfs none /usr/local/nvidia && ls /usr/local/nvidia | wc -l && "
              "{ /tmp/host/usr/bin/nvidia-smi -L; echo \"wrapper script: rc=$?\"; } && "
              f"{shlex.quote(sys.executable)} -c {shlex.quote(AS_POD)}; "
              f"exec {shlex.quote(sys.executable)} -c {shlex.quote(AS_POD_MPS)} "
              f"{shlex.quote(os.path.join(os.environ['GPUK8S_DEVICE_TOOLS'], 'cuda_probe'))}")
    rc, out, err = sh(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                      timeout=150)
    return {"rc": rc, "stdout": out[-8000:], "stderr": err[-3000:]}


def raw_nvml() -> dict[str, Any]:
    """NVML's own per-process answers (pynvml on the loader's libnvidia-ml), for the record:
    which pids get SM time, from the older and the newer call."""
    import pynvml

    found: dict[str, Any] = {}
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for name, call in (("process_utilization", "nvmlDeviceGetProcessUtilization"),
                           ("processes_utilization_info",
                            "nvmlDeviceGetProcessesUtilizationInfo")):
            try:
                rows = getattr(pynvml, call)(handle, 0)
                found[name] = [{"pid": int(r.pid), "sm": int(r.smUtil), "mem": int(r.memUtil),
                                "ts": int(r.timeStamp)} for r in rows]
            except Exception as exc:
                found[name] = f"{type(exc).__name__}: {exc}"
        for name, call in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                           ("mps", "nvmlDeviceGetMPSComputeRunningProcesses")):
            try:
                found[name] = [int(p.pid) for p in getattr(pynvml, call)(handle)]
            except Exception as exc:
                found[name] = f"{type(exc).__name__}: {exc}"
        pynvml.nvmlShutdown()
    except Exception as exc:
        found["error"] = f"{type(exc).__name__}: {exc}"
    return found


def exclusive_load(root: str, exporter: Exporter | None) -> dict[str, Any]:
    client = load(12, dict(os.environ))
    time.sleep(4)  # torch import and the first kernels
    return sample_under(root, [client], exporter, "exclusive load", 8)


def uuid_of(root: str) -> str:
    from gpuk8s.discovery import discover

    inventory = discover(root)
    assert inventory.gpus and inventory.gpus[0].uuid, "no GPU UUID from discovery"
    return str(inventory.gpus[0].uuid)


def mps_env(uuid: str, core: int, memory_mib: int, pipe: str) -> dict[str, str]:
    """The device plugin's environment for an MPS share (core.sharing.share_env), the
    pipe directory at its host path when the client runs on the host."""
    from gpuk8s.core.sharing import Assignment, ShareRequest, share_env

    env = share_env(Assignment("node", (0,), ShareRequest("mps", 1, core, memory_mib)), [uuid])
    env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    return env


def mps(root: str, probe: str, exporter: Exporter | None, work: str) -> dict[str, Any]:
    from gpuk8s.host.mps import MpsDaemons, MpsSettings, pipe_directory

    found: dict[str, Any] = {}
    uuid = uuid_of(root)
    settings = MpsSettings(host_root=root)
    pipe = pipe_directory(settings.mps_dir, uuid)
    rc, out, err = sh([sys.executable, "-m", "gpuk8s.cli", "serve", "mps", "--once",
                       "--sharing-mode", "mps", "--node-name", "device", "--host-root", root],
                      timeout=60)
    found["serve mps --once"] = {"rc": rc, "stdout": out[-3000:], "stderr": err[-3000:]}
    sh(["sh", "-c", f"ls -la {pipe} {settings.mps_dir}/{uuid}/log; "
                    f"cat {settings.mps_dir}/daemons.json; ps -eo pid,args | grep -i mps"])
    daemons = MpsDaemons(settings)
    found["pid_of"] = daemons.pid_of(uuid)
    again = daemons.reconcile([uuid])
    found["second pass (new agent)"] = again.summary()
    found["get_default_active_thread_percentage"] = daemons.control(
        uuid, "get_default_active_thread_percentage\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    for label, mib in (("alloc 1024 under a 2048 MiB share", 1024),
                       ("alloc 3072 under a 2048 MiB share", 3072)):
        env = {**base, **mps_env(uuid, 50, 2048, pipe)}
        rc, out, err = sh([probe, "alloc", str(mib)], env=env, timeout=30)
        found[label] = {"rc": rc, "stdout": out, "stderr": err[-2000:]}
    # two clients at different shares, side by side: the thread percentage is NVIDIA's
    # to enforce; NVML's per-process view is what gpu-exporter attributes by
    low = load(14, {**base, **mps_env(uuid, 20, 8192, pipe)})
    high = load(14, {**base, **mps_env(uuid, 80, 8192, pipe)})
    time.sleep(5)
    found["two clients 20% and 80%"] = sample_under(root, [low, high], exporter,
                                                    "mps two clients", 8)
    sh(["sh", "-c", f"tail -n 40 {settings.mps_dir}/{uuid}/log/control.log; "
                    f"tail -n 20 {settings.mps_dir}/{uuid}/log/server.log"])
    with_pct = MpsDaemons(MpsSettings(host_root=root, active_thread_percentage=50))
    found["adopt with percentage 50"] = with_pct.reconcile([uuid]).summary()
    found["percentage after adopt"] = with_pct.control(
        uuid, "get_default_active_thread_percentage\n")
    found["containers"] = containers(root, work, probe, uuid, pipe, mps_mode=True)
    found["stop pass"] = with_pct.reconcile([]).summary()
    out = sh(["sh", "-c", "ps -eo pid,stat,args | grep -i nvidia-cuda-mps | grep -v grep"])[1]
    found["mps processes after stop"] = out.strip()
    return found


# -- CDI and containers ------------------------------------------------------------------
class _Reports:
    def publish(self, report: object) -> None:
        pass


def cdi(root: str, work: str, tools: str) -> dict[str, Any]:
    from gpuk8s.services.runtime.agent import RuntimeAgent, RuntimeSettings

    prefix = "" if os.path.realpath(root) == "/" else root
    settings = RuntimeSettings(host_root=root, system_root="/", device_path_prefix=prefix,
                               cdi_dir=f"{work}/cdi", runtime="cdi",
                               install_dir=f"{work}/install", host_python=sys.executable)
    agent = RuntimeAgent(settings, _Reports())  # type: ignore[arg-type]
    agent.write_spec()
    spec = json.loads(read(f"{work}/cdi/nvidia.com-gpu.json") or "{}")
    missing = []
    edits = [spec.get("containerEdits", {})] + [d.get("containerEdits", {})
                                                  for d in spec.get("devices", [])]
    for edit in edits:
        for node in edit.get("deviceNodes", []):
            path = node.get("hostPath") or node["path"]
            if not os.path.exists(path):
                missing.append(path)
        for mount in edit.get("mounts", []):
            if not os.path.exists(mount["hostPath"]):
                missing.append(mount["hostPath"])
        for hook in edit.get("hooks", []):
            if not os.path.exists(hook["path"]):
                missing.append(hook["path"])
    ctk = os.path.join(tools, "nvidia-ctk")
    theirs: Any = None
    if os.path.exists(ctk):
        sh([ctk, "cdi", "generate", "--format", "json", "--output", f"{work}/nvctk.json"],
           timeout=120)
        theirs = json.loads(read(f"{work}/nvctk.json") or "null")

    def summary(doc: Any) -> dict[str, Any]:
        if not isinstance(doc, dict):
            return {}
        edits = doc.get("containerEdits", {})
        return {
            "devices": [d.get("name") for d in doc.get("devices", [])],
            "device_nodes": sorted({n.get("hostPath") or n.get("path")
                                    for e in [edits] + [d.get("containerEdits", {})
                                                        for d in doc.get("devices", [])]
                                    for n in e.get("deviceNodes", [])}),
            "mounts": sorted(m["hostPath"] for m in edits.get("mounts", [])),
            "hooks": [[h.get("path"), *(h.get("args") or [])[:12]] for h in
                      edits.get("hooks", [])],
            "env": edits.get("env", []),
        }

    ours, ctk_view = summary(spec), summary(theirs)
    ours_names = {os.path.basename(p) for p in ours.get("mounts", [])}
    ctk_names = {os.path.basename(p) for p in ctk_view.get("mounts", [])}
    with open(os.path.join(work, "cdi-both.json"), "w", encoding="utf-8") as handle:
        json.dump({"ours": spec, "nvidia-ctk": theirs}, handle, indent=1)
    return {"missing_paths": missing, "ours": ours, "nvidia_ctk": ctk_view,
            "mounts only in ours": sorted(ours_names - ctk_names),
            "mounts only in nvidia-ctk": sorted(ctk_names - ours_names),
            "device": spec["devices"][0]["name"] if spec.get("devices") else None}


CHECK = ("ls /dev/nvidia*; echo ---; ldconfig -p | grep -E 'libcuda.so.1 |libnvidia-ml.so.1 '; "
         "echo ---; nvidia-smi -L; echo ---; "
         "nvidia-smi --query-gpu=uuid,compute_cap,driver_version --format=csv,noheader; "
         "echo ---; /cuda_probe alloc 256")


def run_container(work: str, name: str, device: str, script: str, *,
                  env: dict[str, str] | None = None, mounts: Sequence[tuple[str, str]] = (),
                  host_ipc: bool = False, host_pid: bool = False,
                  shm: str | None = None, sim_root: str | None = None,
                  timeout: float = 60) -> dict[str, Any]:
    tools = os.environ["GPUK8S_DEVICE_TOOLS"]
    runc = os.path.join(tools, "runc")
    base = os.path.join(work, "c-" + name)
    rootfs, bundle = os.path.join(base, "rootfs"), os.path.join(base, "bundle")
    os.makedirs(rootfs)
    os.makedirs(bundle)
    with tarfile.open(os.path.join(tools, "rootfs.tar")) as tar:
        tar.extractall(rootfs)
    sh([runc, "spec", "--bundle", bundle])
    config = json.loads(read(os.path.join(bundle, "config.json")) or "{}")
    config["root"] = {"path": rootfs, "readonly": False}
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/sh", "-c", script]
    config["process"]["env"] += [f"{k}={v}" for k, v in (env or {}).items()]
    config["annotations"] = {"cdi.k8s.io/gpuk8s": device}
    for source, dest in mounts:
        config["mounts"].append({"destination": dest, "type": "bind", "source": source,
                                 "options": ["rbind", "rw"]})
    if shm is not None:
        config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/dev/shm"]
        config["mounts"].append({"destination": "/dev/shm", "type": "bind", "source": shm,
                                 "options": ["rbind", "rw"]})
    if sim_root:
        config["mounts"].append({"destination": "/var/lib/gpuk8s-sim", "type": "bind",
                                 "source": f"{sim_root}/var/lib/gpuk8s-sim",
                                 "options": ["rbind", "ro"]})
    drop = {"ipc"} if host_ipc else set()
    if host_pid:
        drop.add("pid")
    config["linux"]["namespaces"] = [n for n in config["linux"]["namespaces"]
                                     if n["type"] not in drop]
    with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    wrapper_config = os.path.join(base, "wrapper.json")
    with open(wrapper_config, "w", encoding="utf-8") as handle:
        json.dump({"runtime": runc, "specDirs": [os.path.join(work, "cdi")]}, handle)
    wrapper = os.path.join(work, "install/bin/gpuk8s-oci-runtime")
    cid = f"gpuk8s-dev-{name}"
    try:
        rc, out, err = sh([wrapper, "--root", os.path.join(base, "state"), "run", "--bundle",
                           bundle, cid],
                          env={**os.environ, "GPUK8S_OCI_RUNTIME_CONFIG": wrapper_config},
                          timeout=timeout)
    finally:
        sh([runc, "--root", os.path.join(base, "state"), "delete", "-f", cid], record=False)
    return {"rc": rc, "stdout": out[-4000:], "stderr": err[-3000:]}


def container_check(root: str, work: str) -> dict[str, Any]:
    """The nvidia_container_check module's code (the manual's last check) as the role runs
    it: nvidia-smi in a container holding every GPU, through the wrapper and runc."""
    from gpuk8s.discovery import discover
    from gpuk8s.host import containercheck

    tools = os.environ["GPUK8S_DEVICE_TOOLS"]
    config = os.path.join(work, "check-wrapper.json")
    with open(config, "w", encoding="utf-8") as handle:
        json.dump({"runtime": os.path.join(tools, "runc"),
                   "specDirs": [os.path.join(work, "cdi")]}, handle)
    os.environ["GPUK8S_OCI_RUNTIME_CONFIG"] = config
    sim_root = None if os.path.realpath(root) == "/" else root
    result = containercheck.run_check(
        wrapper=os.path.join(work, "install/bin/gpuk8s-oci-runtime"),
        rootfs=os.path.join(tools, "rootfs.tar"), devices=["nvidia.com/gpu=all"], runner=None,
        work_dir=os.path.join(work, "check"), runc=os.path.join(tools, "runc"),
        extra_mounts=[(f"{sim_root}/var/lib/gpuk8s-sim", "/var/lib/gpuk8s-sim")]
        if sim_root else ())
    inventory = discover(root)
    return {"result": to_json(result), "host_driver": inventory.driver.version,
            "host_gpus": len(inventory.gpus),
            "passes": result.rc == 0 and result.driver_version == inventory.driver.version
            and result.gpus == len(inventory.gpus)}


def containers(root: str, work: str, probe: str, uuid: str, pipe: str,
               mps_mode: bool) -> dict[str, Any]:
    spec = json.loads(read(f"{work}/cdi/nvidia.com-gpu.json") or "{}")
    device = "nvidia.com/gpu=" + spec["devices"][0]["name"]
    sim_root = None if os.path.realpath(root) == "/" else root
    if not mps_mode:
        return {"plain": run_container(work, "plain", device, CHECK, sim_root=sim_root)}
    from gpuk8s.core.sharing import (
        MPS_CONTAINER_PIPE_DIR,
        Assignment,
        ShareRequest,
        share_env,
        share_mounts,
    )

    assignment = Assignment("node", (0,), ShareRequest("mps", 1, 50, 2048))
    env = share_env(assignment, [uuid])
    mounts = share_mounts(assignment, [uuid])
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == MPS_CONTAINER_PIPE_DIR
    script = "/cuda_probe alloc 1024; echo ---; /cuda_probe alloc 3072"
    found: dict[str, Any] = {"env": env, "mounts": mounts}
    # what gpu-device gives an MPS container today, then with more of the host shared
    for name, extra in (("as allocated", {}),
                        ("+ host /dev/shm", {"shm": "/dev/shm"}),
                        ("+ host ipc", {"host_ipc": True}),
                        ("+ host ipc and /dev/shm", {"host_ipc": True, "shm": "/dev/shm"}),
                        ("+ host ipc, pid and /dev/shm", {"host_ipc": True, "host_pid": True,
                                                          "shm": "/dev/shm"})):
        found[name] = run_container(work, "mps" + str(len(found)), device, script, env=env,
                                    mounts=mounts, sim_root=sim_root, timeout=30, **extra)
    found["pid seen by NVML"] = held_container(root, work, device, env, mounts, sim_root)
    return found


def held_container(root: str, work: str, device: str, env: dict[str, str],
                   mounts: list[tuple[str, str]], sim_root: str | None) -> dict[str, Any]:
    """An MPS client in a container (its own PID namespace) holding a context: the host
    pid NVML reports for it must be the container's process, which gpu-exporter maps to
    its pod through /proc/<pid>/cgroup."""
    from gpuk8s.services.exporter.nvml import NvmlReader

    tools = os.environ["GPUK8S_DEVICE_TOOLS"]
    result: dict[str, Any] = {}
    holder = threading.Thread(target=lambda: result.update(run_container(
        work, "held", device, "exec /cuda_probe hold 10", env=env, mounts=mounts,
        sim_root=sim_root, timeout=40)))
    holder.start()
    time.sleep(6)
    out = sh([os.path.join(tools, "runc"), "--root",
                    os.path.join(work, "c-held", "state"), "state", "gpuk8s-dev-held"])[1]
    try:
        pid = json.loads(out).get("pid")
    except ValueError:
        pid = None
    got = NvmlReader(root).read()
    cgroup = read(f"/proc/{pid}/cgroup") if pid else None
    holder.join(60)
    return {"container_pid": pid, "cgroup": cgroup,
            "nvml": [to_json(p) for p in got.processes or ()], "container": result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/")
    parser.add_argument("--out", required=True)
    parser.add_argument("--skip", default="", help="comma list of steps to leave out")
    args = parser.parse_args()
    root, out = args.root, args.out
    os.makedirs(out, exist_ok=True)
    tools = os.environ["GPUK8S_DEVICE_TOOLS"]
    probe = os.path.join(tools, "cuda_probe")
    work = tempfile.mkdtemp(prefix="gpuk8s-device-")
    skip = set(filter(None, args.skip.split(",")))
    exporter: Exporter | None = None

    def save() -> None:  # after every step: a run stopped at its time limit keeps the rest
        for name, data in (("result.json", RESULT), ("raw.json", RAW)):
            with open(os.path.join(out, name), "w", encoding="utf-8") as handle:
                json.dump(data, handle, indent=1, default=repr)
        with open(os.path.join(out, "metrics.txt"), "w", encoding="utf-8") as handle:
            handle.write("\n".join(METRICS))
        if os.path.exists(os.path.join(work, "cdi-both.json")):
            shutil.copy(os.path.join(work, "cdi-both.json"), os.path.join(out, "cdi.json"))

    def run(name: str, fn: Callable[[], Any]) -> None:
        if name not in skip:
            step(name, fn)
            save()

    run("facts", lambda: facts(root))
    run("product", lambda: product(root))
    run("nvml idle", lambda: nvml_read(root))
    run("as a pod", lambda: as_pod(root))
    if "exporter" not in skip:
        exporter = Exporter(root, 19400)
        RESULT["exporter up"] = exporter.wait()
        if RESULT["exporter up"]:
            RESULT["exporter idle"] = exporter.scrape("idle")
    run("cdi", lambda: cdi(root, work, tools))
    run("container", lambda: containers(root, work, probe, "", "", mps_mode=False))
    run("container check", lambda: container_check(root, work))
    run("exclusive load", lambda: exclusive_load(root, exporter))
    run("mps", lambda: mps(root, probe, exporter, work))
    if exporter is not None:
        RESULT["exporter log"] = exporter.stop()
    save()
    log("done: " + ", ".join(f"{k} {v}s" for k, v in RESULT.get("_seconds", {}).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
