"""Validate Kubernetes manifests against the schemas of Kubernetes and of KEDA's CRDs.

Usage: validate.py --keda-schemas DIR FILE...   (run with infra/k8s-validate's interpreter)

Every document of every FILE is checked: built-in kinds with kubernetes-validate (the
Kubernetes OpenAPI schemas it ships, strict: an unknown field is an error), KEDA kinds
(apiVersion keda.sh/...) against the openAPIV3Schema of the version they name in DIR's CRD
files (keda.sh_<plural>.yaml), made strict the same way: where a schema lists an object's
properties and neither allows others nor preserves unknown fields, another field is an error
(the API server would drop it without a word). A kind neither knows is an error.

Prints one JSON object per document on stdout: file, doc (0-based), kind, name, errors (a list
of messages; empty when valid) and object (the document). tests/tests/k8s_manifests.rs reads it.
"""

import argparse
import copy
import json
import os
import sys

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.33.0"


def strict(schema):
    """A copy of an OpenAPI v3 schema in which listed properties are the only ones allowed."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def keda_schemas(directory):
    """{(group/version, kind): schema} from the CRD files in `directory`."""
    schemas = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith((".yaml", ".yml")):
            continue
        with open(os.path.join(directory, name), encoding="utf-8") as file:
            for crd in yaml.safe_load_all(file):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                group = crd["spec"]["group"]
                kind = crd["spec"]["names"]["kind"]
                for version in crd["spec"]["versions"]:
                    schema = version["schema"]["openAPIV3Schema"]
                    schemas[(f"{group}/{version['name']}", kind)] = strict(schema)
    return schemas


def check(document, keda):
    api_version = document.get("apiVersion", "")
    kind = document.get("kind", "")
    if api_version.startswith("keda.sh/"):
        schema = keda.get((api_version, kind))
        if schema is None:
            return [f"no KEDA schema for {api_version} {kind}"]
        validator = jsonschema.Draft7Validator(schema)
        return [
            f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
            for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
        ]
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path) or "(root)"
        return [f"{path}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [str(error)]
    return []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keda-schemas", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    keda = keda_schemas(args.keda_schemas)
    if not keda:
        sys.exit(f"no KEDA CRD schemas in {args.keda_schemas}")
    for path in args.files:
        with open(path, encoding="utf-8") as file:
            try:
                documents = list(yaml.safe_load_all(file))
            except yaml.YAMLError as error:
                print(json.dumps({"file": path, "doc": 0, "kind": None, "name": None,
                                  "errors": [f"not YAML: {error}"], "object": None}))
                continue
        for index, document in enumerate(d for d in documents if d is not None):
            if not isinstance(document, dict):
                errors, kind, name = ["not a mapping"], None, None
            else:
                errors = check(document, keda)
                kind = document.get("kind")
                name = (document.get("metadata") or {}).get("name")
            print(json.dumps({"file": path, "doc": index, "kind": kind, "name": name,
                              "errors": errors, "object": document}))


if __name__ == "__main__":
    main()
