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
* the volumes and volumeMounts named ``VOLUME_CONFIG``, ``VOLUME_KUBECONFIG`` and
  ``VOLUME_TLS`` — each only when no other hostPath mount already shows that path to
  the scheduler (kubeadm mounts the kubeconfig as ``kubeconfig``; an administrator who
  followed the manual by hand mounts the configuration under a name of their own), so
  a mountPath never appears twice;
* the annotation ``ANNOTATION`` on the pod: the hash of the configuration file the
  scheduler reads (kube-scheduler reads it only at start, and the kubelet restarts a
  static pod only when its manifest changes: a new hash restarts it), our extender's
  ``urlPrefix`` (so a changed URL replaces the old entry, and ``absent`` finds it
  without being told) and whether the ``--config`` flag is ours.

A ``--config=<config_path>`` that the annotation does not claim (nor, for manifests
patched before the annotation existed, our ``VOLUME_CONFIG`` mount) is the
administrator's: that file is then treated like any configuration file of theirs.
In such a file our extender is the entry whose ``urlPrefix`` is the annotation's (or the
one given).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping, MutableMapping, MutableSequence, Sequence
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
# tlsConfig files, by ExtenderSpec.tls_config field
VOLUME_TLS = {
    "ca_file": "metax-extender-ca",
    "cert_file": "metax-extender-cert",
    "key_file": "metax-extender-key",
}
OUR_VOLUMES = (VOLUME_KUBECONFIG, VOLUME_CONFIG, *VOLUME_TLS.values())
ANNOTATION = "metax-tech.com/scheduler-extender"
CONTAINER_NAME = "kube-scheduler"
GPU_RESOURCE = "metax-tech.com/gpu"
# prioritizeVerb of the second entry of our extender (``ExtenderSpec.rank_nogpu``): no
# filter, no bind, no managedResources, ignorable -- kube-scheduler asks it to score every
# pod, and gpu-aware ranks the pods without GPUs (the main entry never sees them)
NOGPU_VERB = "prioritize-nogpu"
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
    # GPU sharing: the extender binds the pods it manages (chooses node and GPU)
    bind_verb: str | None = None
    # a second entry (``nogpu_yaml``) through which gpu-aware ranks pods without GPUs
    rank_nogpu: bool = False

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
        for key in VOLUME_TLS if self.tls_config else ():
            path = getattr(self.tls_config, key)
            if path and not str(path).startswith("/"):
                raise ConfigError(
                    f"tls_config.{key} {path!r} must be an absolute path on the "
                    "control-plane node (it is mounted into the scheduler pod)"
                )
        if not self.filter_verb and not self.prioritize_verb:
            raise ConfigError(
                "filter_verb and prioritize_verb are both empty: the extender would do nothing"
            )
        if (self.prioritize_verb or self.rank_nogpu) and self.weight <= 0:
            raise ConfigError(
                f"weight {self.weight}: an extender with prioritize_verb "
                f"{self.prioritize_verb or NOGPU_VERB!r} must have a positive weight"
            )
        if self.prioritize_verb == NOGPU_VERB:
            raise ConfigError(
                f"prioritize_verb {NOGPU_VERB!r} is the verb of the entry for pods without "
                "GPUs (rank_nogpu); use prioritize"
            )
        for verb_name, verb in (("filter_verb", self.filter_verb),
                                ("prioritize_verb", self.prioritize_verb),
                                ("bind_verb", self.bind_verb)):
            if verb is not None and not re.fullmatch(r"[A-Za-z0-9._~-]*", verb):
                raise ConfigError(f"{verb_name} {verb!r} must be a plain URL path segment")
        if self.http_timeout is not None and not _DURATION_RE.match(self.http_timeout):
            raise ConfigError(
                f"http_timeout {self.http_timeout!r} is not a duration (e.g. '5s', '1m30s')"
            )
        if self.bind_verb and not self.managed_resources:
            raise ConfigError(
                f"bind_verb {self.bind_verb!r} needs managed_resources: without them "
                "kube-scheduler sends every pod to the extender to bind, and gpu-aware binds "
                "only the GPU pods it placed"
            )
        names = [r.name for r in self.managed_resources]
        for name in names:
            if not name:
                raise ConfigError("managed_resources: every entry needs a non-empty name")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"managed_resources lists {', '.join(duplicates)} more than once")

    def tls_files(self) -> dict[str, str]:
        """Volume name -> host file for every tlsConfig file the scheduler must read."""
        if self.tls_config is None:
            return {}
        return {
            name: str(getattr(self.tls_config, key))
            for key, name in VOLUME_TLS.items()
            if getattr(self.tls_config, key)
        }

    def to_yaml(self) -> dict[str, Any]:
        """The extender as KubeSchedulerConfiguration spells it (field order of SPEC §7)."""
        out: dict[str, Any] = {"urlPrefix": self.url_prefix}
        if self.filter_verb:
            out["filterVerb"] = self.filter_verb
        if self.prioritize_verb:
            out["prioritizeVerb"] = self.prioritize_verb
        if self.bind_verb:
            out["bindVerb"] = self.bind_verb
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

    def nogpu_yaml(self) -> dict[str, Any] | None:
        """The second entry when ``rank_nogpu``: the same extender, prioritize only (verb
        ``NOGPU_VERB``), ignorable and without managedResources, so kube-scheduler asks
        it about every pod -- gpu-aware ranks the pods without GPUs where their CPU and
        memory strand the least GPU capacity (``docs/extender.md``) and scores every node
        0 for the others. Ignorable, and kube-scheduler ignores a failed prioritize call
        anyway: pods without GPUs never wait for gpu-aware."""
        if not self.rank_nogpu:
            return None
        out: dict[str, Any] = {
            "urlPrefix": self.url_prefix,
            "prioritizeVerb": NOGPU_VERB,
            "weight": self.weight,
            "enableHTTPS": self.enable_https,
        }
        if self.tls_config is not None:
            out["tlsConfig"] = self.tls_config.to_yaml()
        if self.http_timeout:
            out["httpTimeout"] = self.http_timeout
        out["nodeCacheCapable"] = self.node_cache_capable
        out["ignorable"] = True
        return out

    def entries(self) -> list[dict[str, Any]]:
        """Our entries of ``extenders``: the main one, then the one for pods without GPUs."""
        second = self.nogpu_yaml()
        return [self.to_yaml()] + ([second] if second is not None else [])


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


def merge_profile(config: MutableMapping[str, Any], profile: str, owned: Collection[str]
                  ) -> tuple[list[str], list[str], list[str], list[str]]:
    """The ``profile``'s settings in a configuration file the administrator owns: each
    top-level key of ``packing_profile()`` is written where the file has no such key, or
    where the key is one gpuk8s wrote (``owned``, from the manifest's marker); a key the
    administrator set is left as it is. With ``none`` the keys gpuk8s wrote go again, as
    ``remove_profile`` takes them: one edited since stays, and is no longer gpuk8s'.
    Returns (the keys gpuk8s now owns, the changes, the administrator's keys left, the keys
    gpuk8s wrote that were edited since and stay)."""
    if profile not in PROFILES:
        raise ConfigError(f"scheduler_profile {profile!r} must be one of {', '.join(PROFILES)}")
    wanted = packing_profile() if profile == "packing" else {}
    ours: list[str] = []
    changes: list[str] = []
    left: list[str] = []
    for key, value in wanted.items():
        if key in config and key not in owned:
            left.append(key)
            continue
        ours.append(key)
        if config.get(key) != value:
            config[key] = value
            changes.append(f"{key}: scheduler_profile {profile}")
    dropped, edited = remove_profile(config, [key for key in owned if key not in wanted])
    return ours, changes + dropped, left, edited


def remove_profile(config: MutableMapping[str, Any],
                   owned: Collection[str]) -> tuple[list[str], list[str]]:
    """Remove the profile keys gpuk8s wrote into an administrator's file (``owned``), each
    only while it still holds what ``packing_profile()`` wrote. Returns (the changes, the
    keys left because they were edited since)."""
    written = packing_profile()
    changes: list[str] = []
    edited: list[str] = []
    for key in owned:
        if key not in config:
            continue
        if key in written and config[key] == written[key]:
            del config[key]
            changes.append(f"{key}: removed")
        else:
            edited.append(key)
    return changes, edited


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
    config["extenders"] = spec.entries()
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
    managed: dict[Any, int] = {}
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
        for name in names:  # kube-scheduler: unique across all extenders, too
            if name in managed:
                raise ManifestError(
                    f"{where}: extenders[{managed[name]}] and extenders[{position}] both "
                    f"manage {name}; kube-scheduler refuses a resource managed twice"
                )
            managed[name] = position
    if binders > 1:
        raise ManifestError(f"{where}: only one extender may have a bindVerb, found {binders}")


def entries_at(extenders: Any, url_prefix: str, nogpu: bool | None = False) -> list[int]:
    """Positions of the extender entries that call ``url_prefix`` (trailing slashes aside):
    main entries (``nogpu`` False), entries for pods without GPUs (True), or both (None)."""
    if not isinstance(extenders, Sequence) or isinstance(extenders, str):
        return []
    return [
        position
        for position, entry in enumerate(extenders)
        if isinstance(entry, Mapping)
        and str(entry.get("urlPrefix", "")).rstrip("/") == url_prefix.rstrip("/")
        and (nogpu is None or (entry.get("prioritizeVerb") == NOGPU_VERB) == nogpu)
    ]


def _find_extender(extenders: Sequence[Any], url_prefix: str, nogpu: bool = False) -> int | None:
    """Position of our main entry (``nogpu``: of the entry for pods without GPUs)."""
    found = entries_at(extenders, url_prefix, nogpu)
    return found[0] if found else None


def entry_hash(entry: Mapping[str, Any]) -> str:
    """The content of an extender entry as the marker records it (``Marker.entry_hash``)."""
    text = json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str)
    return config_hash(text)


def our_extender(config: Mapping[str, Any], marker: Marker | None) -> int | None:
    """Position of the entry ``present`` wrote in a configuration file the administrator
    owns: the one at the marker's URL whose content is the marker's entry hash (a
    manifest marked before the hash was recorded: the one at its URL). None when the
    marker claims none -- an entry written by hand, even at our URL, is not ours."""
    extenders = config.get("extenders")
    if marker is None or not marker.url_prefix or not isinstance(extenders, Sequence):
        return None
    at_url = entries_at(extenders, marker.url_prefix)  # the second entry follows the main one
    if not marker.entry_hash:
        return at_url[0] if at_url else None
    for position in at_url:
        if entry_hash(extenders[position]) == marker.entry_hash:
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


BY_URL = -1  # upsert_extender / remove_extender: our entry is the one at the URL


def upsert_extender(
    config: MutableMapping[str, Any], spec: ExtenderSpec, position: int | None = BY_URL
) -> bool:
    """Add our entries to ``config['extenders']`` (appending) or update them in place:
    the main entry at ``position`` (``our_extender``; None: none is ours, append ours
    beside the others -- the manual's "if the file already has extenders, append this
    one"; by default the one at our URL), the entry for pods without GPUs at our URL (by
    its verb), which goes when ``spec.rank_nogpu`` is off."""
    wanted = spec.to_yaml()
    extenders = config.get("extenders")
    if extenders is None:
        config["extenders"] = spec.entries()
        return True
    if not isinstance(extenders, MutableSequence):
        raise ManifestError("extenders is not a list")
    changed = False
    if position == BY_URL:
        position = _find_extender(extenders, spec.url_prefix)
    urls = [spec.url_prefix]  # where the second entry is: beside the main one, which may move
    if position is None:
        extenders.append(wanted)
        changed = True
    else:
        urls.insert(0, str(extenders[position].get("urlPrefix", "")))
        changed = _update_mapping(extenders[position], wanted)
    second = spec.nogpu_yaml()
    at = next((p for p in (_find_extender(extenders, u, nogpu=True) for u in urls)
               if p is not None), None)
    if second is None:
        if at is not None:
            del extenders[at]
            changed = True
    elif at is None:
        extenders.append(second)
        changed = True
    else:
        changed = _update_mapping(extenders[at], second) or changed
    return changed


def find_by_resources(config: Mapping[str, Any], names: Collection[str]) -> str | None:
    """urlPrefix of the one extender managing one of ``names`` (None: none, or several)."""
    found = [
        str(entry.get("urlPrefix", ""))
        for entry in config.get("extenders") or []
        if isinstance(entry, Mapping)
        and {r.get("name") for r in entry.get("managedResources") or [] if isinstance(r, Mapping)}
        & set(names)
    ]
    return found[0] if len(found) == 1 else None


def remove_extender(
    config: MutableMapping[str, Any], url_prefix: str, position: int | None = BY_URL
) -> bool:
    """Drop our entries from ``config['extenders']``: the main one at ``position``
    (``our_extender``; by default the one at ``url_prefix``) and the one for pods
    without GPUs at ``url_prefix``; True when something was removed."""
    extenders = config.get("extenders")
    if not isinstance(extenders, MutableSequence):
        return False
    if position == BY_URL:
        position = _find_extender(extenders, url_prefix)
    if position is not None:  # the second entry sits at the main one's URL
        url_prefix = str(extenders[position].get("urlPrefix", url_prefix))
    found = {p for p in (position, _find_extender(extenders, url_prefix, nogpu=True))
             if p is not None}
    for at in sorted(found, reverse=True):
        del extenders[at]
    return bool(found)


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


def host_path_of(
    manifest: MutableMapping[str, Any], container_path: str, exclude: Collection[str] = ()
) -> str | None:
    """Host path behind ``container_path`` through the scheduler's hostPath mounts.

    The longest mountPath that is the path itself or one of its parents wins; None
    when no hostPath volume covers it. Mounts named in ``exclude`` are not considered.
    """
    container = scheduler_container(manifest)
    volumes = {
        v.get("name"): v.get("hostPath", {}).get("path")
        for v in (manifest["spec"].get("volumes") or [])
        if isinstance(v, MutableMapping) and isinstance(v.get("hostPath"), MutableMapping)
    }
    best: tuple[int, str] | None = None
    for mount in container.get("volumeMounts") or []:
        if not isinstance(mount, MutableMapping) or mount.get("name") in exclude:
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


# --------------------------------------------------------------------------- marker


@dataclass(frozen=True)
class Marker:
    """What ``present`` recorded in the pod's ``ANNOTATION``."""

    config_hash: str
    url_prefix: str
    config_flag: bool  # the --config argument is ours
    # our entry in a configuration file the administrator owns (``entry_hash``), so an
    # entry they wrote at the same URL is told apart; "" in our own file
    entry_hash: str = ""
    # the tlsConfig files' content: kube-scheduler reads them only at start, so renewed
    # certificates change the manifest (the kubelet restarts it); "" without TLS
    tls_hash: str = ""
    # the administrator's file had no ``extenders`` key: ours made it, and removing our
    # entry removes the key again (the file back byte for byte)
    extenders_key: bool = False
    # the scheduler_profile keys written into the administrator's file (merge_profile)
    profile_keys: tuple[str, ...] = ()

    def render(self) -> str:
        data: dict[str, Any] = {"configHash": self.config_hash, "urlPrefix": self.url_prefix,
                                "configFlag": self.config_flag}
        if self.entry_hash:
            data["entryHash"] = self.entry_hash
        if self.tls_hash:
            data["tlsHash"] = self.tls_hash
        if self.extenders_key:
            data["extendersKey"] = True
        if self.profile_keys:
            data["profileKeys"] = list(self.profile_keys)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def config_hash(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _annotations(manifest: Mapping[str, Any]) -> Any:
    metadata = manifest.get("metadata")
    return metadata.get("annotations") if isinstance(metadata, Mapping) else None


def read_marker(manifest: Mapping[str, Any]) -> Marker | None:
    """The marker of a previous ``present``; None when absent or unreadable."""
    annotations = _annotations(manifest)
    raw = annotations.get(ANNOTATION) if isinstance(annotations, Mapping) else None
    try:
        data = json.loads(str(raw)) if raw else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    keys = data.get("profileKeys")
    return Marker(
        config_hash=str(data.get("configHash", "")),
        url_prefix=str(data.get("urlPrefix", "")),
        config_flag=data.get("configFlag") is True,
        entry_hash=str(data.get("entryHash", "")),
        tls_hash=str(data.get("tlsHash", "")),
        extenders_key=data.get("extendersKey") is True,
        profile_keys=tuple(str(k) for k in keys) if isinstance(keys, list) else (),
    )


def _mapping(parent: MutableMapping[str, Any], key: str, where: str) -> MutableMapping[str, Any]:
    """``parent[key]``, created empty when missing; ManifestError when not a mapping."""
    if parent.get(key) is None:
        parent[key] = {}
    child = parent[key]
    if not isinstance(child, MutableMapping):
        raise ManifestError(f"{where} is not a mapping")
    return child


def set_marker(manifest: MutableMapping[str, Any], marker: Marker) -> list[str]:
    metadata = _mapping(manifest, "metadata", "metadata")
    annotations = _mapping(metadata, "annotations", "metadata.annotations")
    value = marker.render()
    if annotations.get(ANNOTATION) == value:
        return []
    annotations[ANNOTATION] = value
    return [f"annotation {ANNOTATION}: configuration {marker.config_hash[:19]}… "
            "(the kubelet restarts kube-scheduler)"]


def drop_marker(manifest: MutableMapping[str, Any]) -> list[str]:
    annotations = _annotations(manifest)
    if not isinstance(annotations, MutableMapping) or ANNOTATION not in annotations:
        return []
    del annotations[ANNOTATION]
    if not annotations:
        del manifest["metadata"]["annotations"]
    return [f"annotation {ANNOTATION}: removed"]


def config_flag_is_ours(manifest: MutableMapping[str, Any], config_path: str) -> bool:
    """Whether ``--config=<config_path>`` was added by ``present`` (not by hand)."""
    container = scheduler_container(manifest)
    if configured_path(container) != config_path:
        return False
    marker = read_marker(manifest)
    if marker is not None:
        return marker.config_flag
    # patched before the marker existed: the flag always came with our config volume
    return _named(container.get("volumeMounts") or [], VOLUME_CONFIG) is not None


# --------------------------------------------------------------------------- manifest


def patch_manifest(
    manifest: MutableMapping[str, Any],
    config_path: str = DEFAULT_CONFIG_PATH,
    kubeconfig: str = DEFAULT_KUBECONFIG,
    tls_files: Mapping[str, str] | None = None,
    own_config: bool = True,
) -> list[str]:
    """Make the scheduler see what our extender needs (in place); returns what changed,
    one line each.

    ``own_config``: the scheduler reads ``config_path``, which we own (the ``--config``
    argument is added when missing, the file and the kubeconfig it names are mounted);
    otherwise the configuration is the administrator's and only the tlsConfig files
    are our concern. A path some other hostPath mount already shows is not mounted
    again; our mounts no longer needed are removed.
    """
    container = scheduler_container(manifest)
    other = configured_path(container)
    if own_config and other is not None and other != config_path:
        raise ManifestError(
            f"the scheduler already runs with --config={other}: add the extender to that file"
        )
    changes: list[str] = []
    if own_config and other is None:
        container["command"].append(f"{_CONFIG_FLAG}={config_path}")
        changes.append(f"command: added {_CONFIG_FLAG}={config_path}")
    wanted: list[tuple[str, str, str]] = []
    if own_config:
        wanted.append((VOLUME_KUBECONFIG, kubeconfig, "FileOrCreate"))
        wanted.append((VOLUME_CONFIG, config_path, "File"))
    wanted += [(name, path, "File") for name, path in sorted((tls_files or {}).items())]
    wanted = [w for w in wanted if host_path_of(manifest, w[1], exclude=OUR_VOLUMES) is None]
    keep = {name for name, _path, _kind in wanted}
    mounts = container.get("volumeMounts")
    volumes = manifest["spec"].get("volumes")
    for name in OUR_VOLUMES:
        if name in keep:
            continue
        for parent, key, items in ((container, "volumeMounts", mounts),
                                   (manifest["spec"], "volumes", volumes)):
            position = _named(items, name) if isinstance(items, MutableSequence) else None
            if position is not None:
                del items[position]  # type: ignore[union-attr]
                changes.append(f"{key}: removed {name}")
                if not items:
                    del parent[key]
    for name, path, kind in wanted:
        mounts = _list(container, "volumeMounts")
        volumes = _list(manifest["spec"], "volumes")
        if _ensure_named(mounts, {"mountPath": path, "name": name, "readOnly": True}):
            changes.append(f"volumeMounts: {name} -> {path} (read-only)")
        if _ensure_named(volumes, {"hostPath": {"path": path, "type": kind}, "name": name}):
            changes.append(f"volumes: {name} hostPath {path} ({kind})")
    return changes


def unpatch_manifest(
    manifest: MutableMapping[str, Any],
    config_path: str = DEFAULT_CONFIG_PATH,
    remove_flag: bool | None = None,
) -> list[str]:
    """Remove exactly what ``patch_manifest`` and ``set_marker`` add (in place); returns
    what changed. The ``--config`` argument goes only when it is ours
    (``config_flag_is_ours``, unless ``remove_flag`` says)."""
    container = scheduler_container(manifest)
    if remove_flag is None:
        remove_flag = config_flag_is_ours(manifest, config_path)
    changes: list[str] = []
    for key in ("command", "args"):
        items = container.get(key)
        if not remove_flag or not isinstance(items, MutableSequence):
            continue
        flag = f"{_CONFIG_FLAG}={config_path}"
        while flag in [str(i) for i in items]:
            del items[[str(i) for i in items].index(flag)]
            changes.append(f"{key}: removed {flag}")
    for parent, key in ((container, "volumeMounts"), (manifest["spec"], "volumes")):
        items = parent.get(key)
        if not isinstance(items, MutableSequence):
            continue
        for name in OUR_VOLUMES:
            position = _named(items, name)
            if position is not None:
                del items[position]
                changes.append(f"{key}: removed {name}")
        if not items and any(c.startswith(f"{key}: removed") for c in changes):
            del parent[key]
    changes += drop_marker(manifest)
    return changes


def check_manifest(manifest: Any, where: str) -> None:
    """Raise ManifestError on what the apiserver would reject in our edits: a mountPath
    twice in the scheduler container, a volume name twice."""
    container = scheduler_container(manifest, where)
    paths = [str(m.get("mountPath", "")).rstrip("/") for m in container.get("volumeMounts") or []
             if isinstance(m, Mapping)]
    twice = sorted({p for p in paths if paths.count(p) > 1})
    if twice:
        raise ManifestError(f"{where}: mountPath {', '.join(twice)} appears more than once")
    names = [v.get("name") for v in manifest["spec"].get("volumes") or [] if isinstance(v, Mapping)]
    twice = sorted({str(n) for n in names if names.count(n) > 1})
    if twice:
        raise ManifestError(f"{where}: volume {', '.join(twice)} appears more than once")

