"""Files of the kube-scheduler extender: read, plan, render (no writes).

The YAML side of ``core.schedconf``: files are parsed with ruamel.yaml's round-trip
loader so comments, key order and quoting survive; the indentation style is detected
from the file (kubeadm writes ``mapping 2 / sequence 2 / offset 0``), so removing what
we added gives back the original bytes. Planning produces ``FileChange`` objects; the
caller (the module's ``main()``) writes them atomically.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ..core import schedconf
from ..core.errors import ConfigError, ManifestError

try:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    RUAMEL_IMPORT_ERROR: str | None = None
except ImportError as _err:  # reported by the module with missing_required_lib
    YAML = None  # type: ignore[misc,assignment]
    YAMLError = Exception  # type: ignore[misc,assignment]
    RUAMEL_IMPORT_ERROR = str(_err)

# (mapping, sequence, offset) styles tried, most common first.
_STYLES = ((2, 2, 0), (2, 4, 2), (4, 4, 0), (4, 6, 4), (4, 4, 2), (2, 4, 0))


def _yaml(style: tuple[int, int, int]) -> Any:
    if YAML is None:
        raise ManifestError(f"ruamel.yaml is not installed on the host: {RUAMEL_IMPORT_ERROR}")
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=style[0], sequence=style[1], offset=style[2])

    def null(representer: Any, _data: None) -> Any:  # kubeadm writes `null`, not ``
        return representer.represent_scalar("tag:yaml.org,2002:null", "null")

    yaml.representer.add_representer(type(None), null)
    return yaml


@dataclass
class YamlDoc:
    """A parsed YAML file and the dumper that reproduces its style."""

    path: str
    text: str | None  # None: the file does not exist
    data: Any
    style: tuple[int, int, int] = _STYLES[0]
    exact: bool = True  # False when no known style reproduced the original bytes
    # what comes before the document (directives, comments, its ``---`` line) and after
    # it (a ``...`` line and comments), kept as written: ruamel drops both
    header: str = ""
    footer: str = ""

    def render(self) -> str:
        buffer = io.StringIO()
        _yaml(self.style).dump(self.data, buffer)
        return self.header + buffer.getvalue() + self.footer


# blank, comment and directive lines, then the document start marker on a line of its own
# (a comment on the marker's line stays with the document: ruamel keeps that one)
_HEADER = re.compile(r"(?:[ \t]*(?:[#%][^\n]*)?\n)*---[ \t]*\n")
# the document end marker on a line of its own, then blank and comment lines only
_FOOTER = re.compile(r"(?m)^\.\.\.[ \t]*(?:#[^\n]*)?(?:\n[ \t]*(?:#[^\n]*)?)*\n?\Z")


def parse(text: str, path: str) -> YamlDoc:
    """Parse ``text`` (ManifestError when it is not YAML or not one document). A
    leading ``---`` (with the comments and directives before it) and a trailing
    ``...`` are kept as they are, so an unchanged document renders byte for byte."""
    head = _HEADER.match(text)
    header = head.group(0) if head else ""
    foot = _FOOTER.search(text, len(header))
    footer = foot.group(0) if foot else ""
    try:
        data = _yaml(_STYLES[0]).load(text)
    except YAMLError as err:
        raise ManifestError(f"{path} is not valid YAML: {err}".replace("\n", " ")) from err
    except Exception as err:  # ruamel raises assorted errors on odd input
        raise ManifestError(f"{path} cannot be parsed: {err}".replace("\n", " ")) from err
    doc = YamlDoc(path=path, text=text, data=data, header=header, footer=footer)
    for style in _STYLES:
        doc.style = style
        if doc.render() == text:
            return doc
    doc.style, doc.exact = _STYLES[0], False
    return doc


def read(path: str) -> YamlDoc:
    """The file at ``path``; a missing file gives ``text=None, data=None``."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return YamlDoc(path=path, text=None, data=None)
    except OSError as err:
        raise ManifestError(f"cannot read {path}: {err.strerror or err}") from err
    return parse(text, path)


def fresh(path: str, data: Any) -> YamlDoc:
    return YamlDoc(path=path, text=None, data=data)


@dataclass
class FileChange:
    """One file to write (``after`` text) or remove (``after is None``)."""

    path: str  # on the host, under host_root
    before: str | None
    after: str | None
    kind: str  # "manifest" | "config"

    @property
    def changed(self) -> bool:
        return self.before != self.after


@dataclass
class Plan:
    files: list[FileChange] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    api_version: str | None = None
    mode: str = "own"  # "own": our config file; "appended": extender added to theirs
    config_path: str = schedconf.DEFAULT_CONFIG_PATH  # as the scheduler sees it
    warnings: list[str] = field(default_factory=list)
    flag_ours: bool = False  # the manifest's --config was added by us

    @property
    def changed(self) -> bool:
        return any(f.changed for f in self.files)


@dataclass(frozen=True)
class Request:
    state: str
    spec: schedconf.ExtenderSpec | None
    url_prefix: str | None
    manifest_path: str = schedconf.DEFAULT_MANIFEST
    config_path: str = schedconf.DEFAULT_CONFIG_PATH
    kubeconfig: str = schedconf.DEFAULT_KUBECONFIG
    kubernetes_version: str | None = None
    host_root: str = "/"
    # resource names of our extender: with state=absent, they find it in the
    # administrator's file when neither url_prefix nor the manifest's marker names it
    managed_resources: tuple[str, ...] = ()
    profile: str = "packing"  # schedconf.PROFILES; in another's file where it lacks the keys
    # check mode, the tlsConfig files replaced earlier in the same run (not written yet):
    # their content is not read, the marker's tls_hash is predicted to change
    tls_pending: bool = False


def under_root(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def checked_api_version(request: Request, manifest: Any) -> str:
    """The configuration apiVersion for the scheduler the manifest runs.

    The image tag is the real version; ``kubernetes_version`` is needed only when the
    tag is not a version, and must agree with it otherwise (a v1beta3 file makes a 1.35
    scheduler exit at start)."""
    image_version = schedconf.scheduler_image_version(manifest)
    if request.kubernetes_version and image_version:
        wanted = schedconf.api_version_for(request.kubernetes_version)
        real = schedconf.api_version_for(image_version)
        if wanted != real:
            raise ConfigError(
                f"kubernetes_version {request.kubernetes_version!r} selects {wanted}, but "
                f"{request.manifest_path} runs kube-scheduler {image_version}, which reads "
                f"{real}: drop kubernetes_version (the image tag decides) or correct it"
            )
    version = image_version or request.kubernetes_version
    if not version:
        raise ConfigError(
            "kubernetes_version is not set and the scheduler image tag is not a version: "
            "set kubernetes_version (e.g. 'v1.29.3')"
        )
    return schedconf.api_version_for(version)


def plan(request: Request) -> Plan:
    """Every file change for ``request``; raises GpuK8sError before anything is written."""
    root = request.host_root
    manifest = read(under_root(root, request.manifest_path))
    if manifest.text is None:
        raise ManifestError(
            f"{request.manifest_path} does not exist under host_root {root}: "
            "is this a kubeadm-style control-plane node (static-pod kube-scheduler)?"
        )
    container = schedconf.scheduler_container(manifest.data, request.manifest_path)
    existing = schedconf.configured_path(container)
    result = Plan(config_path=request.config_path)
    if not manifest.exact:
        result.warnings.append(
            f"{request.manifest_path}: indentation style not recognised; the patched file is "
            "re-indented (content, comments and order are kept)"
        )
    result.flag_ours = schedconf.config_flag_is_ours(manifest.data, request.config_path)
    # no --config names config_path and no record of ours: a file there is someone
    # else's (the manual's step before its manifest edit, say), never replaced or removed
    unclaimed = existing is None and schedconf.read_marker(manifest.data) is None
    if existing is not None and not result.flag_ours:
        assert existing is not None
        result.mode = "appended"
        result.config_path = existing
        host = schedconf.host_path_of(manifest.data, existing) or existing
        _plan_foreign(request, manifest.data, host, result)
    elif request.state == "present":
        assert request.spec is not None
        result.api_version = checked_api_version(request, manifest.data)
        config_file = under_root(root, request.config_path)
        current = read(config_file)
        wanted = schedconf.new_config(
            request.spec, result.api_version, request.kubeconfig, request.profile
        )
        text = current.text or ""
        if unclaimed and current.text is not None and current.data != wanted:
            raise ConfigError(
                f"config_path {request.config_path} exists under host_root {root} and is "
                "not one this module wrote (the manifest has neither --config nor the "
                f"{schedconf.ANNOTATION} annotation); it is left as it is. Add "
                f"--config={request.config_path} to the kube-scheduler manifest so that the "
                "extender is added to that file, move the file away, or choose another "
                "config_path"
            )
        if current.data != wanted:
            text = fresh(config_file, wanted).render()
            result.files.append(FileChange(config_file, current.text, text, "config"))
            result.changes.append(f"{request.config_path}: extender {request.spec.url_prefix}")
        result.changes += schedconf.patch_manifest(
            manifest.data, request.config_path, request.kubeconfig, request.spec.tls_files()
        )
        result.changes += schedconf.set_marker(
            manifest.data,
            schedconf.Marker(schedconf.config_hash(text), request.spec.url_prefix, True,
                             tls_hash=tls_hash(request)),
        )
    else:
        config_file = under_root(root, request.config_path)
        current = read(config_file)
        if unclaimed and current.text is not None:
            result.warnings.append(
                f"{request.config_path} is left as it is: no --config in the manifest refers "
                "to it and this module has no record of writing it"
            )
        elif current.text is not None:
            result.files.append(FileChange(config_file, current.text, None, "config"))
            result.changes.append(f"{request.config_path}: removed")
        result.changes += schedconf.unpatch_manifest(manifest.data, request.config_path)
    after = manifest.render()
    if after != manifest.text:
        result.files.append(FileChange(manifest.path, manifest.text, after, "manifest"))
    for change in result.files:
        check(change, request, result)
    return result


# Marker.tls_hash of a check-mode plan whose tlsConfig files are about to be replaced:
# never the hash of real files, so the manifest is predicted to change as the real run's does
TLS_PENDING = "pending"


def tls_hash(request: Request) -> str:
    """The content of the tlsConfig files on the host (``Marker.tls_hash``); "" without
    them. ManifestError when one is missing: the scheduler pod mounts each with type
    File and would not start."""
    assert request.spec is not None
    files = request.spec.tls_files()
    if not files:
        return ""
    if request.tls_pending:
        return TLS_PENDING
    digest = hashlib.sha256()
    for name, path in sorted(files.items()):
        try:
            with open(under_root(request.host_root, path), "rb") as handle:
                digest.update(name.encode() + b"\0" + handle.read() + b"\0")
        except OSError as err:
            raise ManifestError(
                f"tls_config file {path} cannot be read on the host ({err.strerror or err}): "
                "write the certificate files before pointing the scheduler at them"
            ) from err
    return "sha256:" + digest.hexdigest()


def _warn_edited(result: Plan, host: str, edited: list[str]) -> None:
    """Warn of the profile keys gpuk8s wrote into ``host`` that an administrator edited
    since: they stay in the file, no longer gpuk8s' (``schedconf.remove_profile``)."""
    for key in edited:
        result.warnings.append(
            f"{host}: {key}, written by gpuk8s's scheduler_profile, was edited since: "
            "left in place and no longer gpuk8s's; remove it yourself"
        )


def _plan_foreign(request: Request, manifest: Any, host: str, result: Plan) -> None:
    """Our extender in a configuration file the administrator owns (their own --config,
    or ours written by hand per the manual): the entry is added, replaced or removed;
    their flag, volumes and other entries stay as they are."""
    path = under_root(request.host_root, host)
    doc = read(path)
    if doc.text is None:
        raise ManifestError(
            f"the scheduler runs with --config={result.config_path}, but {host} does not "
            "exist on the host"
        )
    schedconf.check_config(doc.data, host)
    assert isinstance(doc.data, MutableMapping)
    result.api_version = str(doc.data.get("apiVersion"))
    marker = schedconf.read_marker(manifest)
    ours = schedconf.our_extender(doc.data, marker)
    if request.state == "present":
        assert request.spec is not None
        url = request.spec.url_prefix
        if ours is None:
            for position in schedconf.entries_at(doc.data.get("extenders"), url, nogpu=None):
                result.warnings.append(
                    f"{host}: extenders[{position}] calls {url} too and was not written by "
                    "gpuk8s: it is left as it is and ours is added beside it, so "
                    "kube-scheduler calls that extender twice; remove one of them"
                )
        elif marker is not None and marker.url_prefix.rstrip("/") != url.rstrip("/"):
            result.changes.append(f"{host}: extender {marker.url_prefix} -> {url} (URL changed)")
        owned = marker.profile_keys if marker is not None else ()
        profile_keys, changes, theirs, edited = schedconf.merge_profile(
            doc.data, request.profile, owned)
        result.changes += [f"{host}: {change}" for change in changes]
        _warn_edited(result, host, edited)
        for key in theirs:
            result.warnings.append(
                f"{host} sets {key} itself: left as it is, so scheduler_profile "
                f"{request.profile}'s {key} is not applied (see core/schedconf.py "
                "packing_profile)"
            )
        made_key = "extenders" not in doc.data or (marker is not None and marker.extenders_key)
        if schedconf.upsert_extender(doc.data, request.spec, ours):
            result.changes.append(f"{host}: extender {url}")
        text = doc.render()
        entries = doc.data["extenders"]
        # appended (ours None): the last main entry at our URL (the second follows it)
        entry = entries[ours if ours is not None else schedconf.entries_at(entries, url)[-1]]
        result.changes += schedconf.patch_manifest(
            manifest, result.config_path, request.kubeconfig, request.spec.tls_files(),
            own_config=False,
        )
        result.changes += schedconf.set_marker(
            manifest,
            schedconf.Marker(schedconf.config_hash(text), url, False,
                             entry_hash=schedconf.entry_hash(entry),
                             tls_hash=tls_hash(request), extenders_key=made_key,
                             profile_keys=tuple(profile_keys)),
        )
    else:
        # only an entry the manifest's record says gpuk8s wrote is removed: without a
        # record (never enabled here, or disabled already) an entry at our URL is the
        # administrator's, however much it looks like ours
        where: int | None = None
        if marker is None:
            looks = request.url_prefix or (
                schedconf.find_by_resources(doc.data, request.managed_resources)
                if request.managed_resources else None)
            if looks and schedconf.entries_at(doc.data.get("extenders"), looks, nogpu=None):
                result.warnings.append(
                    f"{host}: the entry at {looks} is left in place: the manifest has no "
                    "gpuk8s record of writing it (an administrator's own, or one written "
                    "before that record existed: remove it yourself if it is gpu-aware's)"
                )
        elif marker.entry_hash:
            # the entry present wrote, and only that one (a hand-written one stays)
            where = ours
            if ours is None and schedconf.entries_at(doc.data.get("extenders"),
                                                     marker.url_prefix):
                result.warnings.append(
                    f"{host}: the entry at {marker.url_prefix} differs from the one gpuk8s "
                    "wrote (edited by hand?): left in place; remove it yourself"
                )
        else:  # a record from before entry hashes: ours is the one entry at its URL
            at = schedconf.entries_at(doc.data.get("extenders"), marker.url_prefix)
            where = at[0] if len(at) == 1 else None
            if len(at) > 1:
                result.warnings.append(
                    f"{host}: {len(at)} entries call {marker.url_prefix} and the record does "
                    "not say which one gpuk8s wrote: all are left in place; remove ours "
                    "yourself"
                )
        if marker is not None and schedconf.remove_extender(doc.data, marker.url_prefix,
                                                            where):
            result.changes.append(f"{host}: removed extender {marker.url_prefix}")
            if marker.extenders_key and doc.data.get("extenders") == []:
                del doc.data["extenders"]  # ours made the key: the file as it was
        if marker is not None:
            changes, edited = schedconf.remove_profile(doc.data, marker.profile_keys)
            result.changes += [f"{host}: {change}" for change in changes]
            _warn_edited(result, host, edited)
        result.changes += schedconf.unpatch_manifest(manifest, request.config_path,
                                                     remove_flag=False)
    after = doc.render()
    if after != doc.text:
        result.files.append(FileChange(path, doc.text, after, "config"))


def check(change: FileChange, request: Request, result: Plan) -> None:
    """Re-read the text we are about to write and check it says what we meant."""
    if change.after is None:
        return
    doc = parse(change.after, change.path)
    if change.kind == "config":
        schedconf.check_config(doc.data, change.path)
        extenders = doc.data.get("extenders") or []
        urls = [str(e.get("urlPrefix")) for e in extenders]
        if request.state == "present" and request.spec and request.spec.url_prefix not in urls:
            raise ManifestError(f"{change.path}: rendered config lost the extender (bug)")
        return
    schedconf.check_manifest(doc.data, change.path)
    container = schedconf.scheduler_container(doc.data, change.path)
    configured = schedconf.configured_path(container)
    if request.state == "present" and configured != result.config_path:
        raise ManifestError(
            f"{change.path}: rendered manifest runs --config={configured}, expected "
            f"{result.config_path} (bug)"
        )
    if request.state == "absent" and result.flag_ours and configured is not None:
        raise ManifestError(f"{change.path}: rendered manifest still has --config (bug)")
