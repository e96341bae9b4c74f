#!/usr/bin/env python3
"""Build the metax-docker installers (SPEC §10). `make metax-docker VERSION=x.y.z` and
package/build.sh (the offline package) call this.

    package/metax_docker.py VERSION [--out DIR] [--arch x86_64 --arch aarch64]

Writes DIR/metax-docker_VERSION.tar (default DIR <repo>/dist; gzip-compressed despite the
name, as the manual unpacks it with `tar -xvzf`) holding one installer per architecture,
metax-docker_VERSION.ARCH.run: package/metax-docker.run.in (install, the default /
uninstall / verify / version) followed by one zipapp of src/gpuk8s/metax_docker with
gpuk8s.core and gpuk8s.discovery (stdlib only, run by the host's Python >= 3.8, which the
installer has compile it first: gpuk8s.metax_docker.bytecode; the import-linter contracts
keep metax_docker on core and discovery). Reproducible: sorted entries, fixed owner and
times (SOURCE_DATE_EPOCH, else the last commit's time), no name or time in the gzip header.
Prints the tar's path.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

PKG_DIR = Path(__file__).resolve().parent
REPO_DIR = PKG_DIR.parent
SRC = REPO_DIR / "src"
TEMPLATE = PKG_DIR / "metax-docker.run.in"
PACKAGES = ("core", "discovery", "metax_docker")  # under gpuk8s/, with gpuk8s/__init__.py
MAIN = b"import sys\n\nfrom gpuk8s.metax_docker.main import main\n\nsys.exit(main())\n"
SEMVER = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$")
ARCH = re.compile(r"^[a-z0-9_]+$")
ZIP_EPOCH = 315532800  # zip dates start in 1980


def epoch() -> int:
    given = os.environ.get("SOURCE_DATE_EPOCH")
    if given:
        return int(given)
    proc = subprocess.run(["git", "-C", str(REPO_DIR), "log", "-1", "--format=%ct"],
                          capture_output=True, text=True, check=False)
    return int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else 0


def zipapp(stamp: int) -> bytes:
    """The zip archive of the app, no shebang (the installer writes one)."""
    files = [SRC / "gpuk8s/__init__.py"]
    for package in PACKAGES:
        files += sorted((SRC / "gpuk8s" / package).rglob("*.py"))  # core/sharing/ too
    entries = [(f.relative_to(SRC).as_posix(), f.read_bytes()) for f in files]
    entries.append(("__main__.py", MAIN))
    date = time.gmtime(max(stamp, ZIP_EPOCH))[:6]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in sorted(entries):
            info = zipfile.ZipInfo(name, date)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return buf.getvalue()


def installer(version: str, arch: str, payload: bytes) -> bytes:
    text = TEMPLATE.read_text(encoding="utf-8")
    lines = text.count("\n")
    script = (text.replace("@VERSION@", version).replace("@ARCH@", arch)
              .replace("@PAYLOAD_LINE@", str(lines + 1))
              .replace("@PAYLOAD_SHA256@", hashlib.sha256(payload).hexdigest()))
    if script.count("\n") != lines or not script.endswith("\n"):
        raise SystemExit("metax-docker.run.in: substitution changed the line count")
    return script.encode("utf-8") + payload


def build(version: str, arches: list[str], out_dir: Path) -> Path:
    stamp = epoch()
    payload = zipapp(stamp)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"metax-docker_{version}.tar"
    partial = target.with_name(target.name + ".tmp")
    # gzip-compressed under the manual's name `.tar`: its `tar -xvzf` and a plain `tar -xvf`
    # (GNU tar detects the compression) both unpack it; no name or time in the gzip header
    with partial.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for arch in sorted(arches):
            data = installer(version, arch, payload)
            info = tarfile.TarInfo(f"metax-docker_{version}.{arch}.run")
            info.size, info.mode, info.mtime = len(data), 0o755, stamp
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    partial.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="package/metax_docker.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("version", help="SemVer, e.g. 1.2.3")
    parser.add_argument("--out", type=Path, default=REPO_DIR / "dist")
    parser.add_argument("--arch", action="append", dest="arches",
                        help="uname -m name; repeatable (default: x86_64 and aarch64)")
    args = parser.parse_args(argv)
    if not SEMVER.match(args.version):
        parser.error(f"VERSION must be SemVer like 1.2.3 or 1.2.3-rc.1, not {args.version!r}")
    arches = args.arches or ["x86_64", "aarch64"]
    for arch in arches:
        if not ARCH.match(arch):
            parser.error(f"architecture {arch!r} is not a uname -m name (x86_64, aarch64 ...)")
    target = build(args.version, arches, args.out)
    print(f"[metax-docker] wrote {target}", file=sys.stderr)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
