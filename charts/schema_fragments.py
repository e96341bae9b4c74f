#!/usr/bin/env python3
"""The values.schema.json fragments of Kubernetes-typed values, one source for every chart.

Container `resources`, pod `tolerations`, `nodeSelector` and `affinity` are Kubernetes
objects; the Kubernetes OpenAPI schema (kubeconform's) types them but leaves what only the
apiserver checks (a quantity's syntax, a resource name, the operator and effect of a
toleration, a label's name and value) to the install. These
definitions check that at `helm template` time. helm cannot share a schema file between
charts (a `$ref` to another file resolves against the working directory, or not at all,
depending on the helm version), so this script writes them into the `$defs` of each
chart's values.schema.json; the rest of each schema is edited by hand.

    charts/schema_fragments.py            rewrite the $defs in both charts' schemas
    charts/schema_fragments.py --check    exit 1 when a schema is out of date

Values use them as `{"$ref": "#/$defs/resources"}` and, for a list of tolerations,
`"items": {"$ref": "#/$defs/toleration"}`, and `nodeSelector`/`affinity` as
`{"$ref": "#/$defs/nodeSelector"}`/`{"$ref": "#/$defs/affinity"}`
(tests/unit/test_charts_k8s_values.py checks that every such value does).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

CHARTS = Path(__file__).resolve().parent
SCHEMAS = [CHARTS / name / "values.schema.json" for name in ("metax-gpu-extensions",
                                                             "metax-operator")]

# DNS-1123 subdomain, the prefix of a qualified name (Kubernetes' IsQualifiedName)
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
# resource.Quantity (apimachinery): a non-negative number, then a binary-SI suffix, a
# decimal-SI suffix or a decimal exponent
QUANTITY = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?$"
# what a container may request: the standard resources or a fully qualified extended one
RESOURCE_NAME = rf"^(cpu|memory|ephemeral-storage|hugepages-[0-9]+[KMGTPE]i|{_SUBDOMAIN}/{_NAME})$"

DEFS: dict[str, Any] = {
    "quantity": {
        "description": "A Kubernetes quantity: a non-negative number with an optional suffix "
        "(100m, 0.5, 64Mi, 2Gi, 1e3).",
        "anyOf": [
            {"type": "number", "minimum": 0},
            {"type": "string", "pattern": QUANTITY},
        ],
    },
    "resourceList": {
        "description": "Quantities per resource name (cpu, memory, ephemeral-storage, "
        "hugepages-<size>, or an extended resource domain/name).",
        "type": "object",
        "patternProperties": {RESOURCE_NAME: {"$ref": "#/$defs/quantity"}},
        "additionalProperties": False,
    },
    "resources": {
        "description": "Container resources: requests and limits, as in Kubernetes (claims "
        "are refused: the chart's pods define no resource claims).",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "requests": {"$ref": "#/$defs/resourceList"},
            "limits": {"$ref": "#/$defs/resourceList"},
        },
    },
    "nodeSelector": {
        "description": "Node labels, as a Pod's nodeSelector: a qualified label name "
        "(prefix/name) to a label value.",
        "type": "object",
        "patternProperties": {
            rf"^({_SUBDOMAIN}/)?{_NAME}$": {
                "type": "string",
                "maxLength": 63,
                "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
            },
        },
        "additionalProperties": False,
    },
    "affinity": {
        "description": "A Pod's affinity: nodeAffinity (requiredDuringSchedulingIgnoredDuring"
        "Execution.nodeSelectorTerms, preferredDuringSchedulingIgnoredDuringExecution), "
        "podAffinity, podAntiAffinity.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "nodeAffinity": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["nodeSelectorTerms"],
                        "properties": {
                            "nodeSelectorTerms": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "matchExpressions": {"type": "array"},
                                        "matchFields": {"type": "array"},
                                    },
                                },
                            },
                        },
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": {"type": "array"},
                },
            },
            "podAffinity": {"type": "object"},
            "podAntiAffinity": {"type": "object"},
        },
    },
    "toleration": {
        "description": "A Kubernetes toleration: key, operator (Equal, Exists), value, "
        "effect (NoSchedule, PreferNoSchedule, NoExecute), tolerationSeconds.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "key": {"type": "string", "pattern": rf"^(({_SUBDOMAIN}/)?{_NAME})?$"},
            "operator": {"type": "string", "enum": ["Equal", "Exists"]},
            "value": {
                "type": "string",
                "maxLength": 63,
                "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
            },
            "effect": {
                "type": "string",
                "enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute"],
            },
            "tolerationSeconds": {"type": "integer"},
        },
        "allOf": [
            {
                "description": "Without a key, the operator must be Exists (every taint).",
                "if": {"not": {"required": ["key"], "properties": {"key": {"minLength": 1}}}},
                "then": {"required": ["operator"], "properties": {"operator": {"const": "Exists"}}},
            },
            {
                "description": "With operator Exists, no value.",
                "if": {"required": ["operator"], "properties": {"operator": {"const": "Exists"}}},
                "then": {"properties": {"value": {"const": ""}}},
            },
            {
                "description": "tolerationSeconds only with effect NoExecute.",
                "if": {"required": ["tolerationSeconds"]},
                "then": {"required": ["effect"], "properties": {"effect": {"const": "NoExecute"}}},
            },
        ],
    },
}


def render(text: str) -> str:
    """A schema's text with the shared definitions written into its $defs (in place where
    they are, appended where they are not; everything else as it was)."""
    schema = json.loads(text)
    schema.setdefault("$defs", {}).update(json.loads(json.dumps(DEFS)))
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when out of date")
    args = parser.parse_args(argv)
    stale = []
    for path in SCHEMAS:
        text = path.read_text()
        fresh = render(text)
        if fresh != text:
            stale.append(path)
            if not args.check:
                path.write_text(fresh)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(CHARTS.parent)) for p in stale)
        print(f"{names}: out of date; run: python charts/schema_fragments.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
