"""The vendor manuals' commands, run as printed (issue 27, SPEC §14).

Every block of docs/manual/MANUAL_COMMANDS.md (the manuals' commands and snippets, 001-xx
from the GPU vendor's reference manual, 002-xx from the accelerator suite's manual) is run
here, parsed from that file, with only the placeholders filled in, and the test checks what
the manual promises; or it is listed in docs/manual-conformance.md with the reason it cannot
run here (tests/unit/test_manual_commands.py keeps the two complete). Each test names its
blocks with ``@manual(...)``; an assertion message starts with the block id.

Placeholders: ``DOMAIN`` is the lab registry (127.0.0.1:5000), ``DOMAIN/PROJECT`` what
lab/install pushes to (127.0.0.1:5000/gpuk8s), ``0.8.0`` the package version (the tag of
the component images build/images holds), ``<NODE>`` / ``<nodename>`` / ``${nodeName}`` the
lab node, ``<ARCH>`` this machine's, ``$USER`` a user name of the test's. Where the project
differs from the manual on purpose, the test does what docs/manual-conformance.md says, and
says so where it does it (``differs(...)``).

Host commands (driver install, nvidia-smi, /dev/nvidia*) run against a simulator root: the
host's absolute paths get the root in front, and the root's tools come first on PATH.

Order matters: the module builds the offline package once, installs the GPU Extensions
chart once for the chapter-2 blocks, then the GPU Operator chart, and removes both with the
manual's own uninstall commands. The lab is left as lab/install left it (the session
fixture in conftest.py sets an installed release aside and gives it back).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import pty
import re
import select
import shlex
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.dockerd import DOCKER, Dockerd, private_dockerd
from tests.manual import Block, block

from .conftest import (
    BUSYBOX,
    CACHE,
    KUBECONFIG,
    KUBECTL,
    LAB,
    REGISTRY,
    REPO,
    SIM_ROOT,
    STATE,
    VERSIONS,
    kubectl,
    kubectl_json,
    pod_phase,
    run,
    tool,
    wait_until,
)
from .test_package import IMAGES_TXT, version  # the tag of the images build/images holds

pytestmark = pytest.mark.e2e

F = TypeVar("F", bound=Callable[..., Any])

# test function -> the manual blocks it runs (tests/unit/test_manual_commands.py reads it)
RUNS: dict[str, tuple[str, ...]] = {}
# blocks that other e2e tests run as printed (test file::test name)
_CUDA_DEPLOYMENT = ("tests/e2e/test_nvidia_labels.py::"
                    "test_the_manuals_deployment_schedules_by_the_bare_cuda_labels")
ELSEWHERE: dict[str, str] = {"002-07": _CUDA_DEPLOYMENT, "002-08": _CUDA_DEPLOYMENT}
# blocks where the test does what docs/manual-conformance.md's "Deliberate differences" says
DIFFERS: set[str] = set()


def manual(*ids: str) -> Callable[[F], F]:
    def mark(fn: F) -> F:
        RUNS[fn.__name__] = ids
        return fn

    return mark


def differs(*ids: str) -> None:
    """Where a test departs from the printed text (each id has a row in
    docs/manual-conformance.md; the unit test checks it)."""
    DIFFERS.update(ids)


DOMAIN = REGISTRY
PROJECT = f"{REGISTRY}/gpuk8s"  # inventories/lab: gpuk8s_registry
HELM3 = str(CACHE / "bin" / f"helm-{VERSIONS['HELM3_VERSION']}" / "helm")
SCHEDULER = str(CACHE / "bin" / f"kube-{VERSIONS['KUBE_VERSION']}" / "kube-scheduler")
EXT_NS, OP_NS = "metax-gpu-extensions", "metax-operator"
RESOURCE = "metax-tech.com/gpu"
MANIFEST = Path("/etc/kubernetes/manifests/kube-scheduler.yaml")
EXTENDER_YAML = Path("/etc/metax/extender.yaml")
USER = "e2e-manual"
PASSWORD = "not-checked"  # the lab registry has no authentication
ARCH = platform.machine()
# what the lab needs beyond the manual's command, as a values file (-f): the node agents
# look at the simulator root instead of the host's / (tests/e2e/test_gpu_stack.py); for the
# operator also the lab's containerd config and the simulator's stand-ins for modprobe and
# the vendor's VF command (inventories/lab/group_vars). (helm reads the lab's plain-HTTP
# registry on 127.0.0.1 without --plain-http; only helm push needs it.)
LAB_VALUES: dict[str, Any] = {
    "hostPaths": {"root": str(SIM_ROOT), "extraReadPaths": ["/var/lib/gpuk8s-sim"]},
    "gpuDevice": {"extraArgs": [f"--device-path-prefix={SIM_ROOT}"]},
    # the manual enables gpu-aware by hand over plain HTTP (001-20: urlPrefix http://...,
    # no tlsConfig); the chart's default, mutual TLS, would refuse that scheduler
    # (docs/manual-conformance.md)
    "gpuAware": {"tls": {"enabled": False}},
}
OP_LAB_VALUES: dict[str, Any] = {
    "runtime": {"containerd": {"config": str(STATE / "containerd" / "config.toml")}},
    "driver": {"extraArgs": [
        "--load-command={host_root}/usr/sbin/modprobe {module}",
        "--unload-command={host_root}/usr/sbin/modprobe -r {module}",
        "--vf-command={host_root}/opt/mxdriver/bin/mx-smi vm --enable-vf {vfnum} -i {index}"]},
}
# what the manual's 001-32 leaves out (the chart refuses it without a driver version)
OP_DRIVER, OP_SDK_IMAGE = "2.33.0.6", "maca-c500:2.33.0.4-ubuntu22.04-amd64"


def lab_values(path: Path, *more: dict[str, Any]) -> str:
    """` -f FILE` of the lab's values (and `more`), to append to a manual's command."""
    values: dict[str, Any] = json.loads(json.dumps(LAB_VALUES))
    for extra in more:
        values.update(extra)
    path.write_text(yaml.safe_dump(values))
    return f" -f {path}"


# ------------------------------------------------------------------------------ helpers
def node_name() -> str:
    return os.environ.get("GPUK8S_LAB_NODE") or run("hostname", "-s").stdout.strip().lower()


def fill(text: str, **extra: str) -> str:
    """The manual's text with its placeholders filled in (nothing else changed)."""
    values = {"DOMAIN/PROJECT": PROJECT, "DOMAIN": DOMAIN, "0.8.0": version(),
              "<ARCH>": ARCH, "<NODE>": node_name(), "<nodename>": node_name(), **extra}
    pattern = re.compile("|".join(re.escape(k) for k in sorted(values, key=len, reverse=True)))
    return pattern.sub(lambda m: values[m.group(0)], text)


@contextlib.contextmanager
def tools_path(tmp: Path, drop: tuple[str, ...] = ()) -> Iterator[dict[str, str]]:
    """An environment whose PATH has `kubectl` and `helm` (helm 3: what the manual's
    get-helm-3 installs) in front of this machine's PATH, without the programs in `drop`."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "kubectl").symlink_to(KUBECTL)
    (bin_dir / "helm").symlink_to(HELM3)
    path = [str(bin_dir)]
    if drop:
        rest = tmp / "rest"
        rest.mkdir(exist_ok=True)
        for directory in os.environ["PATH"].split(":"):
            if not os.path.isdir(directory):
                continue
            for name in sorted(os.listdir(directory)):
                target, link = os.path.join(directory, name), rest / name
                if name in drop or link.exists() or not os.access(target, os.X_OK):
                    continue
                link.symlink_to(target)
        (rest / "docker").unlink(missing_ok=True)
        (rest / "docker").symlink_to(DOCKER)  # Debian's client, as tests/dockerd.py uses
        path.append(str(rest))
    else:
        path.append(os.environ["PATH"])
    yield {**os.environ, "PATH": ":".join(path), "KUBECONFIG": KUBECONFIG, "USER": USER,
           "HOME": str(tmp), "HELM_CONFIG_HOME": str(tmp / "helm"),
           "HELM_CACHE_HOME": str(tmp / "helm-cache"), "HELM_DATA_HOME": str(tmp / "helm-data")}


def sh(block_id: str, script: str, env: dict[str, str], cwd: Path | str | None = None,
       check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The manual's commands as a user types them, one after the other, stopping at the
    first that fails (bash -e)."""
    proc = subprocess.run(["bash", "-e", "-c", script], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check:
        assert proc.returncode == 0, (f"{block_id}: {script!r} -> {proc.returncode}\n"
                                      f"{proc.stdout}\n{proc.stderr}")
    return proc


def in_pty(block_id: str, command: str, env: dict[str, str], answers: dict[str, str],
           cwd: Path | str | None = None, timeout: float = 120) -> tuple[int, str]:
    """Run `command` (bash) on a terminal, answering each prompt in `answers` (a text the
    output ends with -> what is typed); (exit status, everything printed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child
        try:
            if cwd:
                os.chdir(cwd)
            os.execvpe("bash", ["bash", "-c", command], env)
        finally:
            os._exit(127)
    out, pending = b"", dict(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
                # without terminal control sequences (busybox's shell asks where the
                # cursor is after its prompt)
                text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
                for prompt in list(pending):
                    if text.rstrip().endswith(prompt.rstrip()):
                        os.write(fd, (pending.pop(prompt) + "\n").encode())
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"{block_id}: {command!r} did not finish in {timeout}s:\n"
                                 f"{out.decode(errors='replace')}")
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace").replace("\r\n", "\n")


def helm3(*args: str, check: bool = True, timeout: float = 600) -> str:
    return run(HELM3, "--kubeconfig", KUBECONFIG, *args, check=check, timeout=timeout).stdout


def gpus(node: str, field: str = "allocatable") -> int:
    value = kubectl("get", "node", node, "-o",
                    "jsonpath={.status." + field + ".metax-tech\\.com/gpu}")
    return int(value or 0)


def labels(node: str) -> dict[str, str]:
    return dict(kubectl_json("get", "node", node)["metadata"].get("labels") or {})


def releases(namespace: str) -> list[str]:
    out = helm3("list", "--deployed", "-q", "-n", namespace, check=False)
    return out.split()


def sim_state(root: Path = SIM_ROOT) -> dict[str, Any]:
    return json.loads(run(tool("gpuk8s"), "sim", "show", "--root", str(root), "--json").stdout)


def catalog() -> list[str]:
    with urllib.request.urlopen(f"http://{REGISTRY}/v2/_catalog?n=1000", timeout=5) as resp:
        return list(json.load(resp)["repositories"])


def tags(repo: str) -> list[str]:
    with urllib.request.urlopen(f"http://{REGISTRY}/v2/{repo}/tags/list", timeout=5) as resp:
        return list(json.load(resp).get("tags") or [])


def second_mention(b: Block) -> str:
    """The corrected command the notes quote (`...`) after a block printed with a slip."""
    quoted = re.findall(r"`([^`]*kubectl[^`]*)`", b.notes)
    assert quoted, f"{b.id}: the notes quote no corrected command"
    return quoted[-1]


def app_files(workspace: Path, context: str, dockerfile: str) -> None:
    """A buildable stand-in for the manual's application (its Dockerfiles need the vendor's
    SDK images and Ubuntu's mirrors; see docs/manual-conformance.md): a program
    `/app/bin/xxx` that reports what the container got, and /bin/bash, which busybox lacks."""
    src = workspace / context / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "xxx").write_text("#!/bin/sh\necho \"xxx $*\"; ls /dev/dri; "
                             "test -d /opt/maca && echo sdk=$(cat /opt/maca/Version.txt) "
                             "|| echo sdk=none; env | grep MACA_VISIBLE_DEVICES\n")
    (src / "bash").write_text("#!/bin/sh\nexec /bin/sh \"$@\"\n")
    (workspace / context / "Makefile").write_text("all:\n\techo the stand-in needs no build\n")
    (workspace / dockerfile).write_text(
        f"FROM {BUSYBOX} AS builder\nCOPY src /workspace/src\n"
        f"FROM {BUSYBOX}\nCOPY --from=builder /workspace/src/xxx /app/bin/xxx\n"
        "COPY --from=builder /workspace/src/bash /bin/bash\n")
    for name in ("xxx", "bash"):
        (src / name).chmod(0o755)


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("manual")


@pytest.fixture(scope="module")
def package(work: Path) -> Path:
    """The offline package built from the images lab/up built (as test_package.py)."""
    out = work / "dist"
    run(str(REPO / "package" / "build.sh"), version(), "--images", str(IMAGES_TXT),
        "--out", str(out), timeout=900)
    return out


@pytest.fixture(scope="module")
def dockerd() -> Iterator[Dockerd]:
    with private_dockerd() as daemon:
        yield daemon


@pytest.fixture(scope="module")
def c500_lab(lab: dict[str, str]) -> Iterator[dict[str, str]]:
    """The lab as lab/up leaves it by default: simulated C500s with a driver and an SDK
    (the extensions scheme needs a driver installed by the administrator). Another preset
    (tests/e2e/test_operator.py's nodriver-8) is switched to c500-8 and back at the end."""
    preset = sim_state()["preset"]
    if preset != "c500-8":
        run(str(LAB / "up"), "--preset", "c500-8", "--skip-images", timeout=900)
    state = sim_state()
    assert state["preset"] == "c500-8" and state["driver"]["loaded"], state["driver"]
    try:
        yield lab
    finally:
        if preset != "c500-8":
            run(str(LAB / "up"), "--preset", preset, "--skip-images", timeout=900)


@pytest.fixture(scope="module")
def shared(work: Path) -> Iterator[dict[str, Any]]:
    """What one chapter leaves for the next (the release names, the unpacked package).
    A release a failed test left installed is removed at the end."""
    state: dict[str, Any] = {}
    try:
        yield state
    finally:
        for namespace in (EXT_NS, OP_NS):
            for release in releases(namespace):
                if release in (state.get("extensions"), state.get("operator")):
                    helm3("uninstall", release, "-n", namespace, "--wait", "--timeout", "5m",
                          check=False)


# ------------------------------------------------------------- 001 chapter 1: the package
@manual("001-01", "001-02", "001-03", "001-04", "001-06", "001-07")
def test_001_ch1_offline_package_push_and_load(
    c500_lab: dict[str, str], package: Path, dockerd: Dockerd, work: Path,
    shared: dict[str, Any],
) -> None:
    v = version()
    # 001-01: unpack; tar lists the images installer and the two charts
    b = block("001-01")
    commands = [fill(c) for c in b.commands()]
    out = sh(b.id, "\n".join(commands), os.environ.copy(), cwd=package).stdout.split()
    printed = [fill(line) for line in b.code.splitlines() if not line.startswith("$")]
    assert set(printed) <= set(out), f"001-01: tar listed {out}, the manual {printed}"
    shared["k8s"] = package / "k8s"

    with tools_path(work / "docker-only", drop=("skopeo", "ctr")) as env:
        env = {**env, **{k: v for k, v in dockerd.env.items() if k.startswith("DOCKER_")}}
        # 001-02: docker login DOMAIN -u $USER, the password typed at the prompt
        rc, said = in_pty("001-02", fill(block("001-02").code), env, {"Password:": PASSWORD})
        assert rc == 0 and "Login Succeeded" in said, f"001-02: {said}"
        # 001-03: push with docker alone (no skopeo on PATH): the same images lab/up
        # pushed, so the lab's references stay what they were
        proc = sh("001-03", fill(block("001-03").code), env, cwd=package)
        # the eight component images (gpu-dra's included)
        assert f"pushed 8 images to {PROJECT}" in proc.stderr, f"001-03: {proc.stderr}"
        for name in ("gpu-device", "gpu-label", "gpu-aware", "gpu-exporter", "driver-manager",
                     "container-runtime", "operator-controller"):
            assert v in tags(f"gpuk8s/{name}"), f"001-03: {PROJECT}/{name}:{v} not pushed"
        # docker keeps nothing of the push (the tags it made are removed again)
        assert dockerd.docker("images", "-q").stdout.split() == [], "001-03: images left"

    # 001-04: load into this node's engine (the lab's containerd, namespace k8s.io)
    ctr = ["ctr", "-n", "k8s.io", "images", "ls", "-q"]
    had = set(run(*ctr).stdout.split())
    try:
        sh("001-04", fill(block("001-04").code), os.environ.copy(), cwd=package)
        loaded = set(run(*ctr).stdout.split()) - had
        for name in ("gpu-device", "gpu-label", "gpu-aware"):
            ref = f"cr.metax-tech.com/cloud/{name}:{v}"
            assert ref in loaded | had, f"001-04: {ref} not in containerd"
    finally:
        new = set(run(*ctr).stdout.split()) - had
        if new:
            run("ctr", "-n", "k8s.io", "images", "rm", *sorted(new))

    # 001-06, 001-07: helm registry login, then helm push of both charts. helm pushes to
    # the lab's plain-HTTP registry only with --plain-http (docs/manual-conformance.md)
    differs("001-07")
    with tools_path(work / "helm") as env:
        rc, said = in_pty("001-06", fill(block("001-06").code), env, {"Password:": PASSWORD})
        assert rc == 0 and "Login Succeeded" in said, f"001-06: {said}"
        for line in fill(block("001-07").code).splitlines():
            proc = sh("001-07", line + " --plain-http", env, cwd=package)
            assert f"Pushed: {PROJECT}/metax-" in proc.stdout + proc.stderr, f"001-07: {proc}"
    for chart in ("metax-gpu-extensions", "metax-operator"):
        assert v in tags(f"gpuk8s/{chart}"), f"001-07: {chart} {v} not in the registry"


@manual("001-08", "001-09")
def test_001_ch1_mxmaca_image_archives_load(dockerd: Dockerd, tmp_path: Path) -> None:
    """The SDK release's archives are the vendor's: stand-ins with the printed names and
    references (a busybox root file system, saved by docker and xz-compressed, as the SDK
    release ships them) are loaded with the manual's own command."""
    from tests.dockerd import busybox_rootfs

    env = {**os.environ, **{k: v for k, v in dockerd.env.items() if k.startswith("DOCKER_")},
           "PATH": f"{Path(DOCKER).parent}:{os.environ['PATH']}"}
    for b in (block("001-08"), block("001-09")):
        (command,) = b.commands()
        archive = command.split("<", 1)[1].strip()
        loaded = b.code.strip().splitlines()[-1]
        reference = loaded.split("Loaded image: ", 1)[1]
        dockerd.import_image(reference, busybox_rootfs())
        sh(b.id, f"docker save {reference} | xz -T1 > {archive} && docker rmi {reference}",
           env, cwd=tmp_path)
        out = sh(b.id, command, env, cwd=tmp_path).stdout
        assert out.strip().splitlines()[-1] == loaded, f"{b.id}: {out}"
        assert dockerd.docker("image", "inspect", reference).returncode == 0, b.id
        dockerd.docker("rmi", reference)
    # the product -> image name table printed with 001-08
    assert "MXC500  maca‑c500:<version>" in block("001-08").notes


# ------------------------------------------------- 001 chapter 2: GPU Extensions, verified
def describe(node: str, env: dict[str, str], block_id: str, command: str) -> str:
    return sh(block_id, fill(command), env).stdout


def section(text: str, title: str) -> dict[str, str]:
    """`kubectl describe node`'s `Capacity:` / `Allocatable:` block as {name: value}."""
    lines = text.splitlines()
    start = lines.index(title)
    out = {}
    for line in lines[start + 1:]:
        if not line.startswith(" "):
            break
        name, _, value = line.strip().partition(":")
        out[name] = value.strip()
    return out


@manual("001-10", "001-11", "001-17", "001-13", "001-14", "001-15", "002-58")
def test_001_ch2_install_gpu_extensions_and_verify(
    c500_lab: dict[str, str], work: Path, shared: dict[str, Any],
) -> None:
    node = c500_lab["node"]
    differs("001-10")
    # 001-10 as printed, with the manual's own options: 001-17 (gpu-aware) and 001-11's
    # example (gpu-label logs as text); then what the lab needs (LAB_VALUES)
    option = block("001-11").code.splitlines()
    assert option[0] == "--set option=value", "001-11"
    command = (fill(block("001-10").code).rstrip("\n") + " " + block("001-17").code.strip()
               + " " + option[1] + lab_values(work / "lab-values.yaml"))
    with tools_path(work / "install") as env:
        shared["env"] = env
        proc = sh("001-10", command, env, timeout=600)
        assert "STATUS: deployed" in proc.stdout, f"001-10: {proc.stdout}"
        # 001-15 (first line): helm list shows the generated release
        listed = sh("001-15", block("001-15").code.splitlines()[0], env).stdout
        names = [line.split()[0] for line in listed.splitlines()[1:] if line.strip()]
        shared["extensions"] = names[0] if names else None
        assert len(names) == 1 and names[0].startswith("metax-gpu-extensions-"), (
            f"001-15: {listed}")
        chart = helm3("list", "-n", EXT_NS, "-o", "json")
        assert json.loads(chart)[0]["chart"] == f"metax-gpu-extensions-{version()}", chart

        # 001-13: capacity and allocatable metax-tech.com/gpu (8 simulated C500s here)
        wait_until("allocatable 8", lambda: gpus(node) == 8, 180)
        b = block("001-13")
        text = describe(node, env, b.id, b.commands()[0])
        assert section(text, "Capacity:")[RESOURCE] == "8", f"001-13: {text}"
        assert section(text, "Allocatable:")[RESOURCE] == "8", f"001-13: {text}"
        allocated = re.search(rf"^\s*{re.escape(RESOURCE)}\s+(\S+)\s+(\S+)\s*$", text, re.M)
        assert allocated and allocated.groups() == ("0", "0"), f"001-13: {text}"
        # the printed sample's rows are rows of ours, in its columns
        for row in ("Capacity:", "Allocatable:", "Allocated resources:"):
            assert row in b.code and f"\n{row}" in text, f"001-13: {row}"

        # 001-14: `$kubectl describe node` (the prompt glued to the command, as printed)
        b = block("001-14")
        assert b.code.startswith("$kubectl describe node <NODE>"), "001-14"
        text = describe(node, env, b.id, b.code.splitlines()[0][1:])
        got = labels(node)
        printed = dict(re.findall(r"(metax-tech\.com/[\w.]+)=(\S+)", b.code))
        for key, value in printed.items():
            assert f"{key}=" in text and key in got, f"001-14: {key} missing"
            # the manual's node is a C550 with driver 2.0.0; ours a simulated C500
            kind = {"true": "true", "native": "native", "MXC": "MXC", "64GB": "64GB"}
            if value in kind:
                assert got[key] == value, f"001-14: {key}={got[key]}, printed {value}"
            elif value.isdigit():
                assert got[key].isdigit(), f"001-14: {key}={got[key]}"
        assert got["metax-tech.com/gpu.product"] == "C500" and printed[
            "metax-tech.com/gpu.product"] in ("C500", "C550")

        # 002-58: the node's allocatable resources, ${nodeName} from the environment
        out = sh("002-58", block("002-58").code, {**env, "nodeName": node}).stdout
        assert json.loads(out)[RESOURCE] == "8", f"002-58: {out}"

        # 001-11: --set gpuLabel.log.format=text reaches gpu-label alone
        def first_log(component: str) -> str:
            pod = kubectl("-n", EXT_NS, "get", "pods", "-l",
                          f"app.kubernetes.io/name={component}", "-o",
                          "jsonpath={.items[0].metadata.name}")
            return wait_until(f"{component} log", lambda: kubectl(
                "-n", EXT_NS, "logs", pod).splitlines()[0], 60)
        assert not first_log("gpu-label").startswith("{"), "001-11: gpu-label logs json"
        assert first_log("gpu-device").startswith("{"), "001-11: gpu-device's format changed"


def scheduler_pod(node: str) -> dict[str, Any]:
    return kubectl_json("-n", "kube-system", "get", "pod", f"kube-scheduler-{node}")


def scheduler_restarted(node: str, old_hash: str) -> bool:
    pod = scheduler_pod(node)
    fresh = pod["metadata"]["annotations"].get("kubernetes.io/config.hash") != old_hash
    ready = any(c["type"] == "Ready" and c["status"] == "True"
                for c in pod["status"].get("conditions", []))
    return fresh and ready


def write_manifest(text: str) -> None:
    """Atomically, from outside the manifests directory (the kubelet would read a
    temporary file there as a pod)."""
    tmp = MANIFEST.parent.parent / ".kube-scheduler.yaml.e2e"
    tmp.write_text(text)
    os.replace(tmp, MANIFEST)


def listing(text: str) -> dict[str, Any]:
    """A manifest excerpt as the manual prints it: its `...` lines (elisions, and a YAML
    document end marker to a parser) left out."""
    return dict(yaml.safe_load("".join(line + "\n" for line in text.splitlines()
                                       if line.strip() != "...")))


def merge_listing(manifest: dict[str, Any], listing: dict[str, Any]) -> None:
    """Apply the manual's listing of the manifest (its `...` lines stand for what is
    already there): every command item, volumeMount and volume it shows is present."""
    ours = manifest["spec"]["containers"][0]
    theirs = listing["spec"]["containers"][0]
    for item in theirs["command"]:
        if item != "..." and item not in ours["command"]:
            ours["command"].append(item)
    for key, items, where in (("volumeMounts", theirs["volumeMounts"], ours),
                              ("volumes", listing["spec"]["volumes"], manifest["spec"])):
        present = {x["name"]: x for x in where.setdefault(key, [])}
        for item in items:
            if item["name"] in present:
                assert present[item["name"]] == item, f"001-21: {key} {item['name']} differs"
            else:
                where[key].append(item)


def gpu_aware_metric(address: str, name: str, **labels: str) -> float:
    """The sum of gpu-aware's samples of `name` that carry `labels` (its /metrics)."""
    # the health port: plain HTTP whatever the extender port speaks
    with urllib.request.urlopen(f"http://{address}:8081/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        metric, _, value = line.rpartition(" ")
        if metric.split("{")[0] == name and all(f'{k}="{v}"' in metric
                                                 for k, v in labels.items()):
            total += float(value)
    return total


def gpu_pod(name: str, count: int, namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
                "resources": {"limits": {RESOURCE: str(count)}}}]}}


@manual("001-18", "001-19", "001-20", "001-21", "001-22", "001-23")
def test_001_ch2_gpu_aware_enabled_by_hand(
    c500_lab: dict[str, str], shared: dict[str, Any], tmp_path: Path,
) -> None:
    node, env = c500_lab["node"], shared["env"]
    original = MANIFEST.read_text()
    saved = EXTENDER_YAML.read_bytes() if EXTENDER_YAML.exists() else None
    had_dir = EXTENDER_YAML.parent.exists()
    old_hash = scheduler_pod(node)["metadata"]["annotations"]["kubernetes.io/config.hash"]
    EXTENDER_YAML.unlink(missing_ok=True)  # the manual writes it afresh (cat >>)
    differs("001-18", "001-20", "001-22")
    try:
        # 001-18 as printed lacks its closing quote: bash refuses it; the manual's second
        # mention has it. Its namespace metax-gpu is not the one 001-10 installs into.
        b = block("001-18")
        printed = sh(b.id, b.code, env, check=False)
        assert printed.returncode != 0 and "unexpected EOF" in printed.stderr, "001-18"
        assert sh(b.id, second_mention(b), env).stdout == "", "001-18: metax-gpu is empty"
        ip = sh(b.id, second_mention(b).replace("-n metax-gpu ", f"-n {EXT_NS} "),
                env).stdout.strip()
        assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", ip), f"001-18: {ip!r}"
        # 001-19, 001-20 as printed: the file holds the manual's v1beta3 configuration
        sh("001-19", block("001-19").code, env)
        sh("001-20", fill(block("001-20").code, **{"<gpuAwareSVCIP>": ip}), env)
        written = yaml.safe_load(EXTENDER_YAML.read_text())
        assert written["apiVersion"] == "kubescheduler.config.k8s.io/v1beta3", "001-20"
        assert written["extenders"][0]["urlPrefix"] == f"http://{ip}:8080", "001-20"
        # ... which this cluster's kube-scheduler no longer reads (SPEC §7): the
        # apiVersion becomes the one it serves, the one the gpu_aware role writes
        check = [SCHEDULER, "--secure-port=0", "--config", str(EXTENDER_YAML),
                 "--write-config-to", str(tmp_path / "effective.yaml")]
        refused = run(*check, check=False)
        assert refused.returncode != 0 and "no kind" in refused.stderr and \
            "kubescheduler.config.k8s.io/v1beta3" in refused.stderr, f"001-20: {refused.stderr}"
        from gpuk8s.core.schedconf import api_version_for

        served = api_version_for(VERSIONS["KUBE_VERSION"])
        EXTENDER_YAML.write_text(EXTENDER_YAML.read_text().replace(written["apiVersion"],
                                                                  served))
        run(*check)
        effective = yaml.safe_load((tmp_path / "effective.yaml").read_text())
        assert effective["extenders"][0]["weight"] == 500, "001-20"

        # 001-21: the manual's lines added to the static-pod manifest
        manifest = yaml.safe_load(original)
        merge_listing(manifest, listing(block("001-21").code))
        write_manifest(yaml.safe_dump(manifest, sort_keys=False))
        wait_until("kube-scheduler restarted with the extender",
                   lambda: scheduler_restarted(node, old_hash), 180)
        old_hash = scheduler_pod(node)["metadata"]["annotations"]["kubernetes.io/config.hash"]
        before = gpu_aware_metric(ip, "gpu_aware_requests_total", verb="filter", code="200")
        kubectl("apply", "-f", "-", stdin=json.dumps(gpu_pod("manual-extender", 1)))
        try:
            wait_until("pod bound", lambda: pod_phase("default", "manual-extender")
                       == "Running", 120)
            after = gpu_aware_metric(ip, "gpu_aware_requests_total", verb="filter",
                                     code="200")
            assert after > before, "001-21: kube-scheduler did not ask gpu-aware"
        finally:
            kubectl("delete", "pod", "manual-extender", "--wait=false", check=False)

        # 001-22: the weights ConfigMap, edited. As printed, awk's $2 is the DATA column
        # (a count), not the name; $1 is the name. Namespace as in 001-18.
        b = block("001-22")
        editor = tmp_path / "editor"
        editor.write_text("#!/bin/sh\nsed -i 's/^  scoreWeight: .*/  scoreWeight: \"3\"/' \"$1\"\n")
        editor.chmod(0o755)
        edit_env = {**env, "KUBE_EDITOR": str(editor), "EDITOR": str(editor)}
        printed = sh(b.id, b.code.replace("metax-gpu ", f"{EXT_NS} "), edit_env, check=False)
        assert printed.returncode != 0 and "not found" in printed.stderr, f"001-22: {printed}"
        sh(b.id, b.code.replace("metax-gpu ", f"{EXT_NS} ").replace("$2", "$1"), edit_env)
        cm = kubectl_json("-n", EXT_NS, "get", "cm", "gpu-aware-plugin")
        assert cm["data"]["scoreWeight"] == "3", f"001-22: {cm['data']}"
        wait_until("gpu-aware reads scoreWeight 3",
                   lambda: gpu_aware_metric(ip, "gpu_aware_score_weight") == 3.0, 120)
    finally:
        # 001-23: the same lines removed again: the manifest is what it was
        manifest = yaml.safe_load(MANIFEST.read_text())
        added = listing(block("001-21").code)
        container = manifest["spec"]["containers"][0]
        ours = container["command"]
        container["command"] = [c for c in ours if c != "--config=/etc/metax/extender.yaml"]
        container["volumeMounts"] = [m for m in container["volumeMounts"]
                                     if m["name"] != "extenderconfig"]
        manifest["spec"]["volumes"] = [v for v in manifest["spec"]["volumes"]
                                       if v["name"] != "extenderconfig"]
        assert "extenderconfig" in {v["name"] for v in added["spec"]["volumes"]}
        restored = manifest == yaml.safe_load(original)
        write_manifest(original)
        if saved is not None:
            EXTENDER_YAML.write_bytes(saved)
        else:
            EXTENDER_YAML.unlink(missing_ok=True)
            if not had_dir:
                shutil.rmtree(EXTENDER_YAML.parent, ignore_errors=True)
    assert restored, "001-23: removing the manual's lines did not give the manifest back"
    wait_until("kube-scheduler restarted without the extender",
               lambda: scheduler_restarted(node, old_hash), 180)


def build_application(dockerd: Dockerd, workspace: Path, env: dict[str, str]) -> str:
    """001-25's layout and 001-26's build, of a stand-in application; then pushed (a step
    the manual leaves out) so the cluster can pull it. Returns the image reference."""
    layout = block("001-25").code
    assert "├── Dockerfile" in layout and "└── Project" in layout and "Makefile" in layout
    app_files(workspace, "Project", "Dockerfile")
    denv = {**env, **{k: v for k, v in dockerd.env.items() if k.startswith("DOCKER_")},
            "PATH": f"{Path(DOCKER).parent}:{env['PATH']}"}
    sh("001-26", fill(block("001-26").code), denv, cwd=workspace, timeout=300)
    image = fill("DOMAIN/PROJECT/application:1.0")
    differs("001-26")  # the manual leaves the push out
    sh("001-26", f"docker push {image}", denv, timeout=300)
    return image


def run_job(env: dict[str, str], workdir: Path) -> str:
    """001-27 written to sample.yaml and submitted with 001-28; the pod's output."""
    (workdir / "sample.yaml").write_text(fill(block("001-27").code))
    sh("001-28", block("001-28").code, env, cwd=workdir)
    try:
        wait_until("application Running", lambda: pod_phase("default", "application")
                   == "Running", 180)
        return str(wait_until("application output", lambda: (
            out if "MACA_VISIBLE_DEVICES" in (out := kubectl("logs", "application"))
            else ""), 60))
    finally:
        kubectl("delete", "pod", "application", "--grace-period=1", "--wait=true",
                "--timeout=60s", check=False)


@manual("001-24", "001-25", "001-26", "001-27", "001-28")
def test_001_ch2_application_image_and_job(
    c500_lab: dict[str, str], shared: dict[str, Any], dockerd: Dockerd, work: Path,
) -> None:
    # 001-24: the extensions scheme's Dockerfile builds FROM the SDK image in both stages
    # (nothing puts the SDK into a container at run time); its `...` lines are elisions and
    # its images are the vendor's, so a stand-in is built (docs/manual-conformance.md)
    differs("001-24")
    stages = re.findall(r"^FROM (\S+)", block("001-24").code, re.M)
    assert len(stages) == 2 and all("maca-c500" in s for s in stages), f"001-24: {stages}"
    assert "COPY --from=builder /app /app" in block("001-24").code
    workspace = work / "workspace"
    shared["app"] = build_application(dockerd, workspace, shared["env"])
    out = run_job(shared["env"], workspace)
    # the command and args of 001-27 ran; two GPUs; the image has no SDK and the
    # extensions scheme injects none
    assert "xxx --option=val" in out, f"001-27: {out}"
    assert len(re.findall(r"\bcard\d+", out)) == 2, f"001-27: {out}"
    assert "sdk=none" in out, f"001-24: an SDK appeared in the extensions scheme: {out}"


@manual("001-29", "001-30", "001-31")
def test_001_ch2_node_maintenance(c500_lab: dict[str, str], shared: dict[str, Any]) -> None:
    node, env = c500_lab["node"], shared["env"]
    sh("001-29", fill(block("001-29").code), env)
    try:
        assert kubectl_json("get", "node", node)["spec"].get("unschedulable") is True, "001-29"
        kubectl("apply", "-f", "-", stdin=json.dumps(gpu_pod("manual-cordoned", 1)))
        time.sleep(5)
        assert pod_phase("default", "manual-cordoned") == "Pending", "001-29: scheduled"
    finally:
        sh("001-30", fill(block("001-30").code), env)
    try:
        assert not kubectl_json("get", "node", node)["spec"].get("unschedulable"), "001-30"
        wait_until("the waiting pod runs", lambda: pod_phase("default", "manual-cordoned")
                   == "Running", 120)
    finally:
        kubectl("delete", "pod", "manual-cordoned", "--wait=false", check=False)
    text = sh("001-31", fill(block("001-31").code), env).stdout
    assert "metax-tech.com/gpu.installed=true" in text, "001-31: labels"
    assert section(text, "Allocatable:")[RESOURCE] == "8", "001-31: allocatable"


@manual("001-16")
def test_001_ch2_uninstall_script_leaves_nothing(
    c500_lab: dict[str, str], shared: dict[str, Any],
) -> None:
    env, release = shared["env"], shared["extensions"]
    sh("001-16", block("001-16").code, env, timeout=600)
    assert releases(EXT_NS) == [], "001-16: a release is left"
    wait_until("nothing left in the namespace", lambda: kubectl(
        "get", "all,configmaps,serviceaccounts,roles,rolebindings", "-n", EXT_NS, "-o", "name",
        check=False).split() in ([], ["configmap/kube-root-ca.crt",
                                      "serviceaccount/default"]), 120)
    cluster = kubectl("get", "clusterroles,clusterrolebindings,validatingadmissionpolicies,"
                      "validatingadmissionpolicybindings", "-l",
                      f"app.kubernetes.io/instance={release}", "-o", "name", check=False)
    assert cluster.strip() == "", f"001-16: left {cluster}"
    # run again with nothing installed: the script does nothing, and says nothing
    again = sh("001-16", block("001-16").code, env)
    assert again.stdout == "" and again.stderr == "", f"001-16: {again}"


# --------------------------------------------------- 001 chapter 3: GPU Operator scheme
def options_of(b: Block) -> dict[str, dict[str, str]]:
    return {row["option"].strip("`"): row for row in b.table}


@manual("001-32", "001-34", "001-35", "001-36", "001-37", "001-38")
def test_001_ch3_operator_install_sdk_injection_virtualisation_uninstall(
    c500_lab: dict[str, str], shared: dict[str, Any], work: Path,
) -> None:
    node, env = c500_lab["node"], shared["env"]
    assert releases(EXT_NS) == [], "the extensions chapter left its release"
    containerd_config = (STATE / "containerd" / "config.toml").read_text()
    # 001-32 as printed: the chart refuses it, by the manual's own rule (001-33:
    # driver.payload.version "must be set explicitly when driver.deployPolicy is not Never")
    differs("001-32")
    rule = options_of(block("001-33"))["driver.payload.version"]["default / allowed values"]
    assert "must be set explicitly" in rule
    command = fill(block("001-32").code).rstrip("\n") + lab_values(
        work / "operator-lab-values.yaml", OP_LAB_VALUES)
    refused = sh("001-32", command, env, check=False)
    assert refused.returncode != 0 and "driver.payload.version" in refused.stderr, (
        f"001-32: {refused.stdout}{refused.stderr}")
    assert releases(OP_NS) == [], "001-32: a refused install left a release"
    installed = False
    try:
        proc = sh("001-32", command + f" --set driver.payload.version={OP_DRIVER}"
                  f" --set 'maca.payload.images={{{OP_SDK_IMAGE}}}'", env)
        installed = True
        assert "STATUS: deployed" in proc.stdout, f"001-32: {proc.stdout}"
        # every component of the scheme works: then (only then) the GPUs are allocatable;
        # the driver and the SDK the administrator installed are left alone
        wait_until("allocatable 8 in the operator scheme", lambda: gpus(node) == 8, 300)
        got = labels(node)
        for key in ("driver.ready", "maca.ready", "runtime.ready"):
            assert got[f"metax-tech.com/{key}"] == "true", f"001-32: {key}"
        assert got["metax-tech.com/gpu.driver.mode"] == "native", "001-32: driver replaced"

        # 001-37 / 001-38: the application image carries no SDK (001-37's runtime stage is
        # a plain OS image); the same job (001-25..28) now finds the host's SDK injected
        differs("001-37")
        stages = re.findall(r"^FROM (\S+)", block("001-37").code, re.M)
        assert stages[-1] == "ubuntu:18.04", f"001-37: {stages}"
        for lib in ("libelf1", "libltdl7", "libnuma1"):
            assert lib in block("001-37").code
        assert block("001-38").refers_to == ["001-25", "001-26", "001-27", "001-28"]
        out = run_job(env, work / "workspace")
        sdk = (SIM_ROOT / "opt/maca/Version.txt").read_text().strip()
        assert f"sdk={sdk}" in out, f"001-38: the SDK was not injected: {out}"
        assert len(re.findall(r"\bcard\d+", out)) == 2, f"001-38: {out}"

        # 001-34: driver-config's node-vfnums, edited as the manual shows (its nodes
        # sample-node, sample-node2 and foo do not exist here: nothing changes), then
        # with this node added
        printed = fill(block("001-34").code)
        document = re.search(r'"node-vfnums": "(.*)"\s*}\s*$', printed, re.S)
        assert document, "001-34"
        vfnums = yaml.safe_load(document.group(1))
        assert vfnums == {"nodes": {"sample-node": {"vfnum": 4}, "sample-node2": {"vfnum": 2},
                                    "foo": {"vfnum": 2}}}, f"001-34: {vfnums}"
        cm = kubectl_json("-n", OP_NS, "get", "configmap", "driver-config")
        assert "node-vfnums" in cm["data"], f"001-34: {cm['data']}"

        def set_vfnums(doc: str) -> None:
            kubectl("patch", "configmap", "driver-config", "-n", OP_NS, "--type", "merge",
                    "-p", json.dumps({"data": {"node-vfnums": doc}}))

        set_vfnums(document.group(1))
        invalid = wait_until("InvalidVfnum for the manual's nodes", lambda: [
            e["message"] for e in kubectl_json(
                "-n", OP_NS, "get", "events", "--field-selector",
                "involvedObject.name=driver-config,reason=InvalidVfnum")["items"]
            if "sample-node" in e["message"]], 90)
        assert "no GPU node of that name" in invalid[0], f"001-34: {invalid}"
        assert gpus(node, "capacity") == 8, "001-34: the manual's nodes changed this one"
        set_vfnums(document.group(1).replace("  foo:", f"  {node}:\n    vfnum: 2\n  foo:"))
        wait_until("capacity 16 (8 GPUs x 2 VFs)", lambda: gpus(node, "capacity") == 16, 240)
        wait_until("allocatable 16", lambda: gpus(node) == 16, 120)
        assert labels(node)["metax-tech.com/gpu.vfnum"] == "2", "001-34"
        set_vfnums(document.group(1))  # the manual's nodes only: this node's VFs stay
        time.sleep(15)
        assert gpus(node, "capacity") == 16, "001-34: a node left out lost its VFs"
        set_vfnums(f"nodes:\n  {node}:\n    vfnum: 0\n")
        wait_until("capacity 8 again", lambda: gpus(node, "capacity") == 8, 240)
        # the VF change ends with validation and the uncordon; an uninstall before that
        # leaves the node cordoned (the host's VFs changed: the operator's uninstall
        # reports such a node instead of uncordoning it), and every later test's pods
        # would stay Pending
        wait_until("the VF change done, the node uncordoned", lambda: not kubectl_json(
            "get", "node", node)["spec"].get("unschedulable"), 180)
    finally:
        if installed:
            # 001-35: helm list, then helm uninstall <CHART> --wait
            b = block("001-35")
            listed = sh(b.id, b.code.splitlines()[0], env).stdout
            names = [line.split()[0] for line in listed.splitlines()[1:] if line.strip()]
            assert len(names) == 1 and names[0].startswith("metax-operator-"), f"001-35: {listed}"
            shared["operator"] = names[0]
            sh(b.id, b.code.splitlines()[1].replace("<CHART>", names[0]), env, timeout=600)
    assert releases(OP_NS) == [], "001-35: a release is left"
    # --wait: what the operator deployed is gone with it
    assert (STATE / "containerd" / "config.toml").read_text() == containerd_config, "001-35"
    assert not Path("/etc/cdi/metax-tech.com-gpu.json").exists(), "001-35: CDI spec left"
    wait_until("operator's workloads gone", lambda: [
        x for x in kubectl("get", "pods,daemonsets,deployments", "-n", OP_NS, "-o", "name",
                           check=False).split()] == [], 180)
    assert not any(k.startswith("metax-tech.com/") and k.endswith(".ready") and
                   k != "metax-tech.com/driver.ready" for k in labels(node)), "001-35: labels"
    # 001-36 with nothing installed: nothing to do
    again = sh("001-36", block("001-36").code, env)
    assert again.stdout == "" and again.stderr == "", f"001-36: {again}"


# ------------------------------------------------------------- 001 chapter 4: metax-docker
@manual("001-39", "001-40", "001-41", "001-42", "001-43", "001-44")
def test_001_ch4_metax_docker_install_build_run(
    lab: dict[str, str], shared: dict[str, Any], dockerd: Dockerd, work: Path,
) -> None:
    from gpuk8s import sim
    from gpuk8s.metax_docker.dockerargs import parse_run
    from gpuk8s.metax_docker.selection import parse_request

    # 001-41: the parameters and every form of --gpus the table names
    table = {row["parameter"].strip("`"): row for row in block("001-41").table}
    assert set(table) == {"--gpus", "--maca", "--maca-force"}, "001-41"
    assert parse_request("all").every and parse_request("2").count == 2
    assert parse_request("[0,3]").names == ("0", "3")
    assert parse_request("[SN1,SN2]").names == ("SN1", "SN2")
    parsed = parse_run(["--gpus", "all", "--maca", "/opt/maca-2", "--maca-force", "img"])
    assert (parsed.wrapper.gpus, parsed.wrapper.maca, parsed.wrapper.maca_force) == (
        "all", "/opt/maca-2", True), "001-41"

    # 001-42, 001-43: the metax-docker example's layout and Dockerfile, as printed:
    # docker refuses `WORKDIR/workspace` (no space) before anything is built
    layout = block("001-42").code
    samples = work / "samples"
    for name in re.findall(r"──(\S+\.cpp|Makefile)", layout):
        (samples / "src").mkdir(parents=True, exist_ok=True)
        (samples / "src" / name).write_text("// stand-in\n")
    (samples / "Dockerfile").write_text(block("001-43").code)
    denv = {**os.environ, **{k: v for k, v in dockerd.env.items() if k.startswith("DOCKER_")}}
    refused = run(DOCKER, "build", "-t", "printed:1.0", str(samples), env=denv, check=False)
    assert refused.returncode != 0 and "WORKDIR/WORKSPACE" in refused.stderr.upper(), (
        f"001-43: {refused.stderr}")
    # the stand-in (docs/manual-conformance.md: the vendor's image and Ubuntu's mirrors are
    # out of reach), in the same layout, built with 001-44 as printed
    differs("001-43")
    (samples / "Dockerfile").unlink()
    app_files(samples, ".", "Dockerfile")

    # 001-39 in a mount namespace of its own (an empty /usr/local/bin, so nothing of this
    # machine's is touched), as root: `sudo` dropped where there is none
    differs("001-39")
    host = work / "mdhost"
    sim.create(str(host), "c500-8", device_nodes="char")
    steps = block("001-39").code
    if os.geteuid() == 0 and not shutil.which("sudo"):
        steps = steps.replace("sudo ./", "./")
    script = (f"set -e\nmount -t tmpfs tmpfs /usr/local/bin\ncd {shared['k8s']}\n"
              + fill(steps) + f"\ncd {samples}\n" + fill(block("001-44").code)
              + "\nexec " + fill(block("001-40").code))
    env = {**denv, "METAX_DOCKER_HOST_ROOT": str(host),
           "METAX_DOCKER_CACHE_DIR": str(work / "md-cache")}
    rc, out = in_pty("001-40", "unshare --mount --propagation private bash -c "
                     + shlex.quote(script),
                     env, {"# ": "ls /dev/dri; echo maca=$MACA_VISIBLE_DEVICES; exit 3"},
                     timeout=300)
    assert f"metax-docker_{version()}.{ARCH}.run" in out, f"001-39: {out}"
    assert "changed: installed metax-docker" in out, f"001-39: {out}"
    assert "Successfully tagged user-application:1.0" in out, f"001-44: {out}"
    # 001-40: every GPU in the container, the shell on the terminal, its exit status back
    assert rc == 3, f"001-40: exit status {rc}: {out}"
    cards = set(re.findall(r"\bcard\d+", out.rsplit("ls /dev/dri", 1)[-1]))
    assert len(cards) == 8, f"001-40: {out}"
    visible = re.search(r"maca=([0-9,]+)", out)
    assert visible and len(visible.group(1).split(",")) == 8, f"001-40: {out}"


# ------------------------------------------------- 002: an NVIDIA host, on a simulator root
NV_DRIVER = "550.54.15"  # the simulator's driver for H100 (CUDA 12.4)


def on_host(root: Path, text: str) -> str:
    """A host command run against a simulator root: the host's absolute paths the manual
    names are moved under the root (its tools come first on PATH: host_env)."""
    for path in ("/home/gpu", "/dev/nvidia"):
        text = text.replace(path, f"{root}{path}")
    return text


def host_env(root: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{root}/usr/sbin:{root}/usr/bin:{os.environ['PATH']}"}


def smi_headings(text: str) -> list[str]:
    """The column headings of nvidia-smi's table (cells of its heading rows)."""
    cells: list[str] = []
    for line in text.splitlines():
        if re.match(r"^\|\s+(GPU\s+Name|Fan\s+Temp|GPU\s+GI|Processes:)", line):
            cells += [re.sub(r"\s+", " ", c.strip()) for c in line.strip("|").split("|")]
    return [c for c in cells if c]


@manual("002-01", "002-02", "002-05", "002-30", "002-36", "002-38", "002-39")
def test_002_driver_install_and_nvidia_smi_on_a_simulated_host(tmp_path: Path) -> None:
    from gpuk8s import sim
    from gpuk8s.core.cuda import CudaVersion, check
    from gpuk8s.host.containercheck import parse_output
    from gpuk8s.sim import tree

    root = tmp_path / "node"
    sim.create(str(root), "nvidia-8-nodriver", device_nodes="char")
    env = host_env(root)
    # 002-02 before the driver: the prerequisite is not met
    assert sh("002-02", block("002-02").code, env, check=False).returncode != 0, "002-02"
    # 002-36: /home/gpu and the driver in it. No network: the simulator writes its
    # stand-in installer where wget would have saved NVIDIA's
    differs("002-36")
    name = f"NVIDIA-Linux-x86_64-{NV_DRIVER}.run"
    steps = on_host(root, block("002-36").code).replace(
        "wget <Driver download address>",
        f"{tool('gpuk8s')} sim payload nvidia-driver --version {NV_DRIVER} --out . >/dev/null")
    listed = sh("002-36", steps.replace("<Driver file name>", name), env).stdout
    assert listed.strip() == name, f"002-36: {listed}"
    # 002-37 is yum (not on this Debian machine): the simulator's apt-get installs the same
    sh("002-37", f"apt-get install -y gcc dkms linux-headers-{tree.KERNEL_RELEASE}", env)
    # 002-38: chmod a+x, then the installer with --dkms
    proc = sh("002-38", on_host(root, block("002-38").code).replace("<Driver file name>",
                                                                   name), env, timeout=300)
    assert sim_state(root)["driver"]["loaded"], f"002-38: {proc.stdout}{proc.stderr}"
    # 002-39 / 002-02: nvidia-smi answers, with the manual's table layout
    b = block("002-39")
    assert b.commands() == ["nvidia-smi"], "002-39"
    table = sh(b.id, "nvidia-smi", env).stdout
    assert smi_headings(table)[:len(smi_headings(b.code))] == smi_headings(b.code), (
        f"002-39: {smi_headings(table)} vs {smi_headings(b.code)}")
    ours = parse_output(0, table)
    assert (ours.driver_version, ours.cuda_version) == (NV_DRIVER, "12.4"), "002-39"
    printed = parse_output(0, b.code)
    assert (printed.driver_version, printed.cuda_version) == ("515.65.01", "11.7"), "002-39"
    # 002-05: the same reading of the manual's A30 sample: driver 550.144.03, CUDA 12.4;
    # a runtime above what the driver supports is refused (CUDA_ERROR_UNKNOWN, 999)
    a30 = parse_output(0, block("002-05").code)
    assert (a30.driver_version, a30.cuda_version) == ("550.144.03", "12.4"), "002-05"
    assert check(CudaVersion(12, 4), CudaVersion(12, 4)) == (None, None), "002-05"
    refused, _ = check(CudaVersion(12, 4), CudaVersion(12, 6))
    assert refused and "driver must be >= the runtime" in refused, "002-05"
    # 002-01: the device nodes, read-write for everyone
    b = block("002-01")
    shown = sh(b.id, on_host(root, b.commands()[0]), env).stdout
    for line in b.code.splitlines()[1:]:
        if not line.strip():
            continue
        mode, *_, device = line.split()
        ours_line = next((x for x in shown.splitlines() if x.endswith(f"{root}{device}")), "")
        assert ours_line.startswith(mode), f"002-01: {device}: {ours_line!r} vs {line!r}"
        if device in ("/dev/nvidia0", "/dev/nvidiactl"):
            assert re.search(r"\b195,\s+" + line.split(",")[1].split()[0] + r"\b", ours_line), (
                f"002-01: {ours_line}")
    # 002-30: memory used, once a second, until stopped
    loop = subprocess.Popen(["bash", "-c", block("002-30").code], env=env,
                            stdout=subprocess.PIPE, text=True)
    time.sleep(2.5)
    loop.terminate()
    lines = loop.communicate(timeout=10)[0].splitlines()
    assert lines.count("memory.used [MiB]") == 1, f"002-30: {lines}"
    assert len([x for x in lines if x.endswith(" MiB")]) >= 2 * 8, f"002-30: {lines}"


@manual("002-42", "002-43", "002-45")
def test_002_container_runtime_configs_as_the_real_daemons_read_them(tmp_path: Path) -> None:
    # 002-42: the fragment alone is a version-1 file to containerd 1.x, which ignores the
    # `io.containerd.grpc.v1.cri` plugin table there; in a version-2 config file (what
    # `containerd config default` writes, and what the fragment goes into) it makes
    # nvidia the default runtime
    fragment = block("002-42").code
    alone, in_v2 = tmp_path / "fragment.toml", tmp_path / "config.toml"
    alone.write_text(fragment)
    in_v2.write_text("version = 2\n" + fragment)

    def dumped(path: Path) -> str:
        return run("containerd", "--config", str(path), "config", "dump").stdout

    assert 'default_runtime_name = "runc"' in dumped(alone), "002-42: read as version 1"
    effective = dumped(in_v2)
    assert 'default_runtime_name = "nvidia"' in effective, f"002-42: {effective}"
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in effective, "002-42"
    # 002-43 / 002-45: dockerd started with the printed daemon.json (the restart: no
    # systemd here), then the manual's check
    differs("002-45")
    with private_dockerd(daemon=json.loads(block("002-43").code)) as daemon:
        b = block("002-45")
        check = b.code.splitlines()[-1].split("#")[0].strip()
        assert check == "docker info |grep Runtime", f"002-45: {check}"
        env = {**os.environ, **{k: v for k, v in daemon.env.items() if k.startswith("DOCKER_")}}
        env["PATH"] = f"{Path(DOCKER).parent}:{env['PATH']}"
        out = sh(b.id, check, env).stdout
        assert "Default Runtime: nvidia" in out and re.search(r"Runtimes:.*\bnvidia\b", out), (
            f"002-43: {out}")


# ---------------------------------------- 002: kube-scheduler with the sharing extenders
def validated(config: dict[str, Any], tmp_path: Path, name: str) -> subprocess.CompletedProcess:
    """What this cluster's kube-scheduler makes of a configuration file (it loads and
    validates it, writes the effective configuration and exits)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return run(SCHEDULER, "--secure-port=0", "--config", str(path), "--write-config-to",
               str(tmp_path / f"{name}.effective.yaml"), check=False)


@manual("002-46", "002-47", "002-48", "002-49", "002-50", "002-55", "002-56")
def test_002_scheduler_config_for_the_sharing_extenders(
    lab: dict[str, str], tmp_path: Path,
) -> None:
    from gpuk8s.core.schedconf import (
        ExtenderSpec,
        ManagedResource,
        TlsConfig,
        api_version_for,
    )

    assert block("002-55").refers_to == ["002-46", "002-47", "002-48"], "002-55"
    with tools_path(tmp_path) as env:
        # 002-46 / 002-47: the manifest, the Pod the manual shows; this kubeadm-style lab
        # starts kube-scheduler without --config (the manual's platform passes one)
        shown = yaml.safe_load(sh("002-46", block("002-46").code, env).stdout)
        printed = yaml.safe_load(block("002-47").code)
        for key in ("labels", "name", "namespace"):
            assert shown["metadata"][key] == printed["metadata"][key], f"002-47: {key}"
        command = shown["spec"]["containers"][0]["command"]
        assert command[0] == printed["spec"]["containers"][0]["command"][0] == "kube-scheduler"
        # 002-48: the apiserver's endpoint, for ${kube-apiserver}
        b = block("002-48")
        out = sh(b.id, b.commands()[0], env).stdout
        endpoint = re.search(r"Endpoints:\s+(\d+\.\d+\.\d+\.\d+:\d+)", out)
        assert endpoint and endpoint.group(1).endswith(":6443") is not None, f"002-48: {out}"
        assert re.fullmatch(r"Endpoints: \d+\.\d+\.\d+\.\d+:6443", b.code.splitlines()[-1])
    served = api_version_for(VERSIONS["KUBE_VERSION"])
    differs("002-49", "002-56")
    for b, resource, service in ((block("002-49"), "nvidia.com/mps-core",
                                  "nvidia-mps-scheduler-plugin"),
                                 (block("002-56"), "tencent.com/vcuda-core",
                                  "gpu-quota-admission")):
        text = b.code.replace("${kube-apiserver}", endpoint.group(1))
        config = yaml.safe_load(text)
        # as printed (`v1beta?`, one character unreadable): refused
        assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1beta?", b.id
        assert validated(config, tmp_path, b.id).returncode != 0, b.id
        config["apiVersion"] = served
        proc = validated(config, tmp_path, b.id)
        assert proc.returncode == 0, f"{b.id}: {proc.stderr[-800:]}"
        printed_entry = config["extenders"][0]
        assert printed_entry["managedResources"] == [
            {"ignoredByScheduler": False, "name": resource}], b.id
        assert f"/services/{service}/proxy/scheduler" in printed_entry["urlPrefix"], b.id
        # gpuk8s's own writer (kube_scheduler_extender, the gpu_aware role) gives the same
        # entry from the same facts
        tls = printed_entry["tlsConfig"]
        spec = ExtenderSpec(url_prefix=printed_entry["urlPrefix"], filter_verb="predicates",
                            prioritize_verb=None, enable_https=True,
                            tls_config=TlsConfig(False, None, tls["certFile"], tls["keyFile"],
                                                 tls["caFile"]),
                            managed_resources=(ManagedResource(resource),))
        spec.validate()
        ours = spec.to_yaml()
        assert {k: ours[k] for k in printed_entry} == printed_entry, f"{b.id}: {ours}"
    # 002-50: appended after an extender the file already has (gpu-aware's, as 001-20)
    entry = yaml.safe_load(block("002-50").code.replace("${kube-apiserver}",
                                                        endpoint.group(1)))
    assert entry == [yaml.safe_load(block("002-49").code.replace(
        "${kube-apiserver}", endpoint.group(1)))["extenders"][0]], "002-50"
    config = yaml.safe_load(fill(block("001-20").code.split("<< EOF\n", 1)[1].rsplit("EOF", 1)[0],
                                 **{"<gpuAwareSVCIP>": "10.96.0.10"}))
    config["apiVersion"] = served
    config["extenders"] += entry
    proc = validated(config, tmp_path, "002-50")
    assert proc.returncode == 0, f"002-50: {proc.stderr[-800:]}"
    effective = yaml.safe_load((tmp_path / "002-50.effective.yaml").read_text())
    assert [e["urlPrefix"].split("/")[-3] for e in effective["extenders"]][1] == \
        "nvidia-mps-scheduler-plugin", "002-50"


# ------------------------------------------------ option tables, ConfigMaps, snippets
CHARTS = REPO / "charts"


def values_of(chart: str) -> tuple[dict[str, Any], Any]:
    """(the chart's default values, a validator of its values.schema.json)."""
    import jsonschema

    values = yaml.safe_load((CHARTS / chart / "values.yaml").read_text())
    schema = json.loads((CHARTS / chart / "values.schema.json").read_text())
    return values, jsonschema.validators.validator_for(schema)(schema)


def at(values: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        values = values[part]
    return values


def current(values: dict[str, Any], path: str) -> Any:
    """The value in force: a component's log option left unset is the global log's."""
    try:
        return at(values, path)
    except KeyError:
        return at(values, "log." + path.rsplit(".", 1)[1])


def changed(values: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    import copy

    out = copy.deepcopy(values)
    *parents, last = path.split(".")
    node = out
    for part in parents:
        node = node[part]
    node[last] = value
    return out


def template(chart: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """helm template of a chart of this checkout, for this lab's Kubernetes version."""
    return run(HELM3, "template", "x", str(CHARTS / chart), "--kube-version",
               VERSIONS["KUBE_VERSION"], *args, check=check)


def check_option_table(b: Block, chart: str) -> None:
    """Each row of an option table against the chart: the option exists with the type,
    the printed default and the printed allowed values (the chart's schema accepts each of
    them and refuses a value outside them)."""
    values, schema = values_of(chart)
    logs = [p for p in ("log", "gpuDevice.log", "gpuLabel.log", "gpuAware.log", "driver.log",
                        "maca.log", "runtime.log") if p.split(".")[0] in values]
    for row in b.table:
        option, kind, text = (row["option"].strip("`"), row["type"],
                              row["default / allowed values"])
        paths = ([f"{p}.{option.split(': ')[1].strip('`')}" for p in logs]
                 if option.startswith("Log options") else [option])
        quoted = re.findall(r"`([^`]*)`", text)
        default = re.search(r"default `([^`]*)`", text)
        for path in paths:
            where = f"{b.id}: {chart} {path}"
            assert not schema.is_valid(changed(values, path, ["not", "this"])) or \
                kind == "string list", f"{where}: takes anything"
            value = current(values, path)
            if kind == "struct":
                assert isinstance(at(values, path), dict), where
                continue
            if default:
                want: Any = default.group(1)
                if kind == "integer":
                    want = int(want)
                elif kind == "bool":
                    want = want == "true"
                assert value == want, f"{where}: default {value!r}, printed {want!r}"
            if kind == "enum":
                for allowed in quoted:
                    assert schema.is_valid(changed(values, path, allowed)), f"{where}={allowed}"
                assert not schema.is_valid(changed(values, path, "surely-not")), where
            elif kind == "bool":
                for allowed in (True, False):
                    assert schema.is_valid(changed(values, path, allowed)), where
            elif kind == "integer":
                assert schema.is_valid(changed(values, path, 0)), f"{where}: 0 disables"
                assert not schema.is_valid(changed(values, path, -1)), where
            elif "units" in text:
                for allowed in ("2w", "3d", "12h", "1w2d"):
                    assert schema.is_valid(changed(values, path, allowed)), where
                assert not schema.is_valid(changed(values, path, "2m")), where
            elif kind == "string list":
                # the tag rule spans the template (the chart's validations): helm judges
                example = re.search(r"e\.g\. `([^`]*)`", text)
                assert example, where
                assert schema.is_valid(changed(values, path, [example.group(1)])), where
                untagged = example.group(1).split(":")[0]
                refused = template(chart, "--set", "driver.payload.version=1.0",
                                   "--set", f"{path}={{{untagged}}}", check=False)
                assert refused.returncode != 0 and "has no tag" in refused.stderr, (
                    f"{where}: an image without a tag: {refused.stderr[-300:]}")
            else:
                assert path.split(".")[0] in values, where


@manual("001-11", "001-12", "001-33")
def test_001_chart_option_tables() -> None:
    check_option_table(block("001-12"), "metax-gpu-extensions")
    # the operator chart takes every GPU Extensions option, and its own
    check_option_table(block("001-12"), "metax-operator")
    check_option_table(block("001-33"), "metax-operator")
    # 001-11: --set gpuLabel.log.format=text names an option of the chart
    values, schema = values_of("metax-gpu-extensions")
    path, value = block("001-11").code.splitlines()[1].split()[1].split("=")
    assert schema.is_valid(changed(values, path, value)), "001-11"
    assert not schema.is_valid(changed(values, path, "xml")), "001-11"


@manual("002-09", "002-10", "002-11", "002-12", "002-13")
def test_002_custom_resource_configmaps(tmp_path: Path) -> None:
    rendered = template("metax-gpu-extensions", "--set", "resourceDescriptors.enabled=true").stdout
    maps = {d["metadata"]["name"]: d for d in yaml.safe_load_all(rendered)
            if d and d["kind"] == "ConfigMap"
            and "features.alauda.io/type" in (d["metadata"].get("labels") or {})}
    assert maps, "002-09: no descriptor ConfigMaps"
    rule = block("002-09").code.strip()
    assert rule == "cf-crl-{customName}-{keyName}", "002-09"
    wanted_labels = yaml.safe_load(block("002-10").code)["labels"]
    for name, cm in maps.items():
        meta = cm["metadata"]
        group = meta["labels"]["features.alauda.io/group"]
        key_name = re.sub(r"[^a-z0-9-]", "-", cm["data"]["key"].split("/", 1)[1])
        assert name == rule.format(customName=group, keyName=key_name) or name.startswith(
            f"cf-crl-{group}-"), f"002-09: {name}"
        assert meta["namespace"] == "kube-public", f"002-09: {name}"
        for key, value in wanted_labels.items():
            # `{resource-group}` (YAML reads it as a mapping): the placeholder of the group
            want = group if value == {"resource-group": None} else value
            assert meta["labels"][key] == want, f"002-10: {name} {key}"
    printed = yaml.safe_load(block("002-11").code)
    ours = maps[printed["metadata"]["name"]]
    assert ours["metadata"]["labels"] == {**printed["metadata"]["labels"],
                                          **{k: v for k, v in ours["metadata"]["labels"].items()
                                             if not k.startswith("features.alauda.io/")}}, "002-11"
    # descriptionZh: the OCR lost the manual's Chinese text (docs/manual-conformance.md)
    assert {k: v for k, v in ours["data"].items() if k != "descriptionZh"} == {
        k: v for k, v in printed["data"].items() if k != "descriptionZh"}, "002-11"
    assert ours["data"]["descriptionZh"], "002-11"
    # 002-12: vcuda-core and vcuda-memory in one group
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(
        block("002-12").code.replace("metadata:", "---\nmetadata:")) if d]
    groups = {maps[n]["metadata"]["labels"]["features.alauda.io/group"] for n in names}
    assert groups == {"gpu-manager"}, f"002-12: {names}"
    # 002-13: the allowed policy values, as the chart's schema has them
    schema = json.loads((CHARTS / "metax-gpu-extensions" / "values.schema.json").read_text())
    item = schema["properties"]["resourceDescriptors"]["properties"]["items"]["items"]
    for row in block("002-13").table:
        field = row["field"].strip("`")
        printed_values = {v.strip().strip("`") for v in row["allowed values"].split("/")}
        assert set(item["properties"][field]["enum"]) == printed_values, f"002-13: {field}"


@manual("002-06")
def test_002_vcuda_core_100_is_one_whole_gpu() -> None:
    from gpuk8s.core.sharing import parse_share

    limits = yaml.safe_load(block("002-06").code)["resources"]["limits"]
    share = parse_share(limits)
    assert share is not None and share.whole and share.gpus == 1, f"002-06: {share}"
    assert parse_share({"tencent.com/vcuda-core": "300"}).gpus == 3  # type: ignore[union-attr]


@manual("002-23", "002-24", "002-25", "002-26", "002-27", "002-28", "002-32")
def test_002_paddle_allocator_strategy_and_alert(lab: dict[str, str], tmp_path: Path) -> None:
    python = tmp_path / "py"
    python.mkdir()
    (python / "python").symlink_to(shutil.which("python3") or "/usr/bin/python3")
    show = "import os; print('strategy=' + str(os.environ.get('FLAGS_allocator_strategy')))"
    (tmp_path / "train.py").write_text(show + "\n")
    with tools_path(tmp_path) as env:
        env["PATH"] = f"{python}:{env['PATH']}"
        # 002-23 on its own sets a shell variable, which a program started later does not
        # see (002-27 exports it)
        out = sh("002-23", block("002-23").code + "python train.py", env, cwd=tmp_path).stdout
        assert out.strip() == "strategy=None", f"002-23: {out}"
        out = sh("002-27", block("002-27").code, env, cwd=tmp_path).stdout
        assert out.strip() == "strategy=naive_best_fit", f"002-27: {out}"
        out = sh("002-28", f"python -c {shlex.quote(block('002-28').code + show)}", env).stdout
        assert out.strip() == "strategy=naive_best_fit", f"002-28: {out}"
        # 002-24..26: the Deployment's env, applied, seen in the pod. The printed
        # Deployment is an excerpt: name, selector, labels and an image are added
        deployment = yaml.safe_load(block("002-24").code)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env_printed = container["env"]
        deployment["metadata"] = {"name": "paddle"}
        deployment["spec"]["selector"] = {"matchLabels": {"app": "paddle"}}
        deployment["spec"]["template"]["metadata"] = {"labels": {"app": "paddle"}}
        deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
        container.update(image=BUSYBOX, command=["sleep", "3600"])
        assert container["env"] == env_printed == [
            {"name": "FLAGS_allocator_strategy", "value": "naive_best_fit"}], "002-24"
        (tmp_path / "updated_deployment.yaml").write_text(yaml.safe_dump(deployment))
        try:
            sh("002-25", block("002-25").code, env, cwd=tmp_path)
            pod = wait_until("paddle pod running", lambda: next((
                p["metadata"]["name"] for p in kubectl_json("get", "pods", "-l",
                                                            "app=paddle")["items"]
                if p["status"].get("phase") == "Running"), ""), 120)
            out = sh("002-26", block("002-26").code.replace("<pod-name>", pod), env).stdout
            assert out.strip() == "FLAGS_allocator_strategy=naive_best_fit", f"002-26: {out}"
        finally:
            kubectl("delete", "deployment", "paddle", "--wait=false", check=False)
    # 002-32: the alert as printed is a valid Prometheus rule, and gpuk8s's rules carry it
    printed = yaml.safe_load(block("002-32").code)
    rules = tmp_path / "paddle.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "paddle", "rules": printed}]}))
    assert "SUCCESS" in run("promtool", "check", "rules", str(rules)).stdout, "002-32"
    ours = REPO / "monitoring" / "prometheus" / "gpuk8s-rules.yml"
    found = [r for g in yaml.safe_load(ours.read_text())["groups"] for r in g["rules"]
             if r.get("alert") == "GPUAllocConflict"]
    assert found and all(found[0][k] == v for k, v in printed[0].items()), (
        f"002-32: {ours} carries {found}")
    assert "SUCCESS" in run("promtool", "check", "rules", str(ours)).stdout, "002-32"
