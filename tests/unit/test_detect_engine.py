"""roles/gpu_artifacts_images/files/detect-engine.sh: the one container-engine detection,
run by the role and inlined into the images .run (package/build.sh). Fake ctr, docker and
podman on a PATH of their own; a real unix socket as containerd's address."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/gpu_artifacts_images/files/detect-engine.sh"


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "containerd.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    yield path
    server.close()


def detect(tmp_path: Path, address: str, *, namespaces: str | None = None,
           docker: bool | None = None, podman: bool = False) -> subprocess.CompletedProcess[str]:
    """The script with only the programs named: ctr listing ``namespaces`` (None: no ctr),
    docker whose daemon answers (``docker``) or not (False; None: no docker)."""
    bin_dir = tmp_path / "bin"
    shutil.rmtree(bin_dir, ignore_errors=True)
    bin_dir.mkdir()
    for tool in ("grep", "bash", "env"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    fakes = {}
    if namespaces is not None:
        fakes["ctr"] = f'[ "$*" = "namespaces ls -q" ] && printf "{namespaces}"'
    if docker is not None:
        fakes["docker"] = f'[ "$1" = info ] && exit {0 if docker else 1}'
    if podman:
        fakes["podman"] = "exit 0"
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": str(bin_dir), "CONTAINERD_ADDRESS": address}
    return subprocess.run([shutil.which("bash") or "bash", str(SCRIPT)], env=env,
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    ("namespaces", "docker", "podman", "engine"),
    [
        ("moby\\nk8s.io\\n", True, True, "containerd"),  # the kubelet's namespace wins
        ("moby\\n", True, False, "docker"),  # docker's own containerd: not the kubelet's
        ("moby\\n", False, True, "containerd"),  # docker installed but not running
        (None, None, True, "podman"),
    ],
)
def test_the_engine_the_kubelet_sees(tmp_path: Path, sock: str, namespaces: str | None,
                                     docker: bool | None, podman: bool, engine: str) -> None:
    done = detect(tmp_path, sock, namespaces=namespaces, docker=docker, podman=podman)
    assert (done.returncode, done.stdout) == (0, engine + "\n"), done.stderr


def test_no_engine_is_an_exit_status_and_no_output(tmp_path: Path, sock: str) -> None:
    # ctr without a containerd socket is no engine either
    done = detect(tmp_path, str(tmp_path / "absent.sock"), namespaces="k8s.io\\n", docker=False)
    assert (done.returncode, done.stdout) == (1, "")


def test_the_run_template_takes_the_function_from_the_script() -> None:
    """images.run.in holds only the marker; the function lives once, in the script."""
    template = (SCRIPT.parents[3] / "package/images.run.in").read_text()
    assert "\n@DETECT_ENGINE@\n" in template and "detect_engine() {" not in template
    text = SCRIPT.read_text()
    assert text.count("# >>> detect_engine\n") == 1 and text.count("# <<< detect_engine\n") == 1
    assert os.access(SCRIPT, os.X_OK)
