"""The simulator's kernel modules and kernel stand-ins, judged by Debian's real kmod
(``modinfo``, ``depmod``, ``modprobe``; ``scripts/prereqs unit`` installs it) and ``file``.

* simulated payload modules are ELF relocatable objects that real ``modinfo`` /
  ``depmod -b`` / ``modprobe -n -v -d`` read, with the fields product code reads;
* the simulator's ``modprobe`` reaches the same verdict as real kmod plus the kernel
  check on ``vermagic`` for: a good module, no ``depmod`` run, a module built for another
  kernel release (in that release's directory or in the running one's), a file that is
  not a module (text, an ELF program);
* the simulator's ``depmod`` writes the ``modules.dep`` real ``depmod`` writes;
* what gpuk8s.discovery.kmodule reads from a module is what real ``modinfo`` shows.

Nothing is ever inserted into a kernel: ``modprobe -n`` is a dry run, and the real
kernel's own check (``init_module``) is stood in for by ``modinfo``'s vermagic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.discovery import kmodule
from gpuk8s.sim import kobject

from .simdriver import RELEASE, module_path

pytestmark = pytest.mark.usefixtures("fast_python3")
OTHER = "6.1.0-13-amd64"  # a kernel the simulated node does not run


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    assert found, f"{name} not found: install Debian's kmod and file (scripts/prereqs unit)"
    return found


def real(name: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool(name), *map(str, args)], capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_payload_module_is_a_real_kernel_module(tmp_path: Path) -> None:
    payload = tmp_path / "payload"
    sim.write_payload("driver", "2.33.0.6", str(payload))
    ko = module_path(payload)
    assert "ELF 64-bit LSB relocatable, x86-64" in real("file", ko).stdout
    shown = real("modinfo", ko)
    assert shown.returncode == 0, shown.stderr
    fields = {}
    for line in shown.stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    assert fields["version"] == "2.33.0.6" and fields["name"] == "metax"
    assert fields["license"] == "GPL"
    assert fields["vermagic"] == f"{RELEASE} SMP mod_unload modversions"
    # what product code reads is what kmod reads
    ours = kmodule.modinfo(str(ko))
    for key in ("version", "name", "license", "srcversion", "vermagic"):
        assert real("modinfo", "-F", key, ko).stdout.rstrip("\n").strip() == ours[key][0].strip()
    assert kmodule.built_for(str(ko)) == RELEASE
    versions = real("modprobe", "--dump-modversions", ko)
    assert versions.returncode == 0 and "module_layout" in versions.stdout


def test_real_depmod_and_modprobe_find_an_installed_payload(tmp_path: Path) -> None:
    root = tmp_path / "node"
    sim.create(str(root), "nodriver-8")
    assert (root / "proc/sys/kernel/osrelease").read_text().strip() == RELEASE
    sim.write_payload("driver", "2.33.0.6", str(root))  # installed over the root
    dry = real("modprobe", "-n", "-v", "-d", root, "-S", RELEASE, "metax")
    assert dry.returncode == 1 and f"Module metax not found in directory {root}" in dry.stderr
    indexed = real("depmod", "-b", root, RELEASE)
    assert indexed.returncode == 0, indexed.stderr
    assert "WARNING" not in indexed.stderr  # the simulated kernel has its modules.* files
    dry = real("modprobe", "-n", "-v", "-d", root, "-S", RELEASE, "metax")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.split() == ["insmod", str(module_path(root))]


CASES = {
    # case: (what is installed where, whether depmod runs, the verdict)
    "good module": ("good", RELEASE, True, "loaded"),
    "no depmod run": ("good", RELEASE, False, "not found"),
    "built for another kernel, in its directory": ("other", OTHER, True, "not found"),
    "built for another kernel, in the running one's": ("other", RELEASE, True, "refused"),
    "a text file": ("text", RELEASE, True, "refused"),
    "an ELF program": ("program", RELEASE, True, "refused"),
}


def install(root: Path, what: str, directory: str) -> Path:
    path = module_path(root, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    if what in ("good", "other"):
        kobject.write_module(str(path), "metax", "2.33.0.6", RELEASE if what == "good" else OTHER)
    elif what == "text":
        path.write_text("version=2.33.0.6\n")
    else:
        shutil.copy(tool("true"), path)
    return path


def kmod_verdict(root: Path) -> str:
    """Real kmod's: modprobe's lookup, then what the kernel checks first (the module's
    vermagic, read by modinfo, is for the running release)."""
    dry = real("modprobe", "-n", "-v", "-d", root, "-S", RELEASE, "metax")
    if dry.returncode != 0:
        assert "Module metax not found" in dry.stderr, dry.stderr
        return "not found"
    path = dry.stdout.split()[1]
    vermagic = real("modinfo", "-F", "vermagic", path)
    if vermagic.returncode != 0 or vermagic.stdout.split()[:1] != [RELEASE]:
        return "refused"
    return "loaded"


def simulator_verdict(root: Path) -> str:
    proc = subprocess.run([str(root / "usr/sbin/modprobe"), "metax"], capture_output=True,
                          text=True, timeout=60, check=False)
    if proc.returncode == 0:
        return "loaded"
    if f"Module metax not found in directory /lib/modules/{RELEASE}" in proc.stderr:
        return "not found"
    assert "could not insert 'metax': Invalid module format" in proc.stderr, proc.stderr
    return "refused"


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulated_modprobe_agrees_with_real_kmod(tmp_path: Path, case: str) -> None:
    what, directory, depmod, verdict = CASES[case]
    root = tmp_path / "node"
    sim.create(str(root), "nodriver-8")
    install(root, what, directory)
    if depmod:
        assert real("depmod", "-b", root, directory).returncode == 0
    assert kmod_verdict(root) == verdict
    assert simulator_verdict(root) == verdict
    state = sim.state(str(root))["driver"]
    assert state["loaded"] is (verdict == "loaded")
    if verdict == "refused":  # the reason is in the simulated kernel log, as in dmesg
        assert "metax: " in (root / "var/lib/gpuk8s-sim/kernel.log").read_text()


def test_simulated_depmod_writes_what_real_depmod_writes(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for root in (ours, theirs):
        sim.create(str(root), "nodriver-8")
        install(root, "good", RELEASE)
        other = root / f"lib/modules/{RELEASE}/kernel/drivers/misc/mx_aux.ko"
        kobject.write_module(str(other), "mx_aux", "1.0", RELEASE)
        newer = root / f"lib/modules/{RELEASE}/updates/mx_aux.ko"  # wins: updates/ first
        kobject.write_module(str(newer), "mx_aux", "1.1", RELEASE)
        install(root, "other", OTHER)  # another release's: not in this release's index
    made = subprocess.run([str(ours / "usr/sbin/depmod"), "-a"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    assert real("depmod", "-b", theirs, RELEASE).returncode == 0
    dep = f"lib/modules/{RELEASE}/modules.dep"
    assert sorted((ours / dep).read_text().splitlines()) == \
        sorted((theirs / dep).read_text().splitlines()) == \
        ["extra/metax.ko:", "updates/mx_aux.ko:"]
    # -b names another root; the release is given
    made = subprocess.run([str(ours / "usr/sbin/depmod"), "-b", str(theirs), OTHER],
                          capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    assert (theirs / f"lib/modules/{OTHER}/modules.dep").read_text() == "extra/metax.ko:\n"


def test_product_reader_refuses_what_modinfo_cannot_read(tmp_path: Path) -> None:
    root = tmp_path / "node"
    sim.create(str(root), "nodriver-8")
    for what in ("text", "program"):
        path = install(root, what, RELEASE)
        assert real("modinfo", path).returncode != 0
        with pytest.raises(kmodule.ModuleFormatError):
            kmodule.built_for(str(path))


def compress(path: Path, suffix: str) -> Path:
    """``path`` (a .ko) compressed as kmod reads it: ``.xz`` (lzma, CRC32 as the kernel's
    build writes it) or ``.zst`` (the zstd program)."""
    out = path.with_name(path.name + suffix)
    if suffix == ".xz":
        import lzma
        out.write_bytes(lzma.compress(path.read_bytes(), check=lzma.CHECK_CRC32))
    else:
        assert real("zstd", "-q", "-f", "-o", out, path).returncode == 0
    path.unlink()
    return out


@pytest.mark.parametrize("suffix", [".xz", ".zst"])
def test_compressed_modules_read_as_modinfo_reads_them(tmp_path: Path, suffix: str) -> None:
    ko = tmp_path / "metax.ko"
    kobject.write_module(str(ko), "metax", "2.33.0.6", RELEASE)
    packed = compress(ko, suffix)
    for key in ("version", "vermagic"):
        shown = real("modinfo", "-F", key, packed)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.strip() == kmodule.modinfo(str(packed))[key][0].strip()


LEFT_BEHIND = {
    # another installer's module beside the payload's extra/metax.ko
    "a DKMS build": "updates/dkms/metax.ko",
    "an old one, xz, beside it": "extra/metax.ko.xz",
    "an old one, zstd, in the kernel tree": "kernel/drivers/gpu/metax.ko.zst",
    "an old one in updates/": "updates/metax.ko",
}


@pytest.mark.parametrize("case", sorted(LEFT_BEHIND))
def test_simulated_lookup_picks_the_file_real_kmod_picks(tmp_path: Path, case: str) -> None:
    """Of two files of one module, the one real depmod indexes and ``modprobe
    --show-depends`` names is the one the simulator's depmod and modprobe name (the same
    tree, so the same directory order where the two rank alike)."""
    root = tmp_path / "node"
    sim.create(str(root), "nodriver-8")
    install(root, "good", RELEASE)
    other = root / f"lib/modules/{RELEASE}" / LEFT_BEHIND[case]
    other.parent.mkdir(parents=True, exist_ok=True)
    plain = other.with_name("left.ko")
    kobject.write_module(str(plain), "metax", "2.30.0.1", RELEASE)
    if other.suffix in (".xz", ".zst"):
        compress(plain, other.suffix).rename(other)
    else:
        plain.rename(other)
    assert real("depmod", "-b", root, RELEASE).returncode == 0
    theirs = real("modprobe", "--show-depends", "-d", root, "-S", RELEASE, "metax")
    assert theirs.returncode == 0, theirs.stderr
    made = subprocess.run([str(root / "usr/sbin/depmod"), "-a"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    ours = subprocess.run([str(root / "usr/sbin/modprobe"), "--show-depends", "-d", str(root),
                           "-S", RELEASE, "metax"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout
    if "updates/" in LEFT_BEHIND[case]:  # kmod's search order: updates/ first
        assert theirs.stdout == f"insmod {other} \n"


def test_the_features_of_real_kmod_are_read_as_it_prints_them() -> None:
    """``kmod -V``'s second line (``+XZ -ZLIB ...``) is what decides which compressed
    modules a payload may hold; read through modprobe, as the install asks it."""
    from gpuk8s.discovery.tools import default_runner
    from gpuk8s.host import driver as drv

    printed = real("kmod", "-V")
    assert printed.returncode == 0 and printed.stdout.startswith("kmod version ")
    expected = {w[1:]: w[0] == "+" for w in printed.stdout.splitlines()[1].split()}
    assert {"XZ", "ZSTD", "ZLIB"} <= set(expected)
    request = drv.InstallRequest(resolve_command=(tool("modprobe"), *drv.RESOLVE_ARGS))
    assert drv.kmod_features("/", request, default_runner) == expected
