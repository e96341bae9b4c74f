"""Python modules for the kubelet gRPC APIs, generated from ``proto/*.proto``: the device
plugin and PodResources APIs (written for gpuk8s), and the DRA plugin, DRA health and plugin
registration APIs (vendored from k8s.io/kubelet).

Generated code is never committed. It is produced

* at build time by ``setup.py`` (``pip install .``, ``pip wheel .`` and
  ``pip install -e .`` all run it; grpcio-tools is a build requirement), and
* on first import in a source checkout, when the generated package is missing or
  older than the ``.proto`` files and grpcio-tools is importable (the dev extra).

Only message modules (``*_pb2``) are generated: the services are wired with gRPC's
generic handlers (``node/grpcapi.py``, ``deviceplugin/grpcapi.py``), so the generated code
never pins a grpcio version.

This module imports only the stdlib at module level: ``setup.py`` loads it by path.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import tempfile
from types import ModuleType

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "proto")
API_DIR = os.path.join(HERE, "api")
API_PACKAGE = "gpuk8s.services.node.api"
PROTOS: tuple[str, ...] = (
    "deviceplugin_v1beta1.proto",
    "podresources_v1.proto",
    "dra_v1.proto",
    "dra_v1beta1.proto",
    "drahealth_v1alpha1.proto",
    "pluginregistration_v1.proto",
)
STAMP = "_source.sha256"


class ProtoBuildError(RuntimeError):
    """The generated API modules are missing and cannot be generated here."""


def source_digest(proto_dir: str = PROTO_DIR) -> str:
    digest = hashlib.sha256()
    for name in PROTOS:
        with open(os.path.join(proto_dir, name), "rb") as handle:
            digest.update(name.encode() + b"\0" + handle.read())
    return digest.hexdigest()


def generate(out_dir: str, proto_dir: str = PROTO_DIR) -> list[str]:
    """Compile the protos into the package directory ``out_dir``; returns file names.

    Files are written to a temporary directory first and moved into place one by
    one (``__init__.py`` and the stamp last), so a concurrent importer sees either
    the old or the new modules, never a half-written one.
    """
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as err:
        raise ProtoBuildError(
            "grpcio-tools is needed to generate the kubelet API modules from "
            f"{proto_dir}; install the dev extra (pip install -e '.[dev]') or build "
            "with `pip install .`, which installs it as a build requirement"
        ) from err
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".gen-", dir=out_dir)
    try:
        argv = [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            *PROTOS,
        ]
        rc = protoc.main(argv)
        if rc != 0:
            raise ProtoBuildError(f"protoc failed with exit code {rc} for {', '.join(PROTOS)}")
        with open(os.path.join(tmp, "__init__.py"), "w", encoding="utf-8") as handle:
            handle.write('"""Generated from ../proto/*.proto; do not edit, do not commit."""\n')
        with open(os.path.join(tmp, STAMP), "w", encoding="utf-8") as handle:
            handle.write(source_digest(proto_dir) + "\n")
        names = sorted(n for n in os.listdir(tmp) if n not in ("__init__.py", STAMP))
        for name in [*names, "__init__.py", STAMP]:
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
        return [*names, "__init__.py", STAMP]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stale(api_dir: str) -> bool:
    try:
        with open(os.path.join(api_dir, STAMP), encoding="utf-8") as handle:
            stamp = handle.read().strip()
    except OSError:
        return True
    try:
        return stamp != source_digest()
    except OSError:  # installed without the .proto files: trust what is there
        return False


def load() -> tuple[ModuleType, ModuleType]:
    """``(deviceplugin_v1beta1_pb2, podresources_v1_pb2)``, generating them if needed."""
    deviceplugin, podresources = load_modules("deviceplugin_v1beta1", "podresources_v1")
    return deviceplugin, podresources


def load_modules(*stems: str) -> tuple[ModuleType, ...]:
    """The generated ``<stem>_pb2`` modules (stems of ``PROTOS``), generating them if
    needed."""
    unknown = [s for s in stems if f"{s}.proto" not in PROTOS]
    if unknown:
        raise ProtoBuildError(f"no such kubelet API: {', '.join(unknown)}")
    if _stale(API_DIR):
        try:
            generate(API_DIR)
        except (ProtoBuildError, OSError) as err:
            if not all(os.path.exists(os.path.join(API_DIR, f"{s}_pb2.py")) for s in stems):
                raise ProtoBuildError(f"kubelet API modules are missing: {err}") from err
        importlib.invalidate_caches()
    try:
        return tuple(importlib.import_module(f"{API_PACKAGE}.{s}_pb2") for s in stems)
    except ImportError as err:
        raise ProtoBuildError(f"kubelet API modules are missing: {err}") from err
    except Exception as err:  # protobuf's VersionError: gencode newer than the runtime
        runtime = getattr(importlib.import_module("google.protobuf"), "__version__", "?")
        raise ProtoBuildError(
            f"kubelet API modules were generated for a newer protobuf than the installed "
            f"{runtime} ({err}); install a protobuf matching the grpcio-tools used at build "
            "time, or rebuild in this environment (pip install --no-build-isolation .)"
        ) from err
