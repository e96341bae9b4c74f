#!/usr/bin/env python3
"""Turn a kube-apiserver's /openapi/v2 document into kubeconform JSON schemas, offline.

One standalone schema per kind (every $ref inlined), strict (additionalProperties: false
on objects that list their properties), named as kubeconform's default layout expects:
`<kind>-<group>-<version>.json` (core group: `<kind>-<version>.json`), all lower case.
Use with: kubeconform -strict -schema-location 'DIR/{{.ResourceKind}}{{.KindSuffix}}.json'

    schemas.py SWAGGER_JSON OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Types whose wire form is looser than their declared `type: string`.
SPECIAL: dict[str, dict[str, Any]] = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "oneOf": [{"type": "string"}, {"type": "integer"}]
    },
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "oneOf": [{"type": "string"}, {"type": "number"}]
    },
}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """Optional fields may be null in YAML (`key:` with no value), as kubectl accepts."""
    t = schema.get("type")
    if isinstance(t, str):
        return {**schema, "type": [t, "null"]}
    if "oneOf" in schema:
        return {**schema, "oneOf": [*schema["oneOf"], {"type": "null"}]}
    return schema


class Expander:
    def __init__(self, definitions: dict[str, Any]) -> None:
        self.definitions = definitions

    def ref_name(self, ref: str) -> str:
        return ref.rsplit("/", 1)[-1]

    def expand(self, schema: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(schema, list):
            return [self.expand(s, stack) for s in schema]
        if not isinstance(schema, dict):
            return schema
        if "$ref" in schema:
            name = self.ref_name(schema["$ref"])
            if name in SPECIAL:
                return dict(SPECIAL[name])
            if name in stack:  # recursive types (JSONSchemaProps): accept anything below
                return {}
            return self.expand(self.definitions[name], (*stack, name))
        if schema.get("format") == "int-or-string":
            return dict(SPECIAL["io.k8s.apimachinery.pkg.util.intstr.IntOrString"])
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key.startswith("x-kubernetes-") and key != "x-kubernetes-preserve-unknown-fields":
                continue
            if key == "properties":
                required = set(schema.get("required", []))
                out[key] = {
                    p: (self.expand(v, stack) if p in required else nullable(self.expand(v, stack)))
                    for p, v in value.items()
                }
            elif key in ("items", "additionalProperties", "allOf", "anyOf", "oneOf", "not"):
                out[key] = self.expand(value, stack)
            elif key == "description":
                continue
            else:
                out[key] = value
        # Strict: unknown fields are errors, unless the type keeps unknown fields on purpose.
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        out.pop("x-kubernetes-preserve-unknown-fields", None)
        return out


def schema_file_name(gvk: dict[str, str]) -> str:
    kind = gvk["kind"].lower()
    group = gvk.get("group", "").split(".")[0].lower()
    version = gvk["version"].lower()
    return f"{kind}-{group}-{version}.json" if group else f"{kind}-{version}.json"


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    swagger = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    definitions = swagger["definitions"]
    expander = Expander(definitions)
    written = 0
    for name, definition in sorted(definitions.items()):
        for gvk in definition.get("x-kubernetes-group-version-kind", []):
            schema = expander.expand(definition, (name,))
            # apiVersion/kind are fixed for the file: reject mismatches early.
            props = schema.setdefault("properties", {})
            api_version = f"{gvk['group']}/{gvk['version']}" if gvk.get("group") else gvk["version"]
            props["apiVersion"] = {"type": "string", "enum": [api_version]}
            props["kind"] = {"type": "string", "enum": [gvk["kind"]]}
            schema["$schema"] = "http://json-schema.org/schema#"
            (out / schema_file_name(gvk)).write_text(json.dumps(schema, sort_keys=True))
            written += 1
    print(f"wrote {written} schemas to {out}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
