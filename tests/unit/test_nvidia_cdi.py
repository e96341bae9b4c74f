"""NVIDIA containers get CUDA (issue 28 item 6): the driver's user space found on a
simulated node laid out like a real ``.run --dkms`` install, the way ``nvidia-ctk cdi
generate`` finds it; the CDI spec that carries it (named for its kind); the hooks that
make the libraries found; the real ``readelf`` / ``ldconfig`` as judges of the simulated
libraries and of our readers."""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.cdi import (
    DRIVER_MOUNT_OPTIONS,
    CdiError,
    ContainerEdits,
    Hook,
    apply_to_oci,
    driver_edits,
    parse_spec,
)
from gpuk8s.discovery import libraries, nvidia
from gpuk8s.host import cdihook
from gpuk8s.services.runtime.agent import RuntimeAgent, RuntimeSettings
from gpuk8s.sim.nvml import compiler

pytestmark = pytest.mark.usefixtures("fast_python3")

VERSION = "550.54.15"
LIB = "/usr/lib/x86_64-linux-gnu"
LIBS = ("libcuda", "libcudadebugger", "libnvcuvid", "libnvidia-allocator", "libnvidia-cfg",
        "libnvidia-encode", "libnvidia-gpucomp", "libnvidia-ml", "libnvidia-nvvm",
        "libnvidia-opencl", "libnvidia-ptxjitcompiler")


class Reports:
    def publish(self, report: object) -> None:
        pass


def agent(root: str, system: Path, **kw: object) -> RuntimeAgent:
    settings = RuntimeSettings(host_root=root, system_root=str(system), runtime="cdi",
                               device_path_prefix=root, **kw)  # type: ignore[arg-type]
    return RuntimeAgent(settings, Reports())  # type: ignore[arg-type]


def test_driver_files_are_found_as_nvidia_ctk_finds_them(nvidia_sim_root: str) -> None:
    files = nvidia.driver_files(nvidia_sim_root, VERSION)
    assert files.problems == ()
    assert files.libraries == tuple(f"{LIB}/{name}.so.{VERSION}" for name in LIBS)
    assert files.library_dirs == (LIB,)
    assert (f"libcuda.so.{VERSION}", f"{LIB}/libcuda.so.1") in files.links
    assert ("libcuda.so.1", f"{LIB}/libcuda.so") in files.links
    assert (f"libnvidia-nvvm.so.{VERSION}", f"{LIB}/libnvidia-nvvm.so.4") in files.links
    # libnvidia-gpucomp's soname is its versioned name: no link for it
    assert not any("gpucomp" in link for _, link in files.links)
    assert files.binaries == ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump",
                              "/usr/bin/nvidia-persistenced", "/usr/bin/nvidia-cuda-mps-control",
                              "/usr/bin/nvidia-cuda-mps-server")
    assert files.firmware == (f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
                              f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin")
    assert files.ipc == ("/run/nvidia-persistenced/socket",)
    assert files.toolkit_hook is None


def test_another_driver_version_finds_nothing(nvidia_sim_root: str) -> None:
    files = nvidia.driver_files(nvidia_sim_root, "535.183.01")
    assert files.libraries == () and files.problems
    assert "libcuda.so.535.183.01" in files.problems[0]


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils: scripts/prereqs unit")
def test_the_simulated_libraries_are_real_shared_objects(nvidia_sim_root: str) -> None:
    """readelf and our reader agree on every library's soname; dlopen loads them."""
    import ctypes

    for name in LIBS:
        path = f"{nvidia_sim_root}{LIB}/{name}.so.{VERSION}"
        out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                             check=True).stdout
        soname = libraries.elf_soname(path)
        assert f"Library soname: [{soname}]" in out
        ctypes.CDLL(path)
    assert libraries.elf_soname(f"{nvidia_sim_root}/etc/os-release") is None


def test_a_library_dir_named_only_by_the_ld_cache_is_found(tmp_path: Path) -> None:
    """A driver installed outside the usual directories, registered in ld.so.cache by the
    real ldconfig: found through the cache, as nvidia-ctk's locator does."""
    root = str(tmp_path / "node")
    sim.create(root, "nvidia-8")
    moved = Path(root) / "opt/nvidia/lib"
    moved.mkdir(parents=True)
    for entry in sorted(Path(root, LIB.lstrip("/")).iterdir()):
        if "nvidia" in entry.name or "cuda" in entry.name or "nvcuvid" in entry.name:
            shutil.move(str(entry), moved / entry.name)
    assert nvidia.driver_files(root, VERSION).libraries == ()
    (Path(root) / "etc/ld.so.conf").write_text("/opt/nvidia/lib\n")
    subprocess.run(["ldconfig", "-r", root], check=True, capture_output=True)
    assert ("libcuda.so.1", "/opt/nvidia/lib/libcuda.so.1") in libraries.ldcache_entries(
        f"{root}/etc/ld.so.cache")
    files = nvidia.driver_files(root, VERSION)
    assert files.library_dirs == ("/opt/nvidia/lib",)
    assert f"/opt/nvidia/lib/libcuda.so.{VERSION}" in files.libraries


def test_the_drivers_own_programs_are_bound_not_the_wrapper_scripts_on_path(
        tmp_path: Path) -> None:
    """The layout of the GPU machine this was checked on (driver 580.159.04): the driver in
    /usr/local/nvidia/{lib64,bin}, and /usr/bin/nvidia-smi a shell script that execs the
    real one. Bound alone, the script failed in the container ("/usr/local/nvidia/bin/
    nvidia-smi: not found"); the spec now binds the driver's ELF program."""
    root = str(tmp_path / "node")
    sim.create(root, "nvidia-8")
    driver = Path(root) / "usr/local/nvidia"
    (driver / "lib64").mkdir(parents=True)
    (driver / "bin").mkdir()
    for entry in sorted(Path(root, LIB.lstrip("/")).iterdir()):
        if "nvidia" in entry.name or "cuda" in entry.name or "nvcuvid" in entry.name:
            shutil.move(str(entry), driver / "lib64" / entry.name)
    for name in ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control"):
        shutil.copy("/bin/true", driver / "bin" / name)  # an ELF executable
        wrapper = Path(root) / "usr/bin" / name
        wrapper.write_text(f'#!/bin/sh\nexec /usr/local/nvidia/bin/{name} "$@"\n')
        wrapper.chmod(0o755)
    files = nvidia.driver_files(root, VERSION)
    assert files.library_dirs == ("/usr/local/nvidia/lib64",)
    assert "/usr/local/nvidia/bin/nvidia-smi" in files.binaries
    assert "/usr/local/nvidia/bin/nvidia-cuda-mps-control" in files.binaries
    assert "/usr/bin/nvidia-smi" not in files.binaries
    # a program that exists only as a script (the simulator's) is still bound
    assert "/usr/bin/nvidia-persistenced" in files.binaries
    # the driver's programs are also bound on the default PATH: a plain image (not a CUDA
    # one, whose PATH has /usr/local/nvidia/bin) finds nvidia-smi too
    mounts = {(m.host_path, m.container_path) for m in driver_edits(files, "/hook").mounts}
    assert ("/usr/local/nvidia/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi") in mounts
    assert ("/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi") in mounts
    assert ("/usr/bin/nvidia-persistenced", "/usr/bin/nvidia-persistenced") in mounts
    assert len([m for m in mounts if m[1] == "/usr/bin/nvidia-persistenced"]) == 1


def test_driver_edits_mount_read_only_and_hook_with_the_toolkit_arguments(
    nvidia_sim_root: str,
) -> None:
    files = nvidia.driver_files(nvidia_sim_root, VERSION)
    edits = driver_edits(files, "/usr/local/gpuk8s/bin/gpuk8s-oci-runtime", "/sim")
    lib = next(m for m in edits.mounts if m.container_path == f"{LIB}/libcuda.so.{VERSION}")
    assert lib.host_path == f"/sim{LIB}/libcuda.so.{VERSION}"
    assert lib.options == DRIVER_MOUNT_OPTIONS
    ipc = next(m for m in edits.mounts if m.container_path.endswith("persistenced/socket"))
    assert not ipc.read_only and "noexec" in ipc.options
    links, compat, ldcache = edits.hooks
    assert links.hook_name == compat.hook_name == ldcache.hook_name == "createContainer"
    assert links.args[:3] == ("gpuk8s-oci-runtime", "hook", "create-symlinks")
    assert f"libcuda.so.{VERSION}::{LIB}/libcuda.so.1" in links.args
    # forward compatibility before the cache is built, as nvidia-ctk orders them
    assert compat.args == ("gpuk8s-oci-runtime", "hook", "enable-cuda-compat",
                           "--host-driver-version", VERSION)
    assert ldcache.args == ("gpuk8s-oci-runtime", "hook", "update-ldcache", "--folder", LIB)
    # the toolkit's own hook program takes the same arguments after its name; no
    # enable-cuda-compat for it (nvidia-cdi-hook before v1.18 has no such command)
    toolkit = driver_edits(files, "/usr/bin/nvidia-cdi-hook").hooks
    assert [h.args[1] for h in toolkit] == ["create-symlinks", "update-ldcache"]
    assert toolkit[1].args == ("nvidia-cdi-hook", "update-ldcache", "--folder", LIB)


def test_the_nvidia_spec_is_named_for_its_kind_and_carries_the_driver(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "nvidia-8")
    system = tmp_path / "system"
    system.mkdir()
    runtime = agent(root, system)
    runtime.write_spec()
    path = system / "etc/cdi/nvidia.com-gpu.json"
    assert not (system / "etc/cdi/metax-tech.com-gpu.json").exists()
    spec = json.loads(path.read_text())
    assert spec["kind"] == "nvidia.com/gpu"
    common = parse_spec(spec).edits
    mounted = {m.container_path for m in common.mounts}
    assert {f"{LIB}/libcuda.so.{VERSION}", f"{LIB}/libnvidia-ml.so.{VERSION}",
            f"{LIB}/libnvidia-ptxjitcompiler.so.{VERSION}", "/usr/bin/nvidia-smi",
            f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"} <= mounted
    assert {n.path for n in common.device_nodes} == {
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
    # the hooks run the wrapper, which the agent installed even though the runtime has CDI
    assert {h.path for h in common.hooks} == {"/usr/local/gpuk8s/bin/gpuk8s-oci-runtime"}
    assert os.access(system / "usr/local/gpuk8s/bin/gpuk8s-oci-runtime", os.X_OK)
    assert "CDI spec removed" in runtime.uninstall() and not path.exists()


def test_the_toolkits_hook_program_is_used_where_it_is_installed(tmp_path: Path) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "nvidia-8")
    hook = Path(root) / "usr/bin/nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    system = tmp_path / "system"
    system.mkdir()
    runtime = agent(root, system)
    runtime.write_spec()
    spec = json.loads((system / "etc/cdi/nvidia.com-gpu.json").read_text())
    assert {h["path"] for h in spec["containerEdits"]["hooks"]} == {"/usr/bin/nvidia-cdi-hook"}
    assert not (system / "usr/local/gpuk8s").exists()


def test_metax_nodes_keep_their_spec_file_and_get_no_hooks(tmp_path: Path) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    system = tmp_path / "system"
    system.mkdir()
    agent(root, system).write_spec()
    spec = json.loads((system / "etc/cdi/metax-tech.com-gpu.json").read_text())
    assert "hooks" not in spec.get("containerEdits", {})


def test_hooks_round_trip_and_reach_the_oci_spec() -> None:
    hook = Hook("createContainer", "/usr/bin/nvidia-cdi-hook",
                ("nvidia-cdi-hook", "update-ldcache", "--folder", LIB))
    spec = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": "0", "containerEdits": {}}],
            "containerEdits": {"hooks": [{"hookName": "createContainer", "path": hook.path,
                                          "args": list(hook.args)}]}}
    assert parse_spec(spec).edits.hooks == (hook,)
    config = apply_to_oci({}, ContainerEdits(hooks=(hook, hook)), lambda p: ("c", 0, 0))
    assert config["hooks"] == {"createContainer": [{"path": hook.path, "args": list(hook.args)}]}
    for bad, why in (({"hookName": "later", "path": "/x"}, "hookName"),
                     ({"hookName": "createContainer", "path": "x"}, "absolute"),
                     ({"hookName": "createContainer", "path": "/x", "args": [1]}, "strings"),
                     ({"hookName": "createContainer", "path": "/x", "when": {}}, "when")):
        spec["containerEdits"]["hooks"] = [bad]
        with pytest.raises(CdiError, match=why):
            parse_spec(spec)


def test_hook_arguments_parse_strictly() -> None:
    assert cdihook.parse(["create-symlinks", "--link", "a.so.1::/usr/lib/a.so",
                          "--link=b::/b"])[:3] == (
        "create-symlinks", [("a.so.1", "/usr/lib/a.so"), ("b", "/b")], [])
    assert cdihook.parse(["update-ldcache", "--folder", "/usr/lib", "--ldconfig-path",
                          "@/sbin/ldconfig"])[:3] == ("update-ldcache", [], ["/usr/lib"])
    compat = cdihook.parse(["enable-cuda-compat", "--host-driver-version=580.95.05",
                            "--host-cuda-version", "13.0", "--cuda-compat-container-root",
                            "/opt/cuda/compat"])
    assert (compat.command, compat.host_driver, compat.compat_dir, compat.host_cuda) == (
        "enable-cuda-compat", "580.95.05", "/opt/cuda/compat", "13.0")
    for bad in (["chmod"], ["create-symlinks", "--link", "nolink"],
                ["update-ldcache", "--folder", "relative"], ["create-symlinks", "--link"],
                ["create-symlinks", "--bogus", "x"],
                ["update-ldcache", "--host-driver-version", "580.95.05"],
                ["enable-cuda-compat", "--folder", "/usr/lib"],
                ["enable-cuda-compat", "--cuda-compat-container-root", "relative"]):
        with pytest.raises(cdihook.HookError):
            cdihook.parse(bad)


@pytest.mark.skipif(os.geteuid() != 0, reason="the hook chroots: root only")
def test_hooks_edit_the_container_root_and_nothing_outside_it(tmp_path: Path) -> None:
    """As runc runs them: OCI state on stdin, the bundle's root. A symlink the image plants
    (``/evil -> /outside``) is followed inside the container's root, never on the host."""
    rootfs = tmp_path / "bundle/rootfs"
    (rootfs / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    lib = rootfs / "usr/lib/x86_64-linux-gnu" / f"libcuda.so.{VERSION}"
    shutil.copy(f"{sim_root_lib(tmp_path)}/libcuda.so.{VERSION}", lib)
    outside = tmp_path / "outside"
    outside.mkdir()
    (rootfs / "evil").symlink_to(outside)  # absolute: the host's /tmp/... path
    (tmp_path / "bundle/config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c", "pid": os.getpid(),
                        "bundle": str(tmp_path / "bundle")})
    assert cdihook.main(["create-symlinks", "--link", f"libcuda.so.{VERSION}::{LIB}/libcuda.so.1",
                         "--link", f"x::{outside}/planted", "--link", "y::/evil/planted"],
                        stdin=state) == 0
    assert os.readlink(rootfs / LIB.lstrip("/") / "libcuda.so.1") == f"libcuda.so.{VERSION}"
    assert not (outside / "planted").exists() and not os.path.lexists(outside / "planted")
    assert cdihook.main(["update-ldcache", "--folder", LIB], stdin=state) == 0
    assert (rootfs / "etc/ld.so.conf.d/00-gpuk8s-nvidia.conf").read_text() == f"{LIB}\n"
    entries = libraries.ldcache_entries(str(rootfs / "etc/ld.so.cache"))
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in entries
    # the runtime wrapper's `hook` subcommand is this code
    proc = subprocess.run([sys.executable, "-c", "import sys; from gpuk8s.host.ociwrapper "
                           "import main; sys.exit(main(['hook', 'chmod']))"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "usage: hook" in proc.stderr


COMPAT = "/usr/local/cuda/compat"
NOTE_575 = '{"format":1,"CUDA version":"12.9","driver":[535,550,570,575],"device":[7,8,9]}'


def compat_library(path: Path, note: str | None = None) -> Path:
    """A shared object with the soname ``libcuda.so.1`` built by the C compiler at
    ``path`` and, with ``note``, the CUDA forward-compatibility ELF note added with the
    real ``objcopy`` (a section named ``.note.*`` becomes SHT_NOTE): owner ``NVIDIA
    Corporation``, type 0, the JSON NUL-terminated, as CUDA's compat libcuda carries it."""
    cc = compiler()
    if cc is None:
        pytest.fail("a C compiler is needed to build a libcuda.so.1 stand-in")
    source = path.with_name(path.name + ".c")
    source.write_text("int cuInit(unsigned int flags) { return (int)flags * 0; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(path),
                    str(source)], check=True, capture_output=True)
    source.unlink()
    if note is not None:
        owner, desc = b"NVIDIA Corporation\0", note.encode() + b"\0"
        blob = struct.pack("<III", len(owner), len(desc), 0) + owner
        blob += b"\0" * ((-len(blob)) % 4) + desc
        blob += b"\0" * ((-len(blob)) % 4)
        data = path.with_name(path.name + ".note")
        data.write_bytes(blob)
        subprocess.run(["objcopy", "--add-section", f".note.cuda.fwd_compatibility={data}",
                        "--set-section-flags", ".note.cuda.fwd_compatibility=alloc,readonly",
                        str(path)], check=True, capture_output=True)
        data.unlink()
    return path


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="binutils: scripts/prereqs unit")
def test_the_cuda_compat_note_reads_as_readelf_shows_it(tmp_path: Path) -> None:
    """``readelf -n`` as judge: the note our test writes is a well-formed ELF note, and
    ``compat_note`` reads back its JSON; a library without one has none; a note that is
    not JSON is an error the hook turns into the fallback."""
    plain = compat_library(tmp_path / "libcuda.so.580.95.05")
    assert cdihook.compat_note(str(plain)) is None
    lib = compat_library(tmp_path / "libcuda.so.575.57.08", NOTE_575)
    shown = subprocess.run(["readelf", "-n", "-W", str(lib)], capture_output=True, text=True,
                           check=True).stdout
    section = shown[shown.index(".note.cuda.fwd_compatibility"):]
    assert "NVIDIA Corporation" in section
    data = section.split("description data:", 1)[1].split("\n", 1)[0].split()
    assert bytes(int(b, 16) for b in data).rstrip(b"\0").decode() == NOTE_575
    assert cdihook.compat_note(str(lib)) == {
        "format": 1, "cuda version": "12.9", "driver": [535, 550, 570, 575], "device": [7, 8, 9]}
    bad = compat_library(tmp_path / "libcuda.so.99.88", '{"format":1,"CUDA version":12.9,')
    with pytest.raises(ValueError, match="not JSON"):
        cdihook.compat_note(str(bad))
    assert not cdihook.use_compat(str(bad), "550.54.15")  # not newer by major: no
    (tmp_path / "text").write_text("not ELF")
    with pytest.raises(ValueError, match="not an ELF file"):
        cdihook.compat_note(str(tmp_path / "text"))


@pytest.mark.skipif(os.geteuid() != 0, reason="the hook chroots: root only")
@pytest.mark.skipif(shutil.which("objcopy") is None, reason="binutils: scripts/prereqs unit")
@pytest.mark.parametrize(("host", "compat", "note", "first"), [
    ("550.54.15", ("575.57.08",), None, COMPAT),  # newer branch: compat first
    ("575.51.03", ("575.57.08",), None, LIB),  # same major: the driver's own library
    ("580.95.05", ("575.57.08",), None, LIB),  # the host's driver is newer
    ("550.54.15", ("575.57.08", "580.95.05"), None, LIB),  # two compat libraries: left alone
    ("550.54.15", (), None, LIB),  # an image without them
    # with the CUDA ELF note (toolkit v1.18's rules): the branches it lists decide
    ("550.54.15", ("575.57.08",), NOTE_575, COMPAT),  # a listed older branch
    ("560.35.03", ("575.57.08",), NOTE_575, LIB),  # an older branch the note leaves out
    ("575.51.03", ("575.57.08",), NOTE_575, COMPAT),  # the same branch, an older release
    ("575.64.05", ("575.57.08",), NOTE_575, LIB),  # the same branch, a newer release
    ("--host-cuda-version=12.8", ("575.57.08",), NOTE_575, COMPAT),  # CUDA 12.9 > 12.8
    ("--host-cuda-version=12.9", ("575.57.08",), NOTE_575, LIB),
    ("--host-cuda-version=12.8", ("575.57.08",), None, LIB),  # no note: no CUDA version
])
def test_cuda_forward_compat_libraries_win_only_on_an_older_driver_branch(
    tmp_path: Path, host: str, compat: tuple[str, ...], note: str | None, first: str,
) -> None:
    """The hooks as the spec orders them, the real ``ldconfig`` as judge: the image's
    ``/usr/local/cuda/compat/libcuda.so.<version>`` comes first in the ld.so cache (the
    loader takes the first entry of a name) only when nvidia-cdi-hook would take it: its
    major version above the host driver's, or, with the CUDA ELF note, the host's
    branch listed there and the library newer."""
    rootfs = tmp_path / "bundle/rootfs"
    (rootfs / LIB.lstrip("/")).mkdir(parents=True)
    (rootfs / "etc").mkdir()
    source = f"{sim_root_lib(tmp_path)}/libcuda.so.{VERSION}"  # an ELF, soname libcuda.so.1
    driver = "550.54.15" if host.startswith("--") else host
    shutil.copy(source, rootfs / LIB.lstrip("/") / f"libcuda.so.{driver}")
    compat_dir = rootfs / "usr/local/cuda/compat"
    compat_dir.mkdir(parents=True)
    for version in compat:
        compat_library(compat_dir / f"libcuda.so.{version}", note)
    (tmp_path / "bundle/config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c", "pid": os.getpid(),
                        "bundle": str(tmp_path / "bundle")})
    assert cdihook.main(["create-symlinks", "--link",
                         f"libcuda.so.{driver}::{LIB}/libcuda.so.1"], stdin=state) == 0
    known = [host] if host.startswith("--") else ["--host-driver-version", host]
    assert cdihook.main(["enable-cuda-compat", *known], stdin=state) == 0
    assert cdihook.main(["update-ldcache", "--folder", LIB], stdin=state) == 0
    conf = rootfs / "etc/ld.so.conf.d/00-compat-gpuk8s.conf"
    if first == LIB:
        assert not conf.exists()
    else:
        assert conf.read_text() == f"{COMPAT}\n"
    entries = libraries.ldcache_entries(str(rootfs / "etc/ld.so.cache"))
    cuda = [path for name, path in entries if name == "libcuda.so.1"]
    assert cuda and posixpath.dirname(cuda[0]) == first, cuda


def sim_root_lib(tmp_path: Path) -> str:
    root = str(tmp_path / "simnode")
    if not os.path.isdir(root):
        sim.create(root, "nvidia-8")
    return f"{root}{LIB}"


def test_uninstall_removes_only_an_install_directory_it_made(tmp_path: Path) -> None:
    """The wrapper's directory goes at uninstall when the agent made it; one that was there
    before (a pod's mount point, an installer's own) is emptied and stays; and with nothing
    installed, uninstall has nothing to do."""
    root = str(tmp_path / "node")
    sim.create(root, "nvidia-8")
    for system, there in ((tmp_path / "made", False), (tmp_path / "found", True)):
        install = system / "usr/local/gpuk8s"
        if there:
            install.mkdir(parents=True)
        else:
            system.mkdir()
        runtime = agent(root, system)
        assert runtime.uninstall() == []
        runtime.write_spec()
        assert os.access(install / "bin/gpuk8s-oci-runtime", os.X_OK)
        done = runtime.uninstall()
        assert f"/usr/local/gpuk8s {'emptied' if there else 'removed'}" in done
        assert install.exists() == there and not (there and any(install.iterdir()))
        assert runtime.uninstall() == []
