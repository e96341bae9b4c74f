"""KubeSchedulerConfiguration extenders and kube-scheduler static-pod edits (SPEC §7).

Pure planning on plain YAML trees (mappings and sequences), stdlib only. Every edit
works *in place* through the ``MutableMapping`` / ``MutableSequence`` interfaces, so a
caller that parsed the file with a round-trip loader (ruamel.yaml's ``CommentedMap``
and ``CommentedSeq`` are ``dict`` / ``list`` subclasses) keeps the user's comments and
key order; reading and writing the files is the caller's job (see
``gpuk8s.ansible.schedfiles``).

What ``present`` adds to the manifest is recognisable without any state kept
elsewhere, so ``absent`` removes exactly that and nothing else:

* the command argument ``--config=<config_path>`` (only when the scheduler had no
  ``--config`` of its own; otherwise our extender goes into that file instead);
* the volumes and volumeMounts named ``VOLUME_CONFIG`` and ``VOLUME_KUBECONFIG``
  (the kubeconfig one only when nothing mounts the kubeconfig yet — kubeadm already
  mounts it as ``kubeconfig``).

In a configuration file we did not create, our extender is the entry whose
``urlPrefix`` equals ours.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, ManifestError

API_GROUP = "kubescheduler.config.k8s.io"
KIND = "KubeSchedulerConfiguration"
DEFAULT_CONFIG_PATH = "/etc/metax/extender.yaml"
DEFAULT_KUBECONFIG = "/etc/kubernetes/scheduler.conf"
DEFAULT_MANIFEST = "/etc/kubernetes/manifests/kube-scheduler.yaml"
VOLUME_CONFIG = "metax-extender-config"
VOLUME_KUBECONFIG = "metax-scheduler-kubeconfig"
CONTAINER_NAME = "kube-scheduler"
GPU_RESOURCE = "metax-tech.com/gpu"
# Versions KEP-785 lists as served; the oldest first.
KNOWN_API_VERSIONS = ("v1beta2", "v1beta3", "v1")
MIN_MINOR = 22

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")
_DURATION_RE = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
_CONFIG_FLAG = "--config"


# --------------------------------------------------------------------------- versions


def parse_kube_version(text: str) -> tuple[int, int]:
    """(major, minor) of ``v1.29.3`` / ``1.29`` / ``v1.30.0-rc.1``."""
    match = _VERSION_RE.match(text.strip())
    if not match:
        raise ConfigError(
            f"kubernetes_version {text!r} is not a Kubernetes version (e.g. 'v1.29.3' or '1.29')"
        )
    return int(match.group(1)), int(match.group(2))


def api_version_for(kube_version: str) -> str:
    """Scheduler config apiVersion served by that Kubernetes version (REFERENCE §C)."""
    major, minor = parse_kube_version(kube_version)
    if major != 1 or minor < MIN_MINOR:
        raise ConfigError(
            f"kubernetes_version {kube_version!r} is not supported: scheduler extenders "
            f"are configured here for Kubernetes 1.{MIN_MINOR} or newer"
        )
    if minor >= 25:
        return f"{API_GROUP}/v1"
    if minor >= 23:
        return f"{API_GROUP}/v1beta3"
    return f"{API_GROUP}/v1beta2"


def version_from_image(image: str) -> str | None:
    """The tag of a ``.../kube-scheduler:v1.29.3`` image when it is a version, else None."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    tag = last.rsplit(":", 1)[1]
    return tag if _VERSION_RE.match(tag) else None


# --------------------------------------------------------------------------- extender


@dataclass(frozen=True)
class TlsConfig:
    insecure: bool = False
    server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    def to_yaml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"insecure": self.insecure}
        for key, value in (
            ("serverName", self.server_name),
            ("certFile", self.cert_file),
            ("keyFile", self.key_file),
            ("caFile", self.ca_file),
        ):
            if value:
                out[key] = value
        return out


@dataclass(frozen=True)
class ManagedResource:
    name: str
    ignored_by_scheduler: bool = False


@dataclass(frozen=True)
class ExtenderSpec:
    """One scheduler extender entry; defaults are SPEC §7's."""

    url_prefix: str
    filter_verb: str | None = "filter"
    prioritize_verb: str | None = "prioritize"
    weight: int = 500
    enable_https: bool = False
    tls_config: TlsConfig | None = None
    http_timeout: str | None = None
    node_cache_capable: bool = False
    ignorable: bool = False
    managed_resources: tuple[ManagedResource, ...] = field(default_factory=tuple)

    def validate(self) -> None:
        """Raise ConfigError naming the field, as kube-scheduler would refuse it."""
        if not re.match(r"^https?://[^/\s]+", self.url_prefix or ""):
            raise ConfigError(
                f"url_prefix {self.url_prefix!r} must be an http:// or https:// URL "
                "(e.g. http://10.96.12.34:8080)"
            )
        https_url = self.url_prefix.startswith("https://")
        if https_url != self.enable_https:
            raise ConfigError(
                f"enable_https is {str(self.enable_https).lower()} but url_prefix is "
                f"{self.url_prefix!r}: use https:// with enable_https: true, http:// otherwise"
            )
        if self.tls_config is not None and not self.enable_https:
            raise ConfigError("tls_config is set but enable_https is false: set enable_https: true")
        if not self.filter_verb and not self.prioritize_verb:
            raise ConfigError(
                "filter_verb and prioritize_verb are both empty: the extender would do nothing"
            )
        if self.prioritize_verb and self.weight <= 0:
            raise ConfigError(
                f"weight {self.weight}: an extender with prioritize_verb "
                f"{self.prioritize_verb!r} must have a positive weight"
            )
        for verb_name, verb in (("filter_verb", self.filter_verb),
                                ("prioritize_verb", self.prioritize_verb)):
            if verb is not None and not re.fullmatch(r"[A-Za-z0-9._~-]*", verb):
                raise ConfigError(f"{verb_name} {verb!r} must be a plain URL path segment")
        if self.http_timeout is not None and not _DURATION_RE.match(self.http_timeout):
            raise ConfigError(
                f"http_timeout {self.http_timeout!r} is not a duration (e.g. '5s', '1m30s')"
            )
        names = [r.name for r in self.managed_resources]
        for name in names:
            if not name:
                raise ConfigError("managed_resources: every entry needs a non-empty name")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"managed_resources lists {', '.join(duplicates)} more than once")

    def to_yaml(self) -> dict[str, Any]:
        """The extender as KubeSchedulerConfiguration spells it (field order of SPEC §7)."""
        out: dict[str, Any] = {"urlPrefix": self.url_prefix}
        if self.filter_verb:
            out["filterVerb"] = self.filter_verb
        if self.prioritize_verb:
            out["prioritizeVerb"] = self.prioritize_verb
        out["weight"] = self.weight
        out["enableHTTPS"] = self.enable_https
        if self.tls_config is not None:
            out["tlsConfig"] = self.tls_config.to_yaml()
        if self.http_timeout:
            out["httpTimeout"] = self.http_timeout
        out["nodeCacheCapable"] = self.node_cache_capable
        out["ignorable"] = self.ignorable
        if self.managed_resources:
            out["managedResources"] = [
                {"name": r.name, "ignoredByScheduler": r.ignored_by_scheduler}
                for r in self.managed_resources
            ]
        return out


# --------------------------------------------------------------------------- config file


def packing_profile(resource: str = GPU_RESOURCE) -> dict[str, Any]:
    """Scheduler settings that let gpu-aware's ranking decide (the ``packing`` profile).

    * ``percentageOfNodesToScore: 100`` -- by default a large cluster has only a sample
      of its feasible nodes scored (about 40 % at 1,000 nodes, at least 100 nodes): the
      extender would then never see the node it would have picked;
    * ``NodeResourcesFit`` scores GPU pods by ``MostAllocated`` on the GPU resource
      alone: where the extender's priorities tie (or its answer is missing), the
      scheduler fills the node with the most GPUs in use instead of spreading over empty
      ones. kube-scheduler leaves an extended resource the pod does not request out of
      this score, so pods without GPUs get no score from it at all: they are not packed
      onto the CPU next to free GPUs (``docs/extender.md``: pods without GPUs).
    """
    return {
        "percentageOfNodesToScore": 100,
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "pluginConfig": [
                    {
                        "name": "NodeResourcesFit",
                        "args": {
                            "scoringStrategy": {
                                "type": "MostAllocated",
                                "resources": [{"name": resource, "weight": 1}],
                            }
                        },
                    }
                ],
            }
        ],
    }


PROFILES = ("packing", "none")


def new_config(spec: ExtenderSpec, api_version: str,
               kubeconfig: str = DEFAULT_KUBECONFIG, profile: str = "packing") -> dict[str, Any]:
    """The whole file we own (``/etc/metax/extender.yaml``); ``profile`` ``packing``
    adds ``packing_profile()``, ``none`` leaves the scheduler's defaults."""
    if profile not in PROFILES:
        raise ConfigError(f"scheduler_profile {profile!r} must be one of {', '.join(PROFILES)}")
    config: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": KIND,
        "clientConnection": {"kubeconfig": kubeconfig},
    }
    if profile == "packing":
        config.update(packing_profile())
    config["extenders"] = [spec.to_yaml()]
    return config


def check_config(config: Any, where: str) -> None:
    """Raise ManifestError unless ``config`` is a KubeSchedulerConfiguration we can edit,
    and its extenders pass kube-scheduler's own validation (REFERENCE §C)."""
    if not isinstance(config, MutableMapping):
        raise ManifestError(f"{where}: not a YAML mapping (a KubeSchedulerConfiguration)")
    api = str(config.get("apiVersion", ""))
    if not api.startswith(API_GROUP + "/") or config.get("kind") != KIND:
        raise ManifestError(
            f"{where}: apiVersion {api!r} kind {config.get('kind')!r} is not a "
            f"{API_GROUP} {KIND}"
        )
    extenders = config.get("extenders")
    if extenders is None:
        return
    if not isinstance(extenders, MutableSequence):
        raise ManifestError(f"{where}: extenders is not a list")
    binders = 0
    for position, entry in enumerate(extenders):
        if not isinstance(entry, MutableMapping):
            raise ManifestError(f"{where}: extenders[{position}] is not a mapping")
        if entry.get("prioritizeVerb") and int(entry.get("weight", 0) or 0) <= 0:
            raise ManifestError(
                f"{where}: extenders[{position}] has prioritizeVerb "
                f"{entry.get('prioritizeVerb')!r} and must have a positive weight"
            )
        if entry.get("bindVerb"):
            binders += 1
        names = [r.get("name") for r in entry.get("managedResources") or []
                 if isinstance(r, MutableMapping)]
        if len(names) != len(set(names)):
            raise ManifestError(f"{where}: extenders[{position}] repeats a managed resource")
    if binders > 1:
        raise ManifestError(f"{where}: only one extender may have a bindVerb, found {binders}")


def _find_extender(extenders: Sequence[Any], url_prefix: str) -> int | None:
    for position, entry in enumerate(extenders):
        if isinstance(entry, MutableMapping) and str(entry.get("urlPrefix", "")).rstrip(
            "/"
        ) == url_prefix.rstrip("/"):
            return position
    return None


def _update_mapping(target: MutableMapping[str, Any], wanted: dict[str, Any]) -> bool:
    """Make ``target`` equal ``wanted`` in place, keeping the order of surviving keys."""
    changed = False
    for key in [k for k in target if k not in wanted]:
        del target[key]
        changed = True
    for key, value in wanted.items():
        if key not in target or target[key] != value:
            target[key] = value
            changed = True
    return changed


def upsert_extender(config: MutableMapping[str, Any], spec: ExtenderSpec) -> bool:
    """Add our extender to ``config['extenders']`` (appending) or update it in place."""
    wanted = spec.to_yaml()
    extenders = config.get("extenders")
    if extenders is None:
        config["extenders"] = [wanted]
        return True
    if not isinstance(extenders, MutableSequence):
        raise ManifestError("extenders is not a list")
    position = _find_extender(extenders, spec.url_prefix)
    if position is None:
        extenders.append(wanted)
        return True
    return _update_mapping(extenders[position], wanted)


def remove_extender(config: MutableMapping[str, Any], url_prefix: str) -> bool:
    """Drop our extender from ``config['extenders']``; True when something was removed."""
    extenders = config.get("extenders")
    if not isinstance(extenders, MutableSequence):
        return False
    position = _find_extender(extenders, url_prefix)
    if position is None:
        return False
    del extenders[position]
    return True


# --------------------------------------------------------------------------- manifest


def scheduler_container(manifest: Any, where: str = "manifest") -> MutableMapping[str, Any]:
    """The kube-scheduler container of a static-pod manifest (ManifestError otherwise)."""
    if not isinstance(manifest, MutableMapping):
        raise ManifestError(f"{where}: not a YAML mapping (a Pod manifest)")
    if manifest.get("kind") != "Pod":
        raise ManifestError(f"{where}: kind is {manifest.get('kind')!r}, expected Pod")
    spec = manifest.get("spec")
    containers = spec.get("containers") if isinstance(spec, MutableMapping) else None
    if not isinstance(containers, MutableSequence) or not containers:
        raise ManifestError(f"{where}: spec.containers is missing or empty")
    for container in containers:
        if not isinstance(container, MutableMapping):
            continue
        command = container.get("command") or []
        program = str(command[0]) if isinstance(command, Sequence) and command else ""
        if container.get("name") == CONTAINER_NAME or program.endswith(CONTAINER_NAME):
            if not isinstance(command, MutableSequence):
                raise ManifestError(f"{where}: the kube-scheduler container has no command list")
            return container
    raise ManifestError(f"{where}: no container named {CONTAINER_NAME!r}")


def configured_path(container: MutableMapping[str, Any]) -> str | None:
    """The value of ``--config`` in the container's command or args, if any."""
    for key in ("command", "args"):
        items = container.get(key) or []
        for position, item in enumerate(items):
            text = str(item)
            if text.startswith(_CONFIG_FLAG + "="):
                return text.split("=", 1)[1]
            if text == _CONFIG_FLAG and position + 1 < len(items):
                return str(items[position + 1])
    return None


def scheduler_image_version(manifest: Any) -> str | None:
    container = scheduler_container(manifest)
    return version_from_image(str(container.get("image", "")))


def host_path_of(manifest: MutableMapping[str, Any], container_path: str) -> str | None:
    """Host path behind ``container_path`` through the scheduler's hostPath mounts.

    The longest mountPath that is the path itself or one of its parents wins; None
    when no hostPath volume covers it.
    """
    container = scheduler_container(manifest)
    volumes = {
        v.get("name"): v.get("hostPath", {}).get("path")
        for v in (manifest["spec"].get("volumes") or [])
        if isinstance(v, MutableMapping) and isinstance(v.get("hostPath"), MutableMapping)
    }
    best: tuple[int, str] | None = None
    for mount in container.get("volumeMounts") or []:
        if not isinstance(mount, MutableMapping):
            continue
        mount_path = str(mount.get("mountPath", "")).rstrip("/") or "/"
        host = volumes.get(mount.get("name"))
        if host is None:
            continue
        if container_path == mount_path:
            candidate = str(host)
        elif container_path.startswith(mount_path.rstrip("/") + "/"):
            candidate = str(host).rstrip("/") + container_path[len(mount_path.rstrip("/")):]
        else:
            continue
        if best is None or len(mount_path) > best[0]:
            best = (len(mount_path), candidate)
    return None if best is None else best[1]


def _mounted(container: MutableMapping[str, Any], path: str) -> bool:
    return any(
        isinstance(m, MutableMapping) and str(m.get("mountPath", "")).rstrip("/") == path
        for m in container.get("volumeMounts") or []
    )


def _list(parent: MutableMapping[str, Any], key: str) -> MutableSequence[Any]:
    items = parent.get(key)
    if items is None:
        parent[key] = []
        items = parent[key]
    if not isinstance(items, MutableSequence):
        raise ManifestError(f"{key} is not a list")
    return items


def _named(items: Sequence[Any], name: str) -> int | None:
    for position, item in enumerate(items):
        if isinstance(item, MutableMapping) and item.get("name") == name:
            return position
    return None


def _ensure_named(items: MutableSequence[Any], wanted: dict[str, Any]) -> bool:
    position = _named(items, wanted["name"])
    if position is None:
        items.append(wanted)
        return True
    return _update_mapping(items[position], wanted)


def patch_manifest(
    manifest: MutableMapping[str, Any],
    config_path: str = DEFAULT_CONFIG_PATH,
    kubeconfig: str = DEFAULT_KUBECONFIG,
) -> list[str]:
    """Point the scheduler at ``config_path`` (in place); returns what changed, one line
    each. Call only when the scheduler has no other ``--config``."""
    container = scheduler_container(manifest)
    other = configured_path(container)
    if other is not None and other != config_path:
        raise ManifestError(
            f"the scheduler already runs with --config={other}: add the extender to that file"
        )
    changes: list[str] = []
    if other is None:
        container["command"].append(f"{_CONFIG_FLAG}={config_path}")
        changes.append(f"command: added {_CONFIG_FLAG}={config_path}")
    mounts = _list(container, "volumeMounts")
    volumes = _list(manifest["spec"], "volumes")
    wanted: list[tuple[str, str, str]] = [(VOLUME_CONFIG, config_path, "File")]
    if not _mounted(container, kubeconfig) or _named(mounts, VOLUME_KUBECONFIG) is not None:
        wanted.insert(0, (VOLUME_KUBECONFIG, kubeconfig, "FileOrCreate"))
    for name, path, kind in wanted:
        if _ensure_named(mounts, {"mountPath": path, "name": name, "readOnly": True}):
            changes.append(f"volumeMounts: {name} -> {path} (read-only)")
        if _ensure_named(volumes, {"hostPath": {"path": path, "type": kind}, "name": name}):
            changes.append(f"volumes: {name} hostPath {path} ({kind})")
    return changes


def unpatch_manifest(
    manifest: MutableMapping[str, Any], config_path: str = DEFAULT_CONFIG_PATH
) -> list[str]:
    """Remove exactly what ``patch_manifest`` adds (in place); returns what changed."""
    container = scheduler_container(manifest)
    changes: list[str] = []
    for key in ("command", "args"):
        items = container.get(key)
        if not isinstance(items, MutableSequence):
            continue
        flag = f"{_CONFIG_FLAG}={config_path}"
        while flag in [str(i) for i in items]:
            del items[[str(i) for i in items].index(flag)]
            changes.append(f"{key}: removed {flag}")
    for parent, key in ((container, "volumeMounts"), (manifest["spec"], "volumes")):
        items = parent.get(key)
        if not isinstance(items, MutableSequence):
            continue
        for name in (VOLUME_KUBECONFIG, VOLUME_CONFIG):
            position = _named(items, name)
            if position is not None:
                del items[position]
                changes.append(f"{key}: removed {name}")
    return changes
