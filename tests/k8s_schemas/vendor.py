"""How the schema files beside this script were made (run by a developer; the tests only read
them). Each output is one self-contained JSON Schema (its references bundled under `$defs`,
descriptions dropped) so that a test validates a manifest with `jsonschema` alone, offline.

    python tests/k8s_schemas/vendor.py WHEEL_DIR JOBSET_CRD.yaml

WHEEL_DIR: kubernetes-validate 1.37.0 from PyPI, unzipped (`pip download --no-deps
kubernetes-validate==1.37.0`); it holds the Kubernetes API's JSON schemas per release, made
from the API's own OpenAPI document (github.com/kubernetes/kubernetes,
api/openapi-spec). JOBSET_CRD.yaml: config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml
of github.com/kubernetes-sigs/jobset at tag v0.9.1.

The JobSet CRD's schema is made strict here as kubeconform's openapi2jsonschema does: an object
schema with `properties` and no `additionalProperties` gets `additionalProperties: false`, so
a misspelled field is an error (the API server would silently drop it).
"""

import json
import sys
from pathlib import Path

import yaml

K8S = "v1.33.0-local-strict"
HERE = Path(__file__).resolve().parent
KINDS = {"configmap-v1.json": "configmap", "service-v1.json": "service",
         "job-batch-v1.json": "job"}


def _strip(node):
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _refs(node, found):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref.rpartition("/")[2])
        for v in node.values():
            _refs(v, found)
    elif isinstance(node, list):
        for v in node:
            _refs(v, found)


def _rewrite(node):
    if isinstance(node, dict):
        out = {k: _rewrite(v) for k, v in node.items()}
        if isinstance(out.get("$ref"), str):
            out["$ref"] = "#/$defs/" + out["$ref"].rpartition("/")[2]
        return out
    if isinstance(node, list):
        return [_rewrite(v) for v in node]
    return node


def bundle(root: Path, filename: str) -> dict:
    defs_all = json.loads((root / "_definitions.json").read_text())["$defs"]
    top = json.loads((root / filename).read_text())
    need, seen = set(), set()
    _refs(top, need)
    while need - seen:
        name = (need - seen).pop()
        seen.add(name)
        _refs(defs_all[name], need)
    out = _rewrite(_strip(top))
    out["$defs"] = {n: _rewrite(_strip(defs_all[n])) for n in sorted(seen)}
    return out


def strict(node):
    if isinstance(node, dict):
        node = {k: strict(v) for k, v in node.items()}
        if node.get("type") == "object" and "properties" in node and \
                "additionalProperties" not in node and \
                not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def main() -> None:
    wheel, crd = Path(sys.argv[1]), Path(sys.argv[2])
    root = wheel / "kubernetes_validate" / "kubernetes-json-schema" / K8S
    for filename, short in KINDS.items():
        out = bundle(root, filename)
        (HERE / f"k8s-v1.33-{short}.json").write_text(json.dumps(out, sort_keys=True) + "\n")
    doc = yaml.safe_load(crd.read_text())
    version = next(v for v in doc["spec"]["versions"] if v["name"] == "v1alpha2")
    schema = strict(_strip(version["schema"]["openAPIV3Schema"]))
    (HERE / "jobset-v0.9.1-v1alpha2.json").write_text(json.dumps(schema, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
