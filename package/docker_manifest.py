#!/usr/bin/env python3
"""Write the docker-archive ``manifest.json`` of an images payload (package/build.sh).

    package/docker_manifest.py PAYLOAD_DIR REGISTRY

PAYLOAD_DIR holds ``images.txt`` ("NAME TAG" lines) and ``oci/``, an OCI image layout
whose manifests are annotated ``org.opencontainers.image.ref.name=NAME:TAG`` (what
``skopeo copy ... oci:DIR:NAME:TAG`` writes). Writes ``PAYLOAD_DIR/manifest.json``: one
entry per image, ``RepoTags`` ``REGISTRY/NAME:TAG``, ``Config`` and ``Layers`` the
layout's own blobs (``oci/blobs/sha256/<hex>``). A tar of PAYLOAD_DIR is then also a
docker archive: ``docker load`` (any version: it reads ``manifest.json`` and takes
gzip-compressed layers) and ``podman load`` read it with no conversion and no skopeo.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REF_NAME = "org.opencontainers.image.ref.name"
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")


def blob_path(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"oci/blobs/{algorithm}/{hexdigest}"


def docker_manifest(payload: Path, registry: str) -> list[dict[str, Any]]:
    layout = payload / "oci"
    index = json.loads((layout / "index.json").read_text())
    by_name = {m.get("annotations", {}).get(REF_NAME): m for m in index.get("manifests", [])}
    entries = []
    for line in (payload / "images.txt").read_text().splitlines():
        if not line.strip():
            continue
        name, tag = line.split()
        found = by_name.get(f"{name}:{tag}")
        if found is None:
            raise SystemExit(f"docker_manifest: {name}:{tag} is not in {layout}/index.json")
        if found.get("mediaType") not in MANIFEST_TYPES:
            raise SystemExit(f"docker_manifest: {name}:{tag} is a {found.get('mediaType')}, "
                             "not a single-platform image manifest (a docker archive holds "
                             "one platform)")
        manifest = json.loads((payload / blob_path(found["digest"])).read_text())
        entries.append({
            "Config": blob_path(manifest["config"]["digest"]),
            "RepoTags": [f"{registry}/{name}:{tag}"],
            "Layers": [blob_path(layer["digest"]) for layer in manifest["layers"]],
        })
    return entries


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    payload, registry = Path(argv[0]), argv[1].rstrip("/")
    entries = docker_manifest(payload, registry)
    (payload / "manifest.json").write_text(json.dumps(entries, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
