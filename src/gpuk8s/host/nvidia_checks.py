"""The accelerator manual's prerequisites for NVIDIA nodes: facts read from a host and the
checks over them, each failing with a message that names what is missing.

Prerequisites (SPEC §1, §11, §13; manual 002 "Installation > Prerequisites"):

* ``kubernetes``: Kubernetes >= 1.25 (pGPU) - the kubelet's version;
* ``device_plugins``: the kubelet's ``DevicePlugins`` feature gate not turned off;
* ``nvidia_gpu``: an NVIDIA GPU on the PCI bus (``lspci | grep -i nvidia``);
* ``nvidia_smi``: ``nvidia-smi`` on the node, answering (the driver works);
* ``container_toolkit``: NVIDIA Container Toolkit >= 1.7.0, or gpuk8s' own CDI + runtime
  wrapper in its place (needs python3 >= 3.8 on the node and containerd);
* ``mps``: for MPS, Volta or newer (compute capability >= 7.0) and a driver for CUDA
  >= 11.5;
* ``cuda``: the driver's CUDA version >= the applications' CUDA runtime
  (``core.cuda.check``);
* operator scheme only: ``container_runtime`` (containerd >= 1.5.0, or docker >= 18.09.3
  with Kubernetes 1.23 only), ``host_os`` (Ubuntu 18.04/20.04/22.04, CentOS 8/9,
  OpenEuler 20.03/22.03) and ``allow_privileged`` (kube-apiserver ``--allow-privileged=true``;
  the kubelet has allowed privileged pods by default since 1.15, without a flag).

``gather`` reads the host (under a root; tools run through a runner), ``evaluate`` is pure.
Stdlib only, Python 3.8+.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.cuda import CudaVersion, parse_version
from ..core.cuda import check as cuda_check
from ..core.errors import ConfigError
from ..discovery import discover
from ..discovery.kmodule import kernel_release
from ..discovery.nvidia import NVSMI_CANDIDATES
from ..discovery.tools import Runner, find_tool, host_path, run_tool
from .sdk import os_release
from .serving import serving_program

MIN_KUBERNETES = (1, 25)
MIN_OPERATOR_KUBERNETES = (1, 23)
MIN_TOOLKIT = (1, 7, 0)
MIN_CONTAINERD = (1, 5, 0)
MIN_DOCKER = (18, 9, 3)
MIN_PYTHON = (3, 8)
MPS_MIN_COMPUTE = (7, 0)
MPS_MIN_CUDA = CudaVersion(11, 5)
OPERATOR_OS = {"ubuntu": ("18.04", "20.04", "22.04"), "centos": ("8", "9"),
               "openeuler": ("20.03", "22.03")}
APISERVER_MANIFEST = "/etc/kubernetes/manifests/kube-apiserver.yaml"
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
KUBELET_FLAGS = "/var/lib/kubelet/kubeadm-flags.env"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
CHECKS = ("kubernetes", "device_plugins", "nvidia_gpu", "nvidia_smi", "container_toolkit", "mps",
          "cuda", "container_runtime", "host_os", "allow_privileged")
SCHEMES = ("extensions", "operator")
RUNTIMES = ("gpuk8s", "toolkit")

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """The first ``X.Y[.Z]`` in ``text`` as integers."""
    match = _VERSION.search(text or "")
    if match is None:
        return None
    return tuple(int(p) for p in match.groups() if p is not None)


def shown(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)


def tool_path(root: str, name: str, extra: Sequence[str] = ()) -> str | None:
    return find_tool(root, name, [*extra, *(f"{d}/{name}" for d in BIN_DIRS)])


def running_program(root: str, name: str, proc: str = "/proc") -> list[str]:
    """The program of the running process called ``name`` (``comm``), lowest pid first: the
    fallback of ``daemon_program`` where no socket answers. Only on the host itself
    (``root`` /): another root's processes are not this machine's to read."""
    if os.path.realpath(root) != "/":
        return []
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/comm", encoding="utf-8") as handle:
                if handle.read().strip() != name:
                    continue
            return [os.readlink(f"{proc}/{pid}/exe")]
        except OSError:  # gone, or not ours to read
            continue
    return []


def daemon_program(root: str, name: str, socket_path: str | None = None,
                   proc: str = "/proc") -> str | None:
    """The program of the running daemon ``name``, asked for its version before the one on
    PATH: a node's kubelet or containerd may run from outside PATH (RKE2's
    ``/var/lib/rancher/rke2/bin``, a containerd 2.x beside the distribution's 1.x in
    ``/usr/bin``), and the running one's version is the one that counts.

    It is the process serving ``socket_path`` (a path on the host, under ``root``) where
    that is visible (``host.serving``, the way the container-runtime agent finds the
    containerd it configures: the daemon the node uses, not merely one of that name); else,
    the fallback where no socket answers (none given, as for the kubelet; not served, not
    visible), the running process called ``name`` (``running_program``); else ``name`` under
    ``root`` (PATH on the host itself)."""
    served = serving_program(host_path(root, socket_path), proc) if socket_path else None
    if served is not None and os.access(served[1], os.X_OK):
        return served[1]
    return tool_path(root, name, running_program(root, name, proc))


@dataclass(frozen=True)
class SmiStatus:
    """What ``nvidia-smi`` (no argument, as the manual runs it) says."""

    path: str | None
    ok: bool
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: int = 0  # lines of nvidia-smi -L
    error: str | None = None


def nvidia_smi_status(root: str, runner: Runner | None) -> SmiStatus:
    tool = find_tool(root, "nvidia-smi", NVSMI_CANDIDATES)
    if tool is None:
        return SmiStatus(None, False, error="nvidia-smi not found on the node "
                                            f"({', '.join(NVSMI_CANDIDATES)})")
    table = run_tool(runner, [tool])
    if not table.ok:
        text = (table.stdout.strip() or table.stderr.strip()).splitlines()
        return SmiStatus(tool, False, error=f"nvidia-smi failed (rc {table.rc}): "
                                            f"{text[0] if text else table.problem}")
    driver = re.search(r"Driver Version:\s*([0-9.]+)", table.stdout)
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", table.stdout)
    listing = run_tool(runner, [tool, "-L"])
    count = sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
    return SmiStatus(tool, True, driver.group(1) if driver else None,
                     cuda.group(1) if cuda else None, count)


@dataclass(frozen=True)
class HostFacts:
    kernel: str | None
    os_id: str
    os_version: str
    os_like: str
    gpus: tuple[dict[str, Any], ...]  # NVIDIA GPUs on the PCI bus
    lspci: tuple[str, ...] | None  # lspci's NVIDIA lines; None without lspci
    driver_loaded: bool
    driver_version: str | None
    driver_cuda: str | None  # the newest CUDA the driver supports (NVML)
    nvidia_smi: SmiStatus
    gcc: bool
    dkms: bool
    kernel_headers: bool
    toolkit_version: str | None
    containerd_version: str | None
    docker_version: str | None
    kubernetes_version: str | None
    apiserver_allow_privileged: bool | None  # None: no kube-apiserver manifest here
    device_plugins_disabled: bool
    python_version: str | None  # of the python3 the runtime wrapper would use
    problems: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["gpus"] = [dict(g) for g in self.gpus]
        out["lspci"] = None if self.lspci is None else list(self.lspci)
        out["problems"] = list(self.problems)
        return out


def _first_version(runner: Runner | None, tool: str | None, *args: str) -> str | None:
    """The version ``tool --version`` prints; None without the tool."""
    if tool is None:
        return None
    result = run_tool(runner, [tool, *(args or ("--version",))])
    found = version_tuple(result.stdout + " " + result.stderr) if result.ok else None
    return shown(found) if found else None


def headers_present(root: str, kernel: str | None) -> bool:
    """``/lib/modules/<kernel>/build`` (an absolute symlink is read inside the root)."""
    if not kernel:
        return False
    path = host_path(root, f"/lib/modules/{kernel}/build")
    if os.path.islink(path) and os.readlink(path).startswith("/"):
        path = host_path(root, os.readlink(path))
    return os.path.isdir(path)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def gather(root: str, runner: Runner | None = None, *, system_root: str | None = None,
           kubernetes_version: str | None = None, host_python: str = "/usr/bin/python3",
           containerd_socket: str = CONTAINERD_SOCKET) -> HostFacts:
    """Read the host: its GPUs, driver, OS and build tools under ``root``; its container
    runtime, Kubernetes and python3 under ``system_root`` (default ``root``; differs only
    where the GPU tree is simulated, as in the lab). ``kubernetes_version`` stands in for
    ``kubelet --version`` (a node without a kubelet yet); the containerd asked for its
    version is the one serving ``containerd_socket`` (``daemon_program``)."""
    system = root if system_root is None else system_root
    inventory = discover(root, runner=runner)
    gpus = tuple({"index": g.index, "pci_address": g.pci_address, "product": g.product,
                  "name": g.name, "compute_capability": None if g.compute_capability is None
                  else "{}.{}".format(*g.compute_capability), "driver_bound": g.driver_bound}
                 for g in inventory.gpus if g.vendor == "nvidia")
    lspci_tool = tool_path(root, "lspci")
    lspci = None
    if lspci_tool is not None:
        out = run_tool(runner, [lspci_tool, "-D", "-nn"])
        lspci = tuple(line for line in out.stdout.splitlines() if "nvidia" in line.lower())
    kernel = kernel_release(root)
    release = os_release(root)
    toolkit = tool_path(system, "nvidia-ctk")
    cli = tool_path(system, "nvidia-container-cli")
    kubelet = daemon_program(system, "kubelet")
    python = host_path(system, host_python)
    apiserver = _read(host_path(system, APISERVER_MANIFEST))
    privileged = None
    if apiserver:
        flag = re.search(r"--allow-privileged(?:=|\s+)(\w+)", apiserver)
        privileged = flag is not None and flag.group(1).lower() == "true"
    gates = _read(host_path(system, KUBELET_CONFIG)) + _read(host_path(system, KUBELET_FLAGS))
    disabled = re.search(r"DevicePlugins\s*[:=]\s*\"?false", gates, re.IGNORECASE) is not None
    return HostFacts(
        kernel=kernel,
        os_id=release.get("ID", "unknown").lower(),
        os_version=release.get("VERSION_ID", ""),
        os_like=release.get("ID_LIKE", "").lower(),
        gpus=gpus,
        lspci=lspci,
        driver_loaded=inventory.driver.loaded,
        driver_version=inventory.driver.version,
        driver_cuda=None if inventory.driver.cuda is None else str(inventory.driver.cuda),
        nvidia_smi=nvidia_smi_status(root, runner),
        gcc=tool_path(root, "cc") is not None or tool_path(root, "gcc") is not None,
        dkms=tool_path(root, "dkms") is not None,
        kernel_headers=headers_present(root, kernel),
        toolkit_version=_first_version(runner, toolkit or cli),
        containerd_version=_first_version(
            runner, daemon_program(system, "containerd", containerd_socket)),
        docker_version=_first_version(runner, tool_path(system, "docker")),
        kubernetes_version=kubernetes_version or _first_version(runner, kubelet),
        apiserver_allow_privileged=privileged,
        device_plugins_disabled=disabled,
        python_version=_first_version(runner, python if os.access(python, os.X_OK) else None),
        problems=inventory.problems,
    )


@dataclass(frozen=True)
class Wants:
    """What the node is being prepared for."""

    scheme: str = "extensions"  # extensions | operator
    runtime: str = "gpuk8s"  # gpuk8s (our CDI + wrapper) | toolkit (NVIDIA Container Toolkit)
    mps: bool = False
    cuda_runtime: str | None = None  # the applications' CUDA runtime, e.g. "12.4"

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ConfigError(f"scheme {self.scheme!r}: choose one of {', '.join(SCHEMES)}")
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"runtime {self.runtime!r}: choose one of {', '.join(RUNTIMES)}")
        if self.cuda_runtime:
            parse_version(self.cuda_runtime, "cuda_runtime")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str


def evaluate(facts: HostFacts, wants: Wants, names: Sequence[str] | None = None) -> list[Check]:
    """The checks ``names`` (default: all that apply to ``wants``), in ``CHECKS`` order."""
    chosen = list(CHECKS if names is None else names)
    unknown = [n for n in chosen if n not in CHECKS]
    if unknown:
        raise ConfigError(f"checks {', '.join(unknown)}: allowed are {', '.join(CHECKS)}")
    out = []
    for name in CHECKS:
        if name not in chosen:
            continue
        if name in ("container_runtime", "host_os", "allow_privileged") and \
                wants.scheme != "operator":
            continue
        if name == "mps" and not wants.mps:
            continue
        if name == "cuda" and not wants.cuda_runtime:
            continue
        ok, message = globals()[f"_check_{name}"](facts, wants)
        out.append(Check(name, ok, message))
    return out


def _check_kubernetes(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    version = version_tuple(facts.kubernetes_version)
    if version is None:
        return False, ("Kubernetes version unknown: no kubelet on the node (kubelet --version) "
                       "and none given; pGPU needs Kubernetes >= 1.25")
    if version[:2] < MIN_KUBERNETES:
        return False, (f"Kubernetes {shown(version)} is older than 1.25, which the NVIDIA "
                       "device plugin (pGPU) of the accelerator suite needs")
    return True, f"Kubernetes {shown(version)} (>= 1.25)"


def _check_device_plugins(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    if facts.device_plugins_disabled:
        return False, (f"the kubelet's DevicePlugins feature gate is turned off ({KUBELET_CONFIG} "
                       f"or {KUBELET_FLAGS}): remove DevicePlugins=false")
    return True, "DevicePlugins feature gate on (GA and always on since Kubernetes 1.26)"


def _check_nvidia_gpu(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    if not facts.gpus:
        return False, ("no NVIDIA GPU on the PCI bus (lspci | grep -i nvidia finds none): "
                       "nothing for the driver to drive")
    names = sorted({g["name"] or g["product"] for g in facts.gpus})
    return True, f"{len(facts.gpus)} NVIDIA GPU(s) on the PCI bus: {', '.join(names)}"


def _check_nvidia_smi(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    smi = facts.nvidia_smi
    if not smi.ok:
        return False, f"{smi.error}: install the NVIDIA driver (nvidia_host role, driver step)"
    return True, (f"nvidia-smi: driver {smi.driver_version}, CUDA {smi.cuda_version}, "
                  f"{smi.gpus} GPU(s)")


def _check_container_toolkit(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    if wants.runtime == "toolkit":
        version = version_tuple(facts.toolkit_version)
        if version is None:
            return False, ("NVIDIA Container Toolkit not installed (no nvidia-ctk or "
                           "nvidia-container-cli): install it (manual 002-40/41), >= 1.7.0, or "
                           "use gpuk8s' own CDI + runtime wrapper (runtime gpuk8s)")
        if version < MIN_TOOLKIT:
            return False, f"NVIDIA Container Toolkit {shown(version)} is older than 1.7.0"
        return True, f"NVIDIA Container Toolkit {shown(version)} (>= 1.7.0)"
    python = version_tuple(facts.python_version)
    if python is None or python[:2] < MIN_PYTHON:
        found = shown(python) if python else "none"
        return False, (f"gpuk8s' runtime wrapper (in place of the NVIDIA Container Toolkit) "
                       f"needs python3 >= 3.8 on the node (found {found})")
    if facts.containerd_version is None:
        return False, ("gpuk8s' runtime wrapper (in place of the NVIDIA Container Toolkit) is a "
                       "containerd runtime handler: containerd not found on the node")
    return True, (f"gpuk8s' CDI + runtime wrapper in place of the NVIDIA Container Toolkit "
                  f"(python3 {shown(python)}, containerd {facts.containerd_version})")


def _check_mps(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    old = [g for g in facts.gpus if version_tuple(g["compute_capability"]) is None
           or (version_tuple(g["compute_capability"]) or (0,))[:2] < MPS_MIN_COMPUTE]
    if old:
        gpu = old[0]
        return False, (f"MPS needs a Volta or newer GPU (compute capability >= 7.0); GPU "
                       f"{gpu['index']} ({gpu['name'] or gpu['product']}) has "
                       f"{gpu['compute_capability'] or 'an unknown compute capability'}")
    if facts.driver_cuda is None:
        return False, "MPS needs a driver for CUDA >= 11.5; the driver's CUDA version is unknown"
    driver = parse_version(facts.driver_cuda, "driver CUDA")
    if driver < MPS_MIN_CUDA:
        return False, f"MPS needs a driver for CUDA >= 11.5; this driver supports CUDA {driver}"
    return True, f"MPS: every GPU Volta or newer, driver for CUDA {driver}"


def _check_cuda(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    runtime = parse_version(wants.cuda_runtime or "", "cuda_runtime")
    if facts.driver_cuda is None:
        return False, (f"the driver's CUDA version is unknown (no driver / NVML): cannot run "
                       f"CUDA {runtime} applications")
    driver = parse_version(facts.driver_cuda, "driver CUDA")
    why, warning = cuda_check(driver, runtime)
    if why:
        return False, f"{why} (else CUDA_ERROR_UNKNOWN (999))"
    return True, warning or f"driver CUDA {driver} >= runtime CUDA {runtime}"


def _check_container_runtime(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    containerd = version_tuple(facts.containerd_version)
    if containerd is not None and containerd >= MIN_CONTAINERD:
        return True, f"containerd {shown(containerd)} (>= 1.5.0)"
    docker = version_tuple(facts.docker_version)
    kube = version_tuple(facts.kubernetes_version)
    if docker is not None and docker >= MIN_DOCKER and kube is not None and kube[:2] == (1, 23):
        return True, f"docker {shown(docker)} (>= 18.09.3) with Kubernetes 1.23"
    found = [f"containerd {shown(containerd)}" if containerd else "no containerd",
             f"docker {shown(docker)}" if docker else "no docker"]
    return False, (f"the operator scheme needs containerd >= 1.5.0 (or docker >= 18.09.3 with "
                   f"Kubernetes 1.23 only); found {', '.join(found)}")


def _check_host_os(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    versions = OPERATOR_OS.get(facts.os_id, ())
    if facts.os_version in versions or facts.os_version.split(".")[0] in versions:
        return True, f"host OS {facts.os_id} {facts.os_version}"
    allowed = "; ".join(f"{k} {', '.join(v)}" for k, v in OPERATOR_OS.items())
    return False, (f"host OS {facts.os_id} {facts.os_version} is not one the operator scheme "
                   f"supports ({allowed})")


def _check_allow_privileged(facts: HostFacts, wants: Wants) -> tuple[bool, str]:
    if facts.apiserver_allow_privileged is None:
        return True, (f"no kube-apiserver on this node ({APISERVER_MANIFEST}): check "
                      "--allow-privileged=true on the control plane; the kubelet allows "
                      "privileged pods by default since 1.15")
    if not facts.apiserver_allow_privileged:
        return False, (f"kube-apiserver runs without --allow-privileged=true "
                       f"({APISERVER_MANIFEST}): the operator scheme's pods are privileged")
    return True, "kube-apiserver --allow-privileged=true"
