"""The CRDs of helm/sluice/crds/ are what `sluice-controller --print-crds`
generates from the model's validation tables, they are structural OpenAPI v3
schemas, every client reads them, and they agree with the model: a resource
the model accepts passes the CRD schema, and whatever the CRD schema refuses
the model refuses too (mutations of real resources: wrong types, unknown
fields, values out of range, bad enums).

What OpenAPI cannot express (rules across fields, path template syntax,
PEM contents, a policy's `config`, which depends on its `name`) is left to
the controller; there the model is stricter than the CRD, never the reverse.
"""

import copy
import json
import os
import shutil
import subprocess

import pytest

from helpers import build_dir, REPO

CRDS = os.path.join(REPO, "helm", "sluice", "crds", "sluice-crds.yaml")
KINDS = {"Gateway": "gateways", "Api": "apis", "Backend": "backends", "Consumer": "consumers",
         "Certificate": "certificates"}


def controller():
    return os.path.join(build_dir(), "bin", "sluice-controller")


def yaml_to_json(path, validate=False):
    args = [os.path.join(build_dir(), "tests", "tools", "yaml_to_json")]
    r = subprocess.run(args + (["--validate"] if validate else []) + [str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1) and "Sanitizer" not in r.stderr, r.stderr
    return (json.loads(r.stdout), None) if r.returncode == 0 else (None, r.stderr)


def crds():
    docs, err = yaml_to_json(CRDS)
    assert err is None, err
    return {d["spec"]["names"]["kind"]: d for d in docs}


def test_committed_crds_are_the_generators_output():
    r = subprocess.run([controller(), "--print-crds"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    with open(CRDS, encoding="utf-8") as f:
        committed = f.read()
    assert committed == r.stdout, (
        "helm/sluice/crds/sluice-crds.yaml is stale: regenerate it with "
        "`build/bin/sluice-controller --print-crds > helm/sluice/crds/sluice-crds.yaml`")


def test_crds_names_columns_and_status():
    c = crds()
    assert sorted(c) == sorted(KINDS)
    for kind, d in c.items():
        assert d["apiVersion"] == "apiextensions.k8s.io/v1"
        assert d["metadata"]["name"] == "%s.gateway.sluice.dev" % KINDS[kind]
        spec = d["spec"]
        assert spec["group"] == "gateway.sluice.dev" and spec["scope"] == "Namespaced"
        assert spec["names"]["plural"] == KINDS[kind] and spec["names"]["shortNames"]
        assert spec["names"]["categories"] == ["sluice"]
        (v,) = spec["versions"]
        assert v["name"] == "v1alpha1" and v["served"] and v["storage"]
        assert v["subresources"] == {"status": {}}
        cols = {col["name"]: col["jsonPath"] for col in v["additionalPrinterColumns"]}
        assert cols["Age"] == ".metadata.creationTimestamp"
        assert "Accepted" in cols
    cols = {col["name"]: col["jsonPath"]
            for col in c["Api"]["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert cols["Base Path"] == ".spec.basePath"
    assert cols["Backends"] == ".spec.backendRefs[*].name"
    assert cols["Programmed"] == '.status.conditions[?(@.type=="Programmed")].status'
    short = [d["spec"]["names"]["shortNames"][0] for d in c.values()]
    assert len(set(short)) == 5


def structural_problems(node, path):
    """Kubernetes' structural schema rules that apply to what we generate."""
    out = []
    if not isinstance(node, dict):
        return ["%s: not an object" % path]
    special = node.get("x-kubernetes-int-or-string") or \
        node.get("x-kubernetes-preserve-unknown-fields")
    if "type" not in node and not special:
        out.append("%s: no type" % path)
    if node.get("x-kubernetes-int-or-string") and "type" in node:
        out.append("%s: int-or-string must not have a type" % path)
    for bad in ("$ref", "definitions", "additionalItems", "dependencies", "patternProperties",
                "uniqueItems", "id"):
        if bad in node:
            out.append("%s: %s is not allowed in a CRD schema" % (path, bad))
    for junctor in ("oneOf", "anyOf", "allOf", "not"):
        if junctor in node:
            out.append("%s: %s (keep the generated schemas junctor-free)" % (path, junctor))
    t = node.get("type")
    if t == "object":
        if "properties" not in node and not node.get("x-kubernetes-preserve-unknown-fields") \
                and "additionalProperties" not in node and path.count(".") > 1:
            out.append("%s: an object without properties" % path)
        for k, v in node.get("properties", {}).items():
            out += structural_problems(v, "%s.%s" % (path, k))
        for r in node.get("required", []):
            if r not in node.get("properties", {}):
                out.append("%s: required %s is not a property" % (path, r))
    elif t == "array":
        if "items" not in node:
            out.append("%s: array without items" % path)
        else:
            out += structural_problems(node["items"], path + "[]")
    elif t is not None and t not in ("string", "integer", "number", "boolean"):
        out.append("%s: unknown type %r" % (path, t))
    return out


def test_crd_schemas_are_structural():
    for kind, d in crds().items():
        schema = d["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert schema["properties"]["metadata"] == {"type": "object"}
        problems = structural_problems(schema, kind)
        assert not problems, "\n".join(problems)
        # Only the policies' config and status keep unknown fields.
        keep = []

        def walk(n, p):
            if n.get("x-kubernetes-preserve-unknown-fields"):
                keep.append(p)
            for k, v in n.get("properties", {}).items():
                walk(v, p + "." + k)
            if "items" in n:
                walk(n["items"], p + "[]")
        walk(schema, kind)
        assert all(p.endswith(".config") or p == kind + ".status" for p in keep), keep


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_reads_the_crds():
    r = subprocess.run(["kubectl", "annotate", "--local", "-f", CRDS, "t/k=v", "-o", "json"],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, KUBECONFIG="/dev/null"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count('"kind": "CustomResourceDefinition"') == 5


# --- agreement with the model ------------------------------------------------

try:
    import jsonschema  # python3-jsonschema, installed by make deps
except ImportError:
    jsonschema = None
needs_jsonschema = pytest.mark.skipif(jsonschema is None, reason="python3-jsonschema missing")


def to_jsonschema(node):
    """The CRD schema as JSON Schema, with the API server's strict field
    validation: unknown fields are errors unless preserved."""
    node = copy.deepcopy(node)
    if node.pop("x-kubernetes-int-or-string", False):
        node["type"] = ["integer", "string"]
    keep = node.pop("x-kubernetes-preserve-unknown-fields", False)
    for k in [k for k in node if k.startswith("x-kubernetes-")]:
        del node[k]
    node.pop("format", None)
    if "properties" in node:
        node["properties"] = {k: to_jsonschema(v) for k, v in node["properties"].items()}
        if not keep:
            node["additionalProperties"] = False
    if "items" in node:
        node["items"] = to_jsonschema(node["items"])
    return node


def validators():
    out = {}
    for kind, d in crds().items():
        s = to_jsonschema(d["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        out[kind] = jsonschema.Draft7Validator(s)
    return out


def base_documents():
    docs = []
    for path in ("examples/quickstart.yaml", "tests/data/model/full.yaml"):
        got, err = yaml_to_json(os.path.join(REPO, path), validate=True)
        assert err is None, err
        docs += [d for d in got if d]
    return docs


def model_refuses(doc, tmp_path):
    """The model's errors for one resource, or None when it accepts it."""
    f = tmp_path / "m.yaml"
    f.write_text(json.dumps(doc))  # JSON is YAML: one document
    _, err = yaml_to_json(f, validate=True)
    return err


def leaves(node, path=()):
    """(path, value) of every value under spec, config subtrees excluded."""
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            if k != "config":
                yield from leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, path + (i,))


def set_at(doc, path, value):
    doc = copy.deepcopy(doc)
    n = doc
    for p in path[:-1]:
        n = n[p]
    n[path[-1]] = value
    return doc


@needs_jsonschema
def test_model_valid_resources_pass_the_crd_schema():
    v = validators()
    for doc in base_documents():
        errors = [e.message for e in v[doc["kind"]].iter_errors(doc)]
        assert not errors, "%s %s: %s" % (doc["kind"], doc["metadata"]["name"], errors)


@needs_jsonschema
def test_what_the_crd_refuses_the_model_refuses(tmp_path):
    v = validators()
    checked = refused_by_both = 0
    for doc in base_documents():
        assert model_refuses(doc, tmp_path) is None  # the unmutated resource is valid
        for path, value in list(leaves(doc["spec"], ("spec",))):
            if path == ("spec",):
                continue
            mutations = [{"unexpected": 1}]  # an object where a value is expected
            if isinstance(value, dict):
                mutations = ["not-an-object", set_at(value, ("unknownFieldX",), 1)]
            elif isinstance(value, list):
                mutations = ["not-a-list", []]
            elif isinstance(value, bool):
                mutations.append("true")
            elif isinstance(value, int):
                mutations += [-1, 10 ** 12]
            elif isinstance(value, str):
                mutations += ["", "Not_A_Valid-Value!", 7]
            for m in mutations:
                mutated = set_at(doc, path, m)
                crd_errors = list(v[doc["kind"]].iter_errors(mutated))
                checked += 1
                if not crd_errors:
                    continue
                model = model_refuses(mutated, tmp_path)
                assert model, ("the CRD refuses %s = %r in %s %s (%s) but the model accepts it"
                               % (".".join(map(str, path)), m, doc["kind"],
                                  doc["metadata"]["name"], crd_errors[0].message))
                refused_by_both += 1
    assert checked > 300 and refused_by_both > 150, (checked, refused_by_both)


@needs_jsonschema
def test_type_errors_and_unknown_fields_are_refused_by_both(tmp_path):
    v = validators()
    for doc in base_documents():
        for path, value in list(leaves(doc["spec"], ("spec",)))[1:40]:
            m = set_at(value, ("unknownFieldX",), 1) if isinstance(value, dict) \
                else {"unexpected": 1}
            mutated = set_at(doc, path, m)
            assert list(v[doc["kind"]].iter_errors(mutated)), (path, m)
            assert model_refuses(mutated, tmp_path), (path, m)
