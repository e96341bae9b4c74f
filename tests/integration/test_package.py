"""The offline package, end to end against real programs: `make package` builds both
tarballs; the `.run` pushes every image to a real OCI registry (Debian's docker-registry,
started here on 127.0.0.1 with its own config and storage) and loads them into a real
containerd; `helm push` puts both charts in the same registry, and the chart pulled back
from it references images that are really there.

The component images are tiny but real OCI archives written by images/ociimage.py (one
file layer each), so the test does not wait for the full image build; set
GPUK8S_PACKAGE_IMAGES to an images.txt of images/build.sh (and GPUK8S_PACKAGE_VERSION to
their tag) to package the real ones.
Needs: helm (lab/tools.sh helm), skopeo, docker-registry, make; ctr + a running
containerd for the load test.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import lzma
import os
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dockerd import DOCKER, busybox_rootfs, private_dockerd_for_test

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# the images of GPUK8S_PACKAGE_IMAGES must be tagged with this version
VERSION = os.environ.get("GPUK8S_PACKAGE_VERSION", "1.2.3")
EXT_IMAGES = ["gpu-device", "gpu-dra", "gpu-label", "gpu-aware", "gpu-exporter"]
OP_IMAGES = ["driver-manager", "container-runtime", "operator-controller"]
ALL_IMAGES = EXT_IMAGES + OP_IMAGES
FULL = f"metax-gpu-k8s-package.{VERSION}"
BASE = f"metax-gpu-k8s-package.{VERSION}-base"
RUN = f"metax-k8s-images.{VERSION}.run"
METAX_DOCKER = f"metax-docker_{VERSION}.tar"


# -- tools --------------------------------------------------------------------------------
def need(program: str, hint: str) -> str:
    path = shutil.which(program)
    if not path:
        pytest.skip(f"{program} not installed ({hint})")
    return path


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300, **kw)


def ok(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = run(cmd, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


# -- fixtures -------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _registry(binary: str, root: Path, auth: dict[str, Any] | None = None) -> Iterator[str]:
    """A docker-registry of our own on 127.0.0.1:<free port>, storage under ``root``."""
    port = _free_port()
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {
            "filesystem": {"rootdirectory": str(root / "data")},
            "delete": {"enabled": True},
        },
        "http": {"addr": f"127.0.0.1:{port}"},
    }
    if auth:
        config["auth"] = auth
    (root / "config.yml").write_text(yaml.safe_dump(config))
    log = (root / "registry.log").open("w")
    proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except urllib.error.HTTPError as err:
                if err.code == 401 and auth:  # up, and asking for credentials
                    break
            except OSError:
                pass
            assert proc.poll() is None, (root / "registry.log").read_text()
            assert time.monotonic() < deadline, "docker-registry did not answer on /v2/"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A docker-registry of our own on 127.0.0.1:<free port>, storage in a temp dir."""
    binary = need("docker-registry", "apt-get install docker-registry")
    with _registry(binary, tmp_path_factory.mktemp("registry")) as address:
        yield address


@pytest.fixture(scope="module")
def images_list(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """images.txt ("ARCHIVE REF" lines) of one OCI archive per component, tagged VERSION."""
    given = os.environ.get("GPUK8S_PACKAGE_IMAGES")
    if given:
        return Path(given)
    work = tmp_path_factory.mktemp("images")
    lines = []
    for name in ALL_IMAGES:
        payload = work / f"{name}.txt"
        payload.write_text(f"{name} {VERSION} {uuid.uuid4()}\n")
        archive = work / f"{name}.oci.tar"
        ref = f"127.0.0.1:5000/gpuk8s/{name}:{VERSION}"
        ok(
            [
                "python3",
                str(REPO / "images" / "ociimage.py"),
                "--ref",
                ref,
                "--out",
                str(archive),
                "--layer",
                f"{payload}=/etc/{name}.txt:0644",
                "--entrypoint",
                "/bin/true",
            ]
        )
        lines.append(f"{archive} {ref}")
    (work / "images.txt").write_text("\n".join(lines) + "\n")
    return work / "images.txt"


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory, images_list: Path, helm_binary: str) -> Path:
    """`make package VERSION=...`, both tarballs unpacked under the returned directory."""
    need("make", "apt-get install make")
    need("skopeo", "apt-get install skopeo")
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "HELM": helm_binary}
    ok(
        [
            "make",
            "-C",
            str(REPO),
            "package",
            f"VERSION={VERSION}",
            f"IMAGES={images_list}",
            f"OUT={out}",
        ],
        env=env,
    )
    for name in (FULL, BASE):
        # the manual's way: mkdir k8s; tar -C k8s -xvzf metax-gpu-k8s-package.<V>.tar.gz
        ok(["mkdir", "-p", str(out / "x" / name)])
        ok(["tar", "-C", str(out / "x" / name), "-xvzf", str(out / f"{name}.tar.gz")])
    return out


def _archive_manifest(archive: Path) -> dict[str, Any]:
    """The image manifest inside an OCI archive (index -> manifest)."""
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        digest = index["manifests"][0]["digest"].split(":", 1)[1]
        return json.load(tar.extractfile(f"blobs/sha256/{digest}"))  # type: ignore[arg-type]


def _archives(images_list: Path) -> dict[str, Path]:
    out = {}
    for line in images_list.read_text().splitlines():
        if line.strip():
            archive, ref = line.split()
            out[ref.rsplit("/", 1)[1].split(":")[0]] = Path(archive)
    return out


# -- the package ------------------------------------------------------------------------------
def test_package_layout(package: Path) -> None:
    # the manual's names: metax-gpu-k8s-package.<V>.tar.gz and ...<V>-base.tar.gz
    assert sorted(p.name for p in package.glob("*.tar.gz")) == sorted(
        [f"metax-gpu-k8s-package.{VERSION}-base.tar.gz", f"metax-gpu-k8s-package.{VERSION}.tar.gz"]
    )
    for name in (FULL, BASE):
        with tarfile.open(package / f"{name}.tar.gz") as tar:
            members = tar.getnames()
        # every file at the archive's top level: `tar -C k8s -xvzf` gives k8s/<file>
        assert all("/" not in m.lstrip("./") for m in members), members
        assert RUN in [m.lstrip("./") for m in members]
    full, base = package / "x" / FULL, package / "x" / BASE
    assert sorted(p.name for p in full.iterdir()) == sorted(
        [
            RUN,
            f"metax-gpu-extensions-{VERSION}.tgz",
            f"metax-operator-{VERSION}.tgz",
            METAX_DOCKER,
            "SHA256SUMS",
            "README.txt",
        ]
    )
    # the -base variant: no operator chart
    assert sorted(p.name for p in base.iterdir()) == sorted(
        [
            RUN,
            f"metax-gpu-extensions-{VERSION}.tgz",
            METAX_DOCKER,
            "SHA256SUMS",
            "README.txt",
        ]
    )
    for d in (full, base):
        ok(["sha256sum", "-c", "SHA256SUMS"], cwd=d)
        assert os.access(d / RUN, os.X_OK)
        # metax-docker's installers, one per architecture (tests/integration/test_metax_docker.py)
        with tarfile.open(d / METAX_DOCKER) as tar:
            assert tar.getnames() == [
                f"metax-docker_{VERSION}.aarch64.run",
                f"metax-docker_{VERSION}.x86_64.run",
            ]


@pytest.mark.parametrize("chart", ["metax-gpu-extensions", "metax-operator"])
def test_packaged_charts_carry_the_version_and_the_library(package: Path, chart: str) -> None:
    with tarfile.open(package / "x" / FULL / f"{chart}-{VERSION}.tgz") as tar:
        names = tar.getnames()
        meta = yaml.safe_load(tar.extractfile(f"{chart}/Chart.yaml"))  # type: ignore[arg-type]
    assert meta["version"] == VERSION and meta["appVersion"] == VERSION
    # the symlinked library chart is copied in: the .tgz stands alone
    assert f"{chart}/charts/gpuk8s-common/templates/_helpers.tpl" in names
    assert f"{chart}/values.schema.json" in names


def test_run_lists_and_verifies(package: Path) -> None:
    full = ok([str(package / "x" / FULL / RUN), "list"]).stdout.split()
    assert full == [f"{n}:{VERSION}" for n in ALL_IMAGES]
    base = ok([str(package / "x" / BASE / RUN), "list"]).stdout.split()
    assert base == [f"{n}:{VERSION}" for n in EXT_IMAGES]
    assert "payload ok" in ok([str(package / "x" / FULL / RUN), "verify"]).stderr


def test_run_detects_a_damaged_payload(package: Path, tmp_path: Path) -> None:
    damaged = tmp_path / RUN
    data = bytearray((package / "x" / FULL / RUN).read_bytes())
    data[-2000] ^= 0xFF
    damaged.write_bytes(bytes(data))
    damaged.chmod(0o755)
    # every command that reads the payload refuses it, list included (it used to print the
    # list and exit 0), whatever engine it would use; nothing is pushed, loaded or written
    for args in (["verify"], ["list"], ["push", "127.0.0.1:1/x", "--dest-tls-verify=false"],
                 ["push", "127.0.0.1:1/x", "--engine", "docker"],
                 ["load", "--engine", "docker", "--dry-run"],
                 ["load", "--engine", "containerd", "--dry-run"],
                 ["extract", str(tmp_path / "out")]):
        proc = run([str(damaged), *args])
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert "payload checksum mismatch" in proc.stderr, args
        assert proc.stdout == "", args
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(
    "args,needle",
    [
        (["push"], "give the destination"),
        (["push", "onlydomain"], "DOMAIN/PROJECT"),
        (["push", "r.local/p", "--dest-tls-verify=maybe"], "must be true or false"),
        (["push", "r.local/p", "--bogus"], "unknown option --bogus"),
        (["load", "--engine", "rkt"], "containerd, docker or podman"),
        (["frobnicate"], "unknown command"),
    ],
)
def test_run_rejects_bad_usage(package: Path, args: list[str], needle: str) -> None:
    proc = run([str(package / "x" / BASE / RUN), *args])
    assert proc.returncode != 0
    assert needle in proc.stderr


def test_run_push_to_a_real_registry(package: Path, registry: str, images_list: Path) -> None:
    dest = f"{registry}/metax"
    proc = ok([str(package / "x" / FULL / RUN), "push", dest, "--dest-tls-verify=false"])
    assert f"pushed {len(ALL_IMAGES)} images to {dest}" in proc.stderr
    archives = _archives(images_list)
    for name in ALL_IMAGES:
        raw = ok(
            [
                "skopeo",
                "inspect",
                "--raw",
                "--tls-verify=false",
                f"docker://{dest}/{name}:{VERSION}",
            ]
        ).stdout
        pushed = json.loads(raw)
        original = _archive_manifest(archives[name])
        # same content: the registry holds exactly the layers and config that were packaged
        assert [layer["digest"] for layer in pushed["layers"]] == [
            layer["digest"] for layer in original["layers"]
        ], name
        assert pushed["config"]["digest"] == original["config"]["digest"], name
    # the base package pushes only the extension images
    ok([str(package / "x" / BASE / RUN), "push", f"{registry}/base", "--dest-tls-verify=false"])
    with urllib.request.urlopen(f"http://{registry}/v2/_catalog") as resp:
        catalog = json.load(resp)["repositories"]
    assert sorted(r for r in catalog if r.startswith("base/")) == sorted(
        f"base/{n}" for n in EXT_IMAGES
    )


def test_push_needs_tls_off_for_a_plain_http_registry(package: Path, registry: str) -> None:
    proc = run([str(package / "x" / BASE / RUN), "push", f"{registry}/tls"])
    assert proc.returncode != 0
    assert "--dest-tls-verify=false" in proc.stderr  # the hint names the flag


def test_helm_push_both_charts_and_install_from_the_registry(
    package: Path, registry: str, tmp_path: Path, helm_binary: str
) -> None:
    helm = helm_binary
    env = {
        **os.environ,
        "HELM_REGISTRY_CONFIG": str(tmp_path / "registry.json"),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
    }
    project = f"{registry}/metax"
    # images first (the chart rendered below must find them)
    ok([str(package / "x" / FULL / RUN), "push", project, "--dest-tls-verify=false"])
    for chart in ("metax-gpu-extensions", "metax-operator"):
        proc = ok(
            [
                helm,
                "push",
                str(package / "x" / FULL / f"{chart}-{VERSION}.tgz"),
                f"oci://{project}",
                "--plain-http",
            ],
            env=env,
        )
        assert f"{project}/{chart}:{VERSION}" in proc.stdout + proc.stderr
        shown = ok(
            [
                helm,
                "show",
                "chart",
                f"oci://{project}/{chart}",
                "--version",
                VERSION,
                "--plain-http",
            ],
            env=env,
        ).stdout
        assert yaml.safe_load(shown)["appVersion"] == VERSION
    # install-equivalent render from the registry: every image it names is in the registry
    rendered = ok(
        [
            helm,
            "template",
            "rel",
            f"oci://{project}/metax-operator",
            "--version",
            VERSION,
            "--plain-http",
            "-n",
            "metax-operator",
            "--set",
            f"registry={project}",
            "--set",
            "driver.payload.version=2.0.0",
            "--set",
            "deployExtenderGPUAware=true",
            "--set",  # no cluster to find kube-scheduler's host in: name one
            "gpuAware.networkPolicy.controlPlaneCIDRs={192.0.2.10/32}",
            "--set",
            "gpuDra.enabled=true",  # every image the package carries is rendered
        ],
        env=env,
    ).stdout
    images = set()
    for doc in yaml.safe_load_all(rendered):
        if doc and doc["kind"] in ("DaemonSet", "Deployment", "Pod"):
            spec = doc["spec"]["template"]["spec"] if doc["kind"] != "Pod" else doc["spec"]
            images |= {c["image"] for c in spec["containers"]}
    # the driver payload is the vendor's image (SPEC §5 driver.payload), not the package's
    payload = f"{project}/driver-image:2.0.0"
    assert payload in images
    images.discard(payload)
    assert images == {f"{project}/{n}:{VERSION}" for n in ALL_IMAGES}
    for image in sorted(images):
        ok(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{image}"])


def _containerd_ready() -> str | None:
    if not shutil.which("ctr"):
        return "ctr not installed"
    if not Path("/run/containerd/containerd.sock").exists():
        return "containerd is not running (/run/containerd/containerd.sock)"
    if os.geteuid() != 0:
        return "ctr needs root"
    return None


def _drop_namespace(ns: str) -> None:
    images = run(["ctr", "-n", ns, "images", "ls", "-q"]).stdout.split()
    if images:
        run(["ctr", "-n", ns, "images", "rm", *images])
    for _ in range(8):  # snapshots go child first
        keys = [
            line.split()[0]
            for line in run(["ctr", "-n", ns, "snapshots", "ls"]).stdout.splitlines()[1:]
        ]
        if not keys:
            break
        for key in keys:
            run(["ctr", "-n", ns, "snapshots", "rm", key])
    blobs = run(["ctr", "-n", ns, "content", "ls", "-q"]).stdout.split()
    if blobs:
        run(["ctr", "-n", ns, "content", "rm", *blobs])
    run(["ctr", "namespaces", "rm", ns])


def test_run_load_into_containerd(package: Path) -> None:
    reason = _containerd_ready()
    if reason:
        pytest.skip(reason)
    ns = f"gpuk8s-pkgtest-{uuid.uuid4().hex[:8]}"  # never the kubelet's k8s.io
    try:
        ok([str(package / "x" / BASE / RUN), "load", "--engine", "containerd", "--namespace", ns])
        names = sorted(run(["ctr", "-n", ns, "images", "ls", "-q"]).stdout.split())
        # exactly the references the chart uses by default, nothing else
        assert names == sorted(f"cr.metax-tech.com/cloud/{n}:{VERSION}" for n in EXT_IMAGES)
        ok(
            [
                str(package / "x" / BASE / RUN),
                "load",
                "reg.local/p/",
                "--engine",
                "containerd",
                "--namespace",
                ns,
            ]
        )
        names = set(run(["ctr", "-n", ns, "images", "ls", "-q"]).stdout.split())
        assert {f"reg.local/p/{n}:{VERSION}" for n in EXT_IMAGES} <= names
    finally:
        _drop_namespace(ns)


def test_load_dry_run_for_docker_and_podman(package: Path) -> None:
    """docker and podman load the payload itself (a docker archive too): one load, then a
    tag per image when the registry is not the charts' default; no skopeo."""
    for engine in ("docker", "podman"):
        proc = ok([str(package / "x" / BASE / RUN), "load", "--engine", engine, "--dry-run"])
        assert proc.stdout == f"+ {engine} load\n"
        proc = ok([str(package / "x" / BASE / RUN), "load", "reg.local/p", "--engine", engine,
                   "--dry-run"])
        assert proc.stdout.splitlines() == [f"+ {engine} load"] + [
            f"+ {engine} tag cr.metax-tech.com/cloud/{n}:{VERSION} reg.local/p/{n}:{VERSION}"
            for n in EXT_IMAGES]


# -- package/build.sh refuses bad input ------------------------------------------------------
def _write_list(tmp_path: Path, entries: dict[str, str]) -> Path:
    lst = tmp_path / "images.txt"
    lst.write_text("".join(f"{archive} {ref}\n" for ref, archive in entries.items()))
    return lst


def test_build_rejects_wrong_tags_missing_images_and_bad_versions(
    images_list: Path, tmp_path: Path, helm_binary: str
) -> None:
    need("skopeo", "apt-get install skopeo")
    build = str(REPO / "package" / "build.sh")
    env = {**os.environ, "HELM": helm_binary}
    archives = _archives(images_list)
    proc = run([build, "1.2.x", "--images", str(images_list), "--out", str(tmp_path)], env=env)
    assert proc.returncode != 0 and "SemVer" in proc.stderr
    proc = run([build, "9.9.9", "--images", str(images_list), "--out", str(tmp_path)], env=env)
    assert proc.returncode != 0 and f"tagged {VERSION}" in proc.stderr and ":9.9.9" in proc.stderr
    partial = _write_list(tmp_path, {f"x/{n}:{VERSION}": str(archives[n]) for n in EXT_IMAGES})
    proc = run([build, VERSION, "--images", str(partial), "--out", str(tmp_path)], env=env)
    assert proc.returncode != 0
    assert (
        "no image archive for: driver-manager container-runtime operator-controller" in proc.stderr
    )
    assert not list(tmp_path.glob("*.tar.gz"))


def test_packaging_is_reproducible(images_list: Path, tmp_path: Path, helm_binary: str) -> None:
    need("skopeo", "apt-get install skopeo")
    env = {**os.environ, "HELM": helm_binary, "SOURCE_DATE_EPOCH": "1700000000"}
    digests = []
    for i in range(2):
        out = tmp_path / str(i)
        ok(
            [
                str(REPO / "package" / "build.sh"),
                VERSION,
                "--images",
                str(images_list),
                "--out",
                str(out),
            ],
            env=env,
        )
        digests.append(hashlib.sha256((out / f"{BASE}.tar.gz").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_run_extract(package: Path, tmp_path: Path) -> None:
    ok([str(package / "x" / BASE / RUN), "extract", str(tmp_path / "out")])
    listing = (tmp_path / "out" / "images.txt").read_text().splitlines()
    assert listing == [f"{n} {VERSION}" for n in EXT_IMAGES]
    layout = tmp_path / "out" / "oci"
    assert json.loads((layout / "oci-layout").read_text())["imageLayoutVersion"] == "1.0.0"
    index = json.loads((layout / "index.json").read_text())
    # one layout, one manifest per image, named only NAME:VERSION (not the builder's registry)
    names = [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]
    assert sorted(names) == sorted(f"{n}:{VERSION}" for n in EXT_IMAGES)
    assert not any("io.containerd.image.name" in m["annotations"] for m in index["manifests"])
    # every blob is there, and blobs the images share are stored once
    wanted = set()
    for m in index["manifests"]:
        manifest = json.loads((layout / "blobs" / "sha256" / m["digest"].split(":")[1]).read_text())
        wanted |= {manifest["config"]["digest"]} | {la["digest"] for la in manifest["layers"]}
    present = {f"sha256:{p.name}" for p in (layout / "blobs" / "sha256").iterdir()}
    assert wanted <= present
    for digest in wanted:
        blob = (layout / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == digest.split(":")[1]


def test_push_passes_credentials_to_skopeo(package: Path, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text("{}")
    proc = ok(
        [
            str(package / "x" / BASE / RUN),
            "push",
            "r.local/p/",
            "--creds",
            "u:secret",
            "--authfile",
            str(auth),
            "--dry-run",
        ]
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("+ skopeo copy")]
    assert len(lines) == len(EXT_IMAGES)
    for line, name in zip(lines, EXT_IMAGES, strict=True):
        assert "--dest-creds u:secret" in line and f"--dest-authfile {auth}" in line
        assert "--dest-tls-verify=true" in line  # TLS verified unless asked otherwise
        assert line.endswith(f"docker://r.local/p/{name}:{VERSION}")


def test_push_with_docker_dry_run_and_refusals(package: Path, tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}  # no daemon asked
    proc = ok([str(package / "x" / BASE / RUN), "push", "r.local/p/", "--engine", "docker",
               "--dry-run"], env=env)
    assert proc.stdout.splitlines() == ["+ docker load"] + [
        line for n in EXT_IMAGES for line in (
            f"+ docker tag cr.metax-tech.com/cloud/{n}:{VERSION} r.local/p/{n}:{VERSION}",
            f"+ docker push --quiet r.local/p/{n}:{VERSION}")]
    # skopeo's credentials options are refused with docker, which has its own login
    proc = run([str(package / "x" / BASE / RUN), "push", "r.local/p", "--engine", "docker",
                "--creds", "u:p"], env=env)
    assert proc.returncode == 2 and "docker login r.local" in proc.stderr
    proc = run([str(package / "x" / BASE / RUN), "push", "r.local/p", "--engine", "rkt"])
    assert proc.returncode == 2 and "skopeo or docker" in proc.stderr
    proc = run([str(package / "x" / BASE / RUN), "load", str(tmp_path / "missing.xz")])
    assert proc.returncode == 1 and "missing.xz: no such file" in proc.stderr


# -- the gpu_artifacts_images role, fed by the offline package's .run ----------------------------
def _role(tmp_path: Path, variables: dict[str, Any],
          environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """playbooks-like run of the gpu_artifacts_images role on localhost."""
    import sys

    play = [{"name": "Images", "hosts": "all", "gather_facts": False,
             "environment": environment or {},
             "roles": [{"role": "gpu_artifacts_images"}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    bin_dir = Path(sys.executable).parent
    return run(
        [str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(variables),
         str(tmp_path / "play.yml")],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )


def _recap(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    return proc.stdout.split("PLAY RECAP", 1)[1]


def test_role_pushes_the_run_of_the_offline_package(
    package: Path, registry: str, tmp_path: Path
) -> None:
    """images.txt inside the .run is "NAME TAG" with an OCI layout, not "ARCHIVE REF"."""
    variables = {"gpu_artifacts_images_mode": "push",
                 "gpu_artifacts_images_run": str(package / "x" / BASE / RUN),
                 "gpu_artifacts_images_registry": f"{registry}/role",
                 "gpu_artifacts_images_tls_verify": False}
    assert "changed=0" not in _recap(_role(tmp_path, variables))
    for name in EXT_IMAGES:
        ok(["skopeo", "inspect", "--raw", "--tls-verify=false",
            f"docker://{registry}/role/{name}:{VERSION}"])
    assert "changed=0" in _recap(_role(tmp_path, variables))  # every tag is there already


def test_role_loads_the_run_into_containerd_under_the_charts_reference(
    package: Path, tmp_path: Path
) -> None:
    reason = _containerd_ready()
    if reason:
        pytest.skip(reason)
    ns = f"gpuk8s-roletest-{uuid.uuid4().hex[:8]}"  # never the kubelet's k8s.io
    variables = {"gpu_artifacts_images_mode": "load",
                 "gpu_artifacts_images_run": str(package / "x" / BASE / RUN),
                 "gpu_artifacts_images_engine": "containerd",
                 "gpu_artifacts_images_containerd_namespace": ns,
                 "gpu_artifacts_images_load_registry": "reg.example/cloud",
                 "gpu_artifacts_images_remote_dir": str(tmp_path / "staging")}
    try:
        _recap(_role(tmp_path, variables))
        names = sorted(run(["ctr", "-n", ns, "images", "ls", "-q"]).stdout.split())
        # exactly the references the chart uses with registry=reg.example/cloud
        assert names == sorted(f"reg.example/cloud/{n}:{VERSION}" for n in EXT_IMAGES)
        assert "changed=0" in _recap(_role(tmp_path, variables))
        assert not (tmp_path / "staging").exists()
    finally:
        _drop_namespace(ns)


@pytest.fixture
def dockerd() -> Iterator[dict[str, str]]:
    """A private Debian dockerd (20.10: cannot `docker load` an OCI archive) on a private
    containerd, no bridge, no iptables (tests/dockerd.py): DOCKER_HOST, DOCKER_CONFIG and
    CONTAINERD_ADDRESS (its containerd, which has docker's namespace only)."""
    with private_dockerd_for_test() as daemon:
        env = {k: daemon.env[k] for k in ("DOCKER_HOST", "DOCKER_CONFIG")}
        env["CONTAINERD_ADDRESS"] = str(daemon.base / "containerd/containerd.sock")
        yield env


def test_role_loads_into_docker_through_a_docker_archive(
    package: Path, tmp_path: Path, dockerd: dict[str, str], images_list: Path
) -> None:
    env = {**os.environ, **dockerd}
    # what the role did before: `docker load` of an OCI archive, refused by this docker
    archive = _archives(images_list)["gpu-device"]
    assert run([DOCKER, "load", "-i", str(archive)], env=env).returncode != 0
    variables = {"gpu_artifacts_images_mode": "load",
                 "gpu_artifacts_images_run": str(package / "x" / BASE / RUN),
                 "gpu_artifacts_images_remote_dir": str(tmp_path / "staging")}
    # engine auto: the containerd there has no k8s.io, so docker is the target (the .run's
    # `load` decides the same way: one script, files/detect-engine.sh)
    _recap(_role(tmp_path, variables, environment=dockerd))
    listed = run([DOCKER, "images", "--format", "{{.Repository}}:{{.Tag}}"], env=env).stdout
    # no registry given: the charts' default one
    assert sorted(listed.split()) == sorted(
        f"cr.metax-tech.com/cloud/{n}:{VERSION}" for n in EXT_IMAGES
    )
    assert "changed=0" in _recap(_role(tmp_path, variables, environment=dockerd))


# -- docker alone: the manual's `docker login` + `.run push`, `.run load`, MXMACA .xz images -----
@pytest.fixture(scope="module")
def docker_only_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH with every program of this machine's PATH but skopeo and ctr, and with
    Debian's docker client: what the manual assumes a node has."""
    bin_dir = tmp_path_factory.mktemp("docker-only-bin")
    for directory in os.environ["PATH"].split(":"):
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            target = os.path.join(directory, name)
            link = bin_dir / name
            if name in ("skopeo", "ctr") or link.exists() or not os.access(target, os.X_OK):
                continue
            link.symlink_to(target)
    (bin_dir / "docker").unlink(missing_ok=True)
    (bin_dir / "docker").symlink_to(DOCKER)
    return str(bin_dir)


def _config_digests(images_list: Path) -> dict[str, str]:
    return {n: _archive_manifest(a)["config"]["digest"] for n, a in _archives(images_list).items()}


def test_run_load_with_docker_alone(
    package: Path, images_list: Path, docker_only_path: str
) -> None:
    """The manual's `./k8s/metax-k8s-images.<V>.run load` on a node with docker and no
    skopeo (nor ctr): the payload is loaded as it is, under the charts' references."""
    with private_dockerd_for_test() as daemon:
        env = {**daemon.env, "PATH": docker_only_path}
        proc = ok([str(package / "x" / BASE / RUN), "load"], env=env)
        assert f"loaded {len(EXT_IMAGES)} images into docker" in proc.stderr
        listed = daemon.docker("images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}").stdout
        refs = dict(line.split() for line in listed.splitlines())
        configs = _config_digests(images_list)
        # exactly the references the charts use by default, the packaged images themselves
        assert sorted(refs) == sorted(f"cr.metax-tech.com/cloud/{n}:{VERSION}" for n in EXT_IMAGES)
        for name in EXT_IMAGES:
            image_id = daemon.docker("image", "inspect", "--format", "{{.Id}}",
                                     f"cr.metax-tech.com/cloud/{name}:{VERSION}").stdout.strip()
            assert image_id == configs[name], name
        # another registry: those references, the default ones already there stay
        ok([str(package / "x" / BASE / RUN), "load", "reg.local/p/"], env=env)
        listed = daemon.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        assert {f"reg.local/p/{n}:{VERSION}" for n in EXT_IMAGES} <= set(listed)
        assert len(listed) == 2 * len(EXT_IMAGES)


def test_load_picks_docker_over_a_containerd_without_the_kubelets_namespace(
    package: Path
) -> None:
    """On a docker host, containerd (docker's own, with its namespace moby) is no target for
    the manual's bare `load`: docker is. A containerd with the kubelet's k8s.io is."""
    with private_dockerd_for_test() as daemon:
        address = str(daemon.base / "containerd/containerd.sock")
        env = {**daemon.env, "CONTAINERD_ADDRESS": address}
        assert "k8s.io" not in run(["ctr", "namespaces", "ls", "-q"], env=env).stdout.split()
        proc = ok([str(package / "x" / BASE / RUN), "load", "--dry-run"], env=env)
        assert proc.stdout == "+ docker load\n"
        ok(["ctr", "namespaces", "create", "k8s.io"], env=env)
        proc = ok([str(package / "x" / BASE / RUN), "load", "--dry-run"], env=env)
        assert proc.stdout.startswith("+ tar ") and "+ ctr -n k8s.io images import" in proc.stdout


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """A docker-registry of our own with htpasswd authentication: (address, user, password)."""
    binary = need("docker-registry", "apt-get install docker-registry")
    root = tmp_path_factory.mktemp("auth-registry")
    ok(["htpasswd", "-Bbc", str(root / "htpasswd"), "pusher", "s3cret"])
    with _registry(binary, root, {"htpasswd": {"realm": "gpuk8s-test",
                                               "path": str(root / "htpasswd")}}) as address:
        yield address, "pusher", "s3cret"


def test_run_push_with_docker_alone_after_docker_login(
    package: Path, images_list: Path, docker_only_path: str, auth_registry: tuple[str, str, str]
) -> None:
    """The manual's `docker login DOMAIN -u $USER` then `.run push DOMAIN/PROJECT`, with
    docker and no skopeo: docker load, tag, push with docker's stored credentials."""
    address, user, password = auth_registry
    dest = f"{address}/metax"
    with private_dockerd_for_test() as daemon:
        env = {**daemon.env, "PATH": docker_only_path}
        proc = run([str(package / "x" / BASE / RUN), "push", dest], env=env)
        assert proc.returncode == 1 and f"docker login {address}" in proc.stderr, proc.stderr
        ok([DOCKER, "login", address, "-u", user, "--password-stdin"], env=env,
           input=password)
        proc = ok([str(package / "x" / BASE / RUN), "push", dest], env=env)
        assert f"pushed {len(EXT_IMAGES)} images to {dest}" in proc.stderr
        # what was loaded and tagged for the push is gone again
        assert daemon.docker("images", "-q").stdout.split() == []
    configs = _config_digests(images_list)
    for name in EXT_IMAGES:
        raw = ok(["skopeo", "inspect", "--raw", "--tls-verify=false", "--creds",
                  f"{user}:{password}", f"docker://{dest}/{name}:{VERSION}"]).stdout
        # the image pushed is the packaged one (same config, so the same image id)
        assert json.loads(raw)["config"]["digest"] == configs[name], name


MACA_IMAGES = {  # archive name as the SDK release ships it -> the reference inside it
    "maca-c500-container-2.23.0.4-ubuntu18.04-amd64.xz":
        "cr.metax-tech.com/library/maca-c500:2.23.0.4-ubuntu18.04-amd64",
    "mxc500-maca-2.23.0.4-ubuntu20.04-amd64.container.xz":
        "mxc500-maca:2.23.0.4-ubuntu20.04-amd64",
}


@pytest.fixture(scope="module")
def maca_archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """MXMACA-like images (a busybox root file system) saved by docker and xz-compressed,
    as `docker load < ARCHIVE.xz` takes them."""
    out = tmp_path_factory.mktemp("maca")
    archives = {}
    with private_dockerd_for_test() as daemon:
        for i, (name, ref) in enumerate(MACA_IMAGES.items()):
            version = f"maca:{i}\n".encode()
            daemon.import_image(ref, busybox_rootfs({"opt/maca/Version.txt": version}))
            saved = subprocess.run([DOCKER, "save", ref], env=daemon.env, capture_output=True,
                                   check=True).stdout
            (out / name).write_bytes(lzma.compress(saved))
            archives[name] = out / name
    return archives


def test_run_loads_mxmaca_archives_as_docker_load_would(
    package: Path, docker_only_path: str, maca_archives: dict[str, Path]
) -> None:
    with private_dockerd_for_test() as daemon:
        env = {**daemon.env, "PATH": docker_only_path}
        ok([str(package / "x" / BASE / RUN), "load", *map(str, maca_archives.values())], env=env)
        listed = set(daemon.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split())
        for i, ref in enumerate(MACA_IMAGES.values()):
            # the archive's own name, as `docker load <` gives it, and the charts' one
            short = ref.rsplit("/", 1)[-1]
            assert {ref, f"cr.metax-tech.com/cloud/{short}"} <= listed
            got = daemon.docker("run", "--rm", "--network", "none", ref, "cat",
                                "/opt/maca/Version.txt")
            assert got.stdout == f"maca:{i}\n", got.stderr
        assert {f"cr.metax-tech.com/cloud/{n}:{VERSION}" for n in EXT_IMAGES} <= listed


def test_run_loads_mxmaca_archives_into_containerd(
    package: Path, maca_archives: dict[str, Path]
) -> None:
    with private_dockerd_for_test() as daemon:  # its containerd, never the lab's
        env = {**os.environ, "CONTAINERD_ADDRESS": str(daemon.base / "containerd/containerd.sock")}
        archive = maca_archives["maca-c500-container-2.23.0.4-ubuntu18.04-amd64.xz"]
        ok([str(package / "x" / BASE / RUN), "load", "reg.local/p", str(archive),
            "--namespace", "md-test"], env=env)
        names = set(run(["ctr", "-n", "md-test", "images", "ls", "-q"], env=env).stdout.split())
        assert {"cr.metax-tech.com/library/maca-c500:2.23.0.4-ubuntu18.04-amd64",
                "reg.local/p/maca-c500:2.23.0.4-ubuntu18.04-amd64"} <= names
        assert {f"reg.local/p/{n}:{VERSION}" for n in EXT_IMAGES} <= names


@pytest.mark.parametrize("engine", ["docker", "skopeo"])
def test_run_pushes_mxmaca_archives(
    package: Path, docker_only_path: str, maca_archives: dict[str, Path], registry: str,
    engine: str,
) -> None:
    dest = f"{registry}/{engine}"
    with private_dockerd_for_test() as daemon:
        env = {**daemon.env, "PATH": docker_only_path if engine == "docker"
               else os.environ["PATH"]}
        proc = ok([str(package / "x" / BASE / RUN), "push", dest, "--engine", engine,
                   "--dest-tls-verify=false", *map(str, maca_archives.values())], env=env)
        assert f"pushed {len(EXT_IMAGES) + len(MACA_IMAGES)} images to {dest}" in proc.stderr
    for ref in MACA_IMAGES.values():
        short = ref.rsplit("/", 1)[-1]
        ok(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{dest}/{short}"])
