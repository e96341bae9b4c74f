#!/usr/bin/env python3
"""Write a single-platform OCI image archive from files, with no daemon and no pulls.

Used for the from-scratch images the lab needs before anything else exists (pause,
kube-scheduler, a busybox test image). Layers are given as `HOSTPATH=IMAGEPATH[:MODE]`
files, `@DIR=IMAGEDIR` trees, `L:LINK=TARGET` symlinks or `T:TARBALL` existing tarballs.
The archive is importable with `ctr -n k8s.io images import` (the full reference is in
`io.containerd.image.name`) and copyable with `skopeo copy oci-archive:FILE:REF ...`.
Output is deterministic for the same inputs (mtime 0, uid/gid 0, sorted entries).

    ociimage.py --ref registry.k8s.io/pause:3.10 --out pause.tar \\
        --entrypoint /pause --layer ./pause=/pause:0755
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"


def _dir_entries(tar: tarfile.TarFile, made: set[str], path: str) -> None:
    """Add parent directories of `path` (0755, root) once each."""
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d and d not in made:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
            made.add(d)


def build_layer(specs: list[str]) -> bytes:
    """Return an uncompressed tar for the given layer specs."""
    buf = io.BytesIO()
    made: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for spec in specs:
            if spec.startswith("L:"):
                link, target = spec[2:].split("=", 1)
                _dir_entries(tar, made, link)
                info = tarfile.TarInfo(link.strip("/"))
                info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
                tar.addfile(info)
            elif spec.startswith("@"):
                src, dst = spec[1:].split("=", 1)
                root = Path(src)
                for p in sorted(root.rglob("*")):
                    rel = f"{dst.strip('/')}/{p.relative_to(root)}".strip("/")
                    _dir_entries(tar, made, rel)
                    info = tar.gettarinfo(str(p), arcname=rel)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    info.mtime = 0
                    if p.is_file() and not p.is_symlink():
                        with p.open("rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)
                    if info.isdir():
                        made.add(rel)
            else:
                src, dst = spec.split("=", 1)
                mode = None
                if ":" in dst:
                    dst, m = dst.rsplit(":", 1)
                    mode = int(m, 8)
                _dir_entries(tar, made, dst)
                data = Path(src).read_bytes()
                info = tarfile.TarInfo(dst.strip("/"))
                info.size, info.mtime = len(data), 0
                info.mode = mode if mode is not None else (os.stat(src).st_mode & 0o7777)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return digest, len(data)


def write_archive(
    ref: str,
    out: Path,
    layers: list[bytes],
    entrypoint: list[str] | None,
    cmd: list[str] | None,
    env: list[str],
    user: str | None,
    workdir: str | None,
    labels: dict[str, str],
) -> str:
    blobs: dict[str, bytes] = {}
    layer_descs, diff_ids = [], []
    for raw in layers:
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
        gz = gzip.compress(raw, compresslevel=6, mtime=0)
        digest, size = _blob(blobs, gz)
        layer_descs.append({"mediaType": MEDIA_LAYER, "digest": digest, "size": size})
    config: dict[str, object] = {
        "Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    }
    if entrypoint:
        config["Entrypoint"] = entrypoint
    if cmd:
        config["Cmd"] = cmd
    if user:
        config["User"] = user
    if workdir:
        config["WorkingDir"] = workdir
    if labels:
        config["Labels"] = labels
    image_config = {
        "created": "1970-01-01T00:00:00Z",
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "gpuk8s images/ociimage.py"}],
    }
    cdigest, csize = _blob(blobs, json.dumps(image_config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": cdigest, "size": csize},
        "layers": layer_descs,
    }
    mdigest, msize = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": mdigest,
                "size": msize,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref,
                },
            }
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index, sort_keys=True).encode())
        for digest in sorted(blobs):
            add("blobs/sha256/" + digest.split(":", 1)[1], blobs[digest])
    tmp.replace(out)
    return mdigest


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ref", required=True, help="full image reference, e.g. 127.0.0.1:5000/x:1.0")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--layer", action="append", default=[], help="one layer: comma-separated specs")
    ap.add_argument(
        "--tar-layer",
        action="append",
        default=[],
        help="an existing (uncompressed) tarball as a layer",
    )
    ap.add_argument("--entrypoint", nargs="*")
    ap.add_argument("--cmd", nargs="*")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--user")
    ap.add_argument("--workdir")
    ap.add_argument("--label", action="append", default=[])
    a = ap.parse_args()
    layers = [Path(t).read_bytes() for t in a.tar_layer]
    layers += [build_layer(spec.split(",")) for spec in a.layer]
    labels = dict(lbl.split("=", 1) for lbl in a.label)
    digest = write_archive(
        a.ref, a.out, layers, a.entrypoint, a.cmd, a.env, a.user, a.workdir, labels
    )
    print(f"{a.out} {a.ref} {digest}")


if __name__ == "__main__":
    main()
