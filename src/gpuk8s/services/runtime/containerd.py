"""containerd's side of the runtime wrapper: a runtime handler in its config, a restart, and
proof that containerd serves it.

``configure`` adds the runtime handler ``<handler>`` to the top-level config (a copy of
the default runtime's table, ``options.BinaryName`` = the wrapper, ``container_annotations``
+= ``cdi.k8s.io/*``) and, with ``set_default``, points ``default_runtime_name`` at it;
``unconfigure`` takes exactly that back (restoring the previous default). The file is
edited in its own config version and layout, so the administrator's comments stay: the
handler's table is appended as its own sections under a marker comment (valid after dotted
keys, which may get sub-tables) or put inside an inline ``runtimes`` table, and
``default_runtime_name`` is set in place (tomlkit). The CRI section is the one the file
uses, checked against its version:

* version 1 (no ``version`` key: containerd 1.x reads it so): ``[plugins.cri.containerd]``.
  It is not converted: a faithful conversion needs every plugin's URI, which only
  containerd's plugin registry knows (1.x has no ``config migrate``), and adding
  ``version = 2`` to a file with short plugin keys makes containerd refuse it;
* version 2 (containerd 1.x; 2.x migrates it): ``[plugins."io.containerd.grpc.v1.cri".containerd]``;
* versions 3 and 4 (containerd 2.x; 2.4 writes 4):
  ``[plugins."io.containerd.cri.v1.runtime".containerd]``.

Every edit is read back by a second TOML reader (``tomllib``) and must be the original
plus exactly the handler (runc's options stay runc's), else it is refused naming the
construct (dotted keys, an inline table). A config without a file is containerd's
defaults (``MINIMAL``).

A config the edit cannot be made safe in raises ``RuntimeConfigError`` before anything is
written: it does not parse, its version is unknown, it mixes plugin key styles (containerd
refuses it) or one generation's section names with the other's version, its default
runtime is not runc, it uses the deprecated ``default_runtime`` table (containerd 1.x then
ignores ``default_runtime_name``), a runtime of the handler's name is someone else's, or,
on containerd 1.x, an imported file defines the CRI section: 1.x replaces a whole plugin
section per imported file (containerd#5837; NVIDIA's toolkit copies the entire CRI section
into its drop-in, which then shadows later edits of the main file). containerd 2.x (config
versions 3, 4) merges imported files key by key, the last one last: there the handler goes
into a drop-in of ours (``Configured.drop_in``) read after the others, and the main file is
not changed.

A changed config takes effect when containerd restarts (it does not reload): ``restart``
sends SIGHUP to the process serving the socket (found through the socket's peer
credentials; containerd exits and its service manager restarts it, as NVIDIA's container
toolkit does), or runs ``systemctl restart containerd`` on the host. A containerd started
with SIGHUP ignored (``nohup``, some job runners) ignores it for good: that is read from
``/proc/<pid>/status`` and refused up front. Running containers are not affected: their
shims keep running. Whether containerd really serves the handler is read back through its
CRI (``RuntimeService/Status``, verbose: the CRI plugin's config as containerd loaded it),
never assumed.
"""

from __future__ import annotations

import copy
import fnmatch
import glob
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import tomlkit

from ...core.cdi import CDI_ANNOTATION_PREFIX
from ...core.errors import ConfigError, GpuK8sError
from ...host.serving import peer_pid_or_zero

ANNOTATIONS = (CDI_ANNOTATION_PREFIX + "*",)
RESTART_MODES = ("signal", "systemd", "none")
# the CRI plugin's key per config version
CRI_PLUGINS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime",
               4: "io.containerd.cri.v1.runtime"}
RUNC_TYPES = ("io.containerd.runc.v2", "io.containerd.runc.v1")
CRI_STATUS = "/runtime.v1.RuntimeService/Status"
_VERSION_RE = re.compile(r"^(?P<kind>[a-z-]+)://v?(?P<major>\d+)\.(?P<minor>\d+)")


class RuntimeConfigError(GpuK8sError):
    """The container runtime's config cannot be changed safely, or the runtime does not
    serve it; nothing was left half-done."""


def parse_runtime_version(value: str) -> tuple[str, tuple[int, int] | None]:
    """``containerd://1.6.20~ds1`` -> ("containerd", (1, 6)); unknown -> (kind, None)."""
    match = _VERSION_RE.match(value or "")
    if not match:
        return (value.split("://", 1)[0] if "://" in (value or "") else "unknown"), None
    return match.group("kind"), (int(match.group("major")), int(match.group("minor")))


# ------------------------------------------------------------------------- the config file
def _parse(text: str) -> Any:
    try:
        return tomlkit.parse(text)
    except Exception as err:  # tomlkit raises its own parse errors
        raise RuntimeConfigError(f"containerd config does not parse as TOML ({err}); nothing "
                                 "was changed") from err


def config_version(doc: Any) -> int:
    """The config version as containerd reads it (no ``version`` key: 1)."""
    version = doc.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version not in CRI_PLUGINS:
        raise RuntimeConfigError(
            f"containerd config version {version!r}: only versions 1 and 2 (containerd 1.x) "
            "and 3 and 4 (containerd 2.x) are known; nothing was changed")
    return int(version)


def _cri_plugin(doc: Any) -> str:
    """The CRI plugin's key under ``plugins`` for this document; refuses mixed styles."""
    version = config_version(doc)
    plugins = doc.get("plugins", {})
    if not isinstance(plugins, Mapping):
        raise RuntimeConfigError("containerd config: `plugins` is not a table; nothing was changed")
    for key in plugins:
        uri = str(key).startswith("io.containerd.")
        if version == 1 and uri:
            raise RuntimeConfigError(
                f"containerd config has no `version` key, so containerd reads it as version 1, "
                f"which names plugins by id (`cri`), yet it has [plugins.\"{key}\"]: containerd "
                "would ignore that section; add `version = 2` yourself if that is what you "
                "meant; nothing was changed")
        if version > 1 and not uri:
            raise RuntimeConfigError(
                f"containerd config version {version} names a plugin by id ([plugins.{key}]): "
                f"containerd refuses it (invalid plugin key URI {key!r}); nothing was changed")
        # the section is chosen from what the file uses: a generation's names in a file of
        # the other generation's version are read by one containerd and not the other
        if version == 2 and str(key).startswith("io.containerd.cri.v1."):
            raise RuntimeConfigError(
                f"containerd config says version 2 but has [plugins.\"{key}\"], containerd "
                "2's section (config version 3): containerd 1.x ignores it and containerd 2 "
                "migrates a version 2 file from [plugins.\"io.containerd.grpc.v1.cri\"], so "
                "no section serves the handler on both; set version = 3 if the node runs "
                "containerd 2; nothing was changed")
    if version >= 3 and "containerd" in _mapping(plugins.get(CRI_PLUGINS[2]), "CRI"):
        raise RuntimeConfigError(
            f"containerd config version {version} has [plugins.\"{CRI_PLUGINS[2]}\"."
            f"containerd], containerd 1.x's section: containerd 2 ignores it there and reads "
            f"runtimes from [plugins.\"{CRI_PLUGINS[3]}\".containerd]; nothing was changed")
    return CRI_PLUGINS[version]


def _strict(text: str) -> dict[str, Any]:
    """``text`` as a TOML reader other than the editor reads it (``tomllib`` where the
    Python has it; else tomlkit's own plain values): what the edit is judged by."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        return dict(_parse(text).unwrap())
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise RuntimeConfigError(f"containerd config does not parse as TOML ({err}); nothing "
                                 "was changed") from err


def cri_section_name(doc: Any) -> str:
    return _header(["plugins", _cri_plugin(doc)])


def _header(parts: list[str]) -> str:
    """A table header's dotted key: bare parts as they are, others quoted."""
    return ".".join(p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else json.dumps(p) for p in parts)


def import_patterns(text: str) -> list[str]:
    """The config's ``imports`` (globs; relative ones are relative to the config's dir)."""
    doc = _parse(text)
    imports = doc.get("imports") or []
    return [str(p) for p in imports] if isinstance(imports, list) else []


def resolve_imports(text: str, config_path: str, to_host: Callable[[str], str]) -> dict[str, str]:
    """Imported file (node path) -> its text, read through ``to_host``."""
    found: dict[str, str] = {}
    for pattern in import_patterns(text):
        path = pattern if pattern.startswith("/") else os.path.join(
            os.path.dirname(config_path), pattern)
        for match in sorted(glob.glob(to_host(path))):
            try:
                with open(match, encoding="utf-8") as handle:
                    found[match] = handle.read()
            except OSError:
                continue
    return found


@dataclass(frozen=True)
class Configured:
    text: str
    changed: bool
    previous_default: str | None  # default_runtime_name before (to restore)
    base_binary: str | None  # the default runtime's BinaryName (what the wrapper execs)
    version: int  # the config version the file was edited in
    # node path (relative: to the config's directory): ``text`` is our own drop-in there
    drop_in: str | None = None


def drop_in_name(handler: str) -> str:
    return f"zz-gpuk8s-{handler}.toml"


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """containerd 2's merge of an imported file: key by key, tables recursively."""
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, Mapping) and \
            isinstance(merged.get(key), dict) else copy.deepcopy(value)
    return merged


# A config that does not exist: containerd runs on its built-in defaults (runc the default
# runtime); what the handler is added to then. Version 2: containerd 1.x reads it and 2.x
# migrates it.
MINIMAL = ('version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
           '  default_runtime_name = "runc"\n\n'
           '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
           '  runtime_type = "io.containerd.runc.v2"\n')
_MARK = "# gpuk8s container-runtime: runtime handler {handler!r}; uninstall removes this table"


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RuntimeConfigError(f"containerd config: {where} is not a table; nothing was "
                                 "changed")
    return value


def _binary_key(options: Mapping[str, Any]) -> str | None:
    """The options' key containerd reads as ``BinaryName`` (its TOML decoder matches field
    names case-insensitively: kubespray writes ``binaryName``)."""
    return next((k for k in options if str(k).lower() == "binaryname"), None)


def _dotted(container: Any, key: str) -> bool:
    """Whether ``key`` in a tomlkit container is written with dotted keys (``a.b = 1``)."""
    body = getattr(container, "value", container)
    return any(k is not None and getattr(k, "is_dotted", lambda: False)() and
               str(getattr(k, "key", "")).split(".")[0] == key
               for k, _v in getattr(body, "body", []))


def _construct(doc: Any, plugin: str) -> str:
    """How the CRI's runtimes are written, for a refusal: the construct the edit met."""
    import tomlkit.items as items

    node: Any = doc
    for key, name in (("plugins", "plugins"), (plugin, "the CRI section"),
                      ("containerd", "containerd"), ("runtimes", "runtimes")):
        if not isinstance(node, Mapping) or key not in node:
            break
        if _dotted(node, key):
            return f"dotted keys (`{key}.… = …`) defining {name}"
        node = node[key]
        if isinstance(node, items.InlineTable):
            return f"an inline table (`{key} = {{ … }}`) for {name}"
    return "its layout"


def _render(parts: list[str], table: Mapping[str, Any], indent: str = "") -> str:
    """``table`` as ``[parts]`` and its sub-tables as their own sections."""
    head = f"{indent}[{_header(parts)}]\n"
    subs = ""
    for key, value in table.items():
        if isinstance(value, Mapping):
            subs += _render([*parts, str(key)], value, indent + "  ")
        else:
            head += f"{indent}  {_header([str(key)])} = {tomlkit.item(value).as_string()}\n"
    return head + subs


def _edited(want: dict[str, Any], text: str, what: str) -> None:
    if _strict(text) != want:
        raise RuntimeConfigError(f"containerd config: {what}; nothing was changed")


def configure(text: str, handler: str, binary: str, set_default: bool,
              imported: Mapping[str, str] | None = None) -> Configured:
    """``text`` with the runtime handler added (see the module doc). Pure; raises
    ``RuntimeConfigError`` for a config the edit cannot be made safe in. The result is
    proven by reading it back with another TOML reader: the handler in the CRI's
    ``runtimes`` (runc's options still runc's), the default runtime as asked, and every
    other value as it was; anything else is refused with the construct named."""
    source = text if text.strip() else MINIMAL
    doc = _parse(source)
    plugin = _cri_plugin(doc)
    where = cri_section_name(doc)
    own = drop_in_name(handler)
    others = {p: t for p, t in (imported or {}).items() if os.path.basename(p) != own}
    shadowing = [p for p, t in others.items() if plugin in (_strict(t).get("plugins") or {})]
    if shadowing and config_version(doc) < 3:
        raise RuntimeConfigError(
            f"containerd config imports {shadowing[0]}, which defines [{where}]: containerd "
            "1.x takes each imported file's plugin section whole, so it would shadow the "
            "runtime handler in the main file; nothing was changed")
    if shadowing:
        return _configure_drop_in(source, others, (imported or {}), plugin, handler, binary,
                                  set_default)
    before = _strict(source)
    cri = _mapping(_mapping(before.get("plugins"), "plugins").get(plugin), where)
    section = _mapping(cri.get("containerd"), f"{where}.containerd")
    entry, base_binary = _runtime_entry(section, where, handler, binary)
    previous = section.get("default_runtime_name")
    existing = _mapping(section.get("runtimes"), "runtimes").get(handler)
    want = copy.deepcopy(before)
    want_section = want.setdefault("plugins", {}).setdefault(plugin, {}).setdefault(
        "containerd", {})
    want_section.setdefault("runtimes", {})[handler] = entry
    if set_default:
        want_section["default_runtime_name"] = handler
    previous_default = None if previous == handler else (str(previous) if previous else None)
    version = config_version(doc)
    result = partial(Configured, previous_default=previous_default, base_binary=base_binary,
                     version=version)
    if want == before and text.strip():
        return result(text, False)
    after = source if existing is None else _without_block(source, handler)
    if set_default and previous != handler:
        edit = _parse(after)
        tables = edit
        for key in ("plugins", plugin, "containerd"):
            if key not in tables:
                tables[key] = tomlkit.table(is_super_table=key != "containerd")
            tables = tables[key]
        tables["default_runtime_name"] = handler
        after = tomlkit.dumps(edit)
    runtimes_item = _item(_parse(after), ["plugins", plugin, "containerd", "runtimes"])
    import tomlkit.items as items

    if isinstance(runtimes_item, items.InlineTable):
        edit = _parse(after)
        _item(edit, ["plugins", plugin, "containerd", "runtimes"])[handler] = _inline(entry)
        after = tomlkit.dumps(edit)
    else:
        # a blank line before the marker, or the newline the file's last line lacked: what
        # unconfigure takes away again
        after += "\n" + _MARK.format(handler=handler) + "\n" + _render(
            ["plugins", plugin, "containerd", "runtimes", handler], entry)
    try:
        _edited(want, after, "")
    except RuntimeConfigError:
        raise RuntimeConfigError(
            f"containerd config: the runtime handler cannot be added where containerd reads "
            f"it in [{where}.containerd] written with {_construct(doc, plugin)}; rewrite "
            f"that part as [{where}.containerd.runtimes.<name>] tables; nothing was "
            "changed") from None
    return result(after, True)


def _runtime_entry(section: Mapping[str, Any], where: str, handler: str, binary: str
                   ) -> tuple[dict[str, Any], str | None]:
    """(the handler's table: a copy of the default runtime's with the wrapper as its binary,
    the default runtime's own binary) from the CRI's ``containerd`` table as containerd
    reads it; refuses what cannot be wrapped."""
    legacy = section.get("default_runtime")
    if isinstance(legacy, Mapping) and legacy.get("runtime_type"):
        raise RuntimeConfigError(
            f"containerd config sets [{where}.containerd.default_runtime] (deprecated): "
            "containerd 1.x then ignores default_runtime_name; move it to "
            "runtimes.<name> and name it in default_runtime_name; nothing was changed")
    runtimes = _mapping(section.get("runtimes"), f"{where}.containerd.runtimes")
    previous = section.get("default_runtime_name")
    base_name = str(previous) if previous and previous != handler else "runc"
    base = _mapping(runtimes.get(base_name), f"runtime {base_name!r}")
    existing = runtimes.get(handler)
    if existing is not None and (
            not isinstance(existing, Mapping)
            or (existing.get("options") or {}).get("BinaryName") != binary):
        raise RuntimeConfigError(
            f"containerd config already has a runtime {handler!r} that is not the wrapper "
            f"{binary}: choose another handler name (chart option runtime.handler); nothing "
            "was changed")
    entry: dict[str, Any] = {**base}
    entry.setdefault("runtime_type", "io.containerd.runc.v2")
    if entry["runtime_type"] not in RUNC_TYPES:
        raise RuntimeConfigError(
            f"containerd's default runtime {base_name!r} is of type {entry['runtime_type']}: "
            f"the wrapper wraps runc ({' or '.join(RUNC_TYPES)}); nothing was changed")
    options = dict(_mapping(entry.get("options"), f"runtime {base_name!r} options"))
    binary_key = _binary_key(options)
    base_binary = options.pop(binary_key, None) if binary_key else None
    entry["options"] = {**options, "BinaryName": binary}
    annotations = list(entry.get("container_annotations") or [])
    entry["container_annotations"] = annotations + [a for a in ANNOTATIONS if a not in annotations]
    return entry, str(base_binary) if base_binary else None


def _configure_drop_in(text: str, others: Mapping[str, str], imported: Mapping[str, str],
                       plugin: str, handler: str, binary: str, set_default: bool) -> Configured:
    """containerd 2.x with a drop-in that defines the CRI section (nvidia-ctk's drop-in
    mode, Talos): containerd merges imported files key by key, the last one last, so the
    handler goes into a drop-in of ours that sorts after every other file of the last
    ``imports`` pattern; the config itself is not changed."""
    patterns = import_patterns(text)
    last = patterns[-1]
    own = drop_in_name(handler)
    directory = os.path.dirname(last)
    if not fnmatch.fnmatch(own, os.path.basename(last)):
        raise RuntimeConfigError(
            f"containerd config imports {last!r}: a drop-in of ours there ({own}) would not "
            "be read after the others (a glob such as /etc/containerd/conf.d/*.toml is "
            "needed); nothing was changed")
    later = [p for p in others if os.path.basename(p) > own]
    if later:
        raise RuntimeConfigError(f"containerd config imports {later[0]}, which sorts after our "
                                 f"drop-in {own}; nothing was changed")
    merged = _strict(text)
    for path in others:
        merged = _merge(merged, _strict(others[path]))
    where = _header(["plugins", plugin])
    section = _mapping(_mapping(_mapping(merged.get("plugins"), "plugins").get(plugin), where)
                       .get("containerd"), f"{where}.containerd")
    entry, base_binary = _runtime_entry(section, where, handler, binary)
    previous = section.get("default_runtime_name")
    body: dict[str, Any] = {"default_runtime_name": handler} if set_default else {}
    drop_in = f"version = {config_version(_parse(text))}\n\n" + _MARK.format(
        handler=handler) + "\n"
    if body:
        drop_in += _render(["plugins", plugin, "containerd"], body)
    drop_in += _render(["plugins", plugin, "containerd", "runtimes", handler], entry)
    result = _merge(merged, _strict(drop_in))
    served = result["plugins"][plugin]["containerd"]
    if served["runtimes"].get(handler) != entry or \
            (set_default and served.get("default_runtime_name") != handler):
        raise RuntimeConfigError(f"containerd config: our drop-in {own} would not serve the "
                                 "handler; nothing was changed")
    current = next((t for p, t in imported.items() if os.path.basename(p) == own), None)
    return Configured(drop_in, current != drop_in,
                      None if previous == handler else (str(previous) if previous else None),
                      base_binary, config_version(_parse(text)),
                      drop_in=os.path.join(directory, own))


def _item(doc: Any, path: list[str]) -> Any:
    node = doc
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _inline(value: Mapping[str, Any]) -> Any:
    table = tomlkit.inline_table()
    for key, item in value.items():
        table[key] = _inline(item) if isinstance(item, Mapping) else item
    return table


def _without_block(text: str, handler: str) -> str:
    """``text`` without the table ``configure`` appended for ``handler``: its marker line,
    the blank line before it, and its sections up to the next header of another table."""
    lines = text.splitlines(keepends=True)
    mark = _MARK.format(handler=handler)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == mark), None)
    if start is None:
        return text
    end, own = start + 1, None
    while end < len(lines):
        line = lines[end].strip()
        if line.startswith("["):
            if own is None:
                own = line[:-1]
            elif not line.startswith((own + "]", own + ".")):
                break
        end += 1
    head = lines[:start]
    if head and head[-1] == "\n":
        head.pop()  # the blank line before the marker
    elif head:
        head[-1] = head[-1][:-1]  # the newline the file's last line did not have
    return "".join(head + lines[end:])


def unconfigure(text: str, handler: str, previous_default: str | None) -> tuple[str, bool]:
    """``text`` without the handler; ``default_runtime_name`` back to ``previous_default``
    when it points at the handler. Pure."""
    after = _without_block(text, handler)
    doc = _parse(after)
    try:
        plugin = _cri_plugin(doc)
    except RuntimeConfigError:
        return text, False
    containerd = _item(doc, ["plugins", plugin, "containerd"])
    if not isinstance(containerd, MutableMapping):
        return after, after != text
    runtimes = containerd.get("runtimes")
    if isinstance(runtimes, MutableMapping) and handler in runtimes:
        del runtimes[handler]
    if containerd.get("default_runtime_name") == handler:
        if previous_default:
            containerd["default_runtime_name"] = previous_default
        else:
            del containerd["default_runtime_name"]
    after = tomlkit.dumps(doc)
    return after, after != text


def cdi_enabled(text: str) -> bool:
    """Whether the config turns containerd's own CDI support on (``enable_cdi``)."""
    try:
        doc = _parse(text)
        cri = doc["plugins"][_cri_plugin(doc)]
    except Exception:
        return False
    return bool(cri.get("enable_cdi", False))


# ------------------------------------------------------------------ what containerd serves
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _fields(data: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, value) of a protobuf message: varints and length-delimited only,
    which is all ``StatusResponse`` holds; a fixed-width field ends the walk."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            number_value, pos = _varint(data, pos)
            yield number, number_value
        elif wire == 2:
            size, pos = _varint(data, pos)
            yield number, data[pos:pos + size]
            pos += size
        else:
            return


def status_info(response: bytes) -> dict[str, str]:
    """``StatusResponse.info`` (field 2, ``map<string, string>``) of CRI's runtime.v1."""
    info: dict[str, str] = {}
    for number, entry in _fields(response):
        if number == 2 and isinstance(entry, bytes):
            pair = {n: v for n, v in _fields(entry) if isinstance(v, bytes)}
            info[pair.get(1, b"").decode()] = pair.get(2, b"").decode()
    return info


def cri_config(socket_path: str, timeout: float = 5.0) -> dict[str, Any]:
    """The CRI plugin's config as the running containerd loaded it (CRI ``Status`` with
    ``verbose``; ``info["config"]``, JSON). Raises ``RuntimeConfigError`` when the CRI does
    not answer."""
    import grpc

    try:
        with grpc.insecure_channel(f"unix://{socket_path}") as channel:
            call = channel.unary_unary(CRI_STATUS, request_serializer=None,
                                       response_deserializer=None)
            response = call(b"\x08\x01", timeout=timeout)  # StatusRequest{verbose: true}
    except grpc.RpcError as err:
        raise RuntimeConfigError(f"containerd's CRI on {socket_path} does not answer: "
                                 f"{err.code().name} {err.details()}") from err
    raw = status_info(response).get("config")
    try:
        config = json.loads(raw) if raw else None
    except ValueError:
        config = None
    if not isinstance(config, dict):
        raise RuntimeConfigError(f"containerd's CRI on {socket_path} did not report its config "
                                 "(CRI Status, verbose)")
    return config


def not_served(config: Mapping[str, Any], handler: str, binary: str | None,
               set_default: bool) -> str | None:
    """Why the CRI ``config`` (``cri_config``) does not serve the handler; None when it
    does (``binary`` None: the handler must be absent, as after uninstall)."""
    section = config.get("containerd") or {}
    runtimes = section.get("runtimes") or {}
    entry = runtimes.get(handler)
    if binary is None:
        return f"containerd still serves runtime handler {handler!r}" if entry else None
    if not entry:
        return f"containerd does not serve runtime handler {handler!r}"
    served = (entry.get("options") or {}).get("BinaryName")
    if served != binary:
        return f"containerd's runtime handler {handler!r} runs {served!r}, not {binary}"
    default = section.get("defaultRuntimeName")
    if set_default and default != handler:
        return f"containerd's default runtime is {default!r}, not {handler!r}"
    return None


def cri_cdi_enabled(config: Mapping[str, Any]) -> bool:
    """Whether the running containerd's CRI injects CDI devices itself: ``enable_cdi``
    (1.7, 2.0; default on in 2.x), always on where the option is gone (2.4 reports only
    ``cdiSpecDirs``); 1.6 has neither."""
    return bool(config.get("enableCDI", "cdiSpecDirs" in config))


# ------------------------------------------------------------------------------ restart
def ignores_sighup(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` ignores SIGHUP (``SigIgn`` in /proc/<pid>/status): a Go program such
    as containerd keeps a SIGHUP it was started with ignored, and then never exits on it."""
    try:
        with open(os.path.join(proc, str(pid), "status"), encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    except (OSError, ValueError):
        pass
    return False


def check_mode(mode: str) -> None:
    if mode not in RESTART_MODES:
        raise ConfigError(f"restart mode {mode!r}: choose one of {', '.join(RESTART_MODES)}")


def systemctl(system_root: str, verb: str, unit: str) -> None:
    """``systemctl VERB UNIT`` on the host (chroot into its /)."""
    argv = ["chroot", system_root, "systemctl", verb, unit]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeConfigError(f"{' '.join(argv)} exited with {done.returncode}: "
                                 f"{(done.stderr or done.stdout).strip()}")


def signal_daemon(mode: str, socket_path: str, system_root: str, daemon: str, unit: str,
                  verb: str) -> tuple[str, int]:
    """Make ``daemon`` (the process serving ``socket_path``; systemd's ``unit``) read its
    config again: ``verb`` is ``restart`` (containerd exits on SIGHUP and its service manager
    starts it again) or ``reload`` (dockerd reloads on SIGHUP). (What was done, the pid that
    served the socket before.) Raises ``RuntimeConfigError`` when it cannot be done; the
    caller waits for the result (``wait_for``)."""
    check_mode(mode)
    old = peer_pid_or_zero(socket_path)
    if mode == "none":
        return f"{daemon} not {verb}ed (--restart-mode none): {verb} it to apply the config", old
    if mode == "systemd":
        systemctl(system_root, verb, unit)
        return f"{daemon} {verb}ed with systemctl", old
    if old <= 0:
        raise RuntimeConfigError(
            f"{daemon}'s pid is not visible from here (socket {socket_path}): the signal "
            "restart mode needs hostPID (the chart sets it), or use --restart-mode systemd")
    if verb == "restart" and ignores_sighup(old):
        raise RuntimeConfigError(
            f"{daemon} (pid {old}) ignores SIGHUP: it was started with SIGHUP ignored (e.g. "
            "under nohup), so the signal restart mode cannot restart it; restart "
            f"{daemon} from its service manager, or use --restart-mode systemd")
    os.kill(old, signal.SIGHUP)
    return f"{daemon} {verb}ed (SIGHUP to pid {old})", old


def restart(mode: str, socket_path: str, system_root: str) -> tuple[str, int]:
    """containerd restarted onto its config (``signal_daemon``)."""
    return signal_daemon(mode, socket_path, system_root, "containerd", "containerd", "restart")


def wait_for(what: str, check: Callable[[], str | None], timeout: float) -> None:
    """Poll ``check`` (None: done; else why not yet) until done or ``timeout``; raises
    ``RuntimeConfigError`` with the last reason."""
    deadline = time.monotonic() + timeout
    reason = check()
    while reason is not None:
        if time.monotonic() >= deadline:
            raise RuntimeConfigError(f"{what}: not within {timeout:.0f}s ({reason})")
        time.sleep(0.5)
        reason = check()
