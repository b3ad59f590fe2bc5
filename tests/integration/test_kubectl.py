"""The controller's Kubernetes-compatible API (controller/kapi.c), driven by
the real kubectl of this machine and by direct HTTP requests.

kubectl gets its own kubeconfig (server http://127.0.0.1:PORT) and its own
--cache-dir in the test's tmp dir; /usr/bin/kubectl is a dispatcher that
picks the kubectl build from GET /version (1.32 here). What is covered:
apply of the quickstart with default (strict, server-side) field validation,
apply again (no request), a change (merge PATCH), get [-o wide|-A|-l|-o
yaml], explain, diff (server dry run that persists nothing), edit, delete
-f, apply --server-side, the 422 causes of an invalid Api, NotFound, a body
over the limit. The direct tests cover what kubectl does not show: JSON
patch, Status shapes, selectors, dryRun, fieldValidation, the /status
subresource, Table cells, the OpenAPI documents, 401 and 413 as Status.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest -q tests/integration/test_kubectl.py
"""

import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from controller_env import QUICKSTART, Controller
from helpers import ResponseReader, http_request, wait_until

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
GV = "/apis/gateway.sluice.dev/v1alpha1"
NS = GV + "/namespaces/default"
MAX_BODY = 65536
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


class Env:
    def __init__(self, tmp_path, extra_args=(), resources=()):
        self.tmp = tmp_path
        self.ctl = Controller(tmp_path / "controller", resources=resources,
                              extra_args=["--max-body-bytes", str(MAX_BODY)] + list(extra_args))
        self.ctl.start()
        self.kubeconfig = str(tmp_path / "kubeconfig")
        self.cache = str(tmp_path / "kube-cache")
        with open(self.kubeconfig, "w") as f:
            f.write("clusters:\n- name: sluice\n  cluster:\n"
                    "    server: \"http://127.0.0.1:%d\"\ncontexts:\n- name: sluice\n"
                    "  context: {cluster: sluice, user: admin, namespace: default}\n"
                    "current-context: sluice\nusers:\n- name: admin\n  user: {}\n"
                    % self.ctl.rest_port)

    def kubectl(self, *args, input=None, env=None, expect=0):
        e = dict(os.environ)
        e.update(env or {})
        e["HOME"] = str(self.tmp)
        r = subprocess.run([KUBECTL, "--kubeconfig", self.kubeconfig, "--cache-dir", self.cache]
                           + list(args), capture_output=True, text=True, input=input,
                           timeout=120, env=e)
        if expect is not None:
            assert r.returncode == expect, "kubectl %s: exit %d\nstdout:%s\nstderr:%s" % (
                " ".join(args), r.returncode, r.stdout, r.stderr)
        return r

    def http(self, method, path, body=None, ctype="application/json", headers=None):
        h = dict(headers or {})
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else (
                body.encode() if isinstance(body, str) else json.dumps(body).encode())
            h["Content-Type"] = ctype
        status, rh, raw = http_request("127.0.0.1", self.ctl.rest_port, method, path,
                                       headers=h, body=data, timeout=30)
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = raw
        return status, dict((k.lower(), v) for k, v in rh), doc

    def close(self):
        self.ctl.stop()
        problems = self.ctl.problems()
        assert not problems, problems


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.close()


def api_doc(name, base_path="/x", labels=None, **spec):
    meta = {"name": name}
    if labels:
        meta["labels"] = labels
    s = {"basePath": base_path, "backendRefs": [{"name": "echo"}],
         "operations": [{"method": "GET", "path": "/a"}]}
    s.update(spec)
    return {"apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Api", "metadata": meta,
            "spec": s}


def accepted(doc):
    conds = (doc.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Accepted" for c in conds)


def computed(env, path):
    """The object at path once the controller has computed its status."""
    def get():
        doc = env.http("GET", path)[2]
        return doc if accepted(doc) else None
    return wait_until(get, 10, what="the controller's status of " + path)


def assert_status(doc, code, reason):
    assert isinstance(doc, dict), doc
    assert doc["kind"] == "Status" and doc["apiVersion"] == "v1", doc
    assert doc["status"] == "Failure" and doc["code"] == code and doc["reason"] == reason, doc
    assert doc["message"], doc


# --- discovery ----------------------------------------------------------------

def test_version_and_discovery(env):
    status, _, v = env.http("GET", "/version")
    assert status == 200 and v["major"] == "1" and v["minor"] == "32", v
    assert v["gitVersion"].startswith("v1.32.0")
    status, _, a = env.http("GET", "/api")
    assert status == 200 and a["kind"] == "APIVersions" and a["versions"] == []
    status, _, g = env.http("GET", "/apis")
    assert g["kind"] == "APIGroupList"
    assert g["groups"][0]["name"] == "gateway.sluice.dev"
    assert g["groups"][0]["preferredVersion"]["groupVersion"] == "gateway.sluice.dev/v1alpha1"
    status, _, grp = env.http("GET", "/apis/gateway.sluice.dev")
    assert status == 200 and grp["kind"] == "APIGroup"
    status, _, rl = env.http("GET", GV)
    assert rl["kind"] == "APIResourceList" and rl["groupVersion"] == "gateway.sluice.dev/v1alpha1"
    byname = {r["name"]: r for r in rl["resources"]}
    assert set(byname) == {"gateways", "apis", "backends", "consumers", "certificates",
                           "gateways/status", "apis/status", "backends/status",
                           "consumers/status", "certificates/status"}
    api = byname["apis"]
    assert api["singularName"] == "api" and api["namespaced"] is True and api["kind"] == "Api"
    assert api["shortNames"] == ["slapi"] and api["categories"] == ["sluice"]
    assert {"get", "list", "create", "update", "patch", "delete"} <= set(api["verbs"])
    assert set(byname["apis/status"]["verbs"]) == {"get", "patch", "update"}
    status, _, nf = env.http("GET", "/apis/other.example.com/v1")
    assert status == 404
    assert_status(nf, 404, "NotFound")


def test_openapi_v3_documents(env):
    status, _, root = env.http("GET", "/openapi/v3")
    assert status == 200
    url = root["paths"]["apis/gateway.sluice.dev/v1alpha1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/gateway.sluice.dev/v1alpha1?hash=")
    status, h, doc = env.http("GET", url)
    assert status == 200 and "immutable" in h["cache-control"], h
    schema = doc["components"]["schemas"]["dev.sluice.gateway.v1alpha1.Api"]
    assert schema["x-kubernetes-group-version-kind"] == [
        {"group": "gateway.sluice.dev", "version": "v1alpha1", "kind": "Api"}]
    # One source of truth: the schema is the CRD's (crd.c), as --print-crds prints it.
    assert "basePath" in schema["properties"]["spec"]["properties"]
    patches = 0
    for path, item in doc["paths"].items():
        op = item.get("patch")
        if not op:
            continue
        patches += 1
        assert op["x-kubernetes-group-version-kind"]["group"] == "gateway.sluice.dev", path
        assert any(p["name"] == "fieldValidation" and p["in"] == "query"
                   for p in op["parameters"]), path
        assert "application/strategic-merge-patch+json" not in op["requestBody"]["content"]
    assert patches == 10  # object and status of each of the five kinds
    # An old hash sends the client to the current document.
    status, h, _ = env.http("GET", "/openapi/v3/apis/gateway.sluice.dev/v1alpha1?hash=00")
    assert status == 301 and h["location"] == url


# --- kubectl ----------------------------------------------------------------

@needs_kubectl
def test_kubectl_apply_get_diff_edit_delete(env, tmp_path):
    r = env.kubectl("apply", "-f", QUICKSTART)
    assert "api.gateway.sluice.dev/petstore created" in r.stdout, r.stdout
    assert "backend.gateway.sluice.dev/echo created" in r.stdout
    _, _, before = env.http("GET", NS + "/apis/petstore")
    rv = before["metadata"]["resourceVersion"]
    last = before["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    assert json.loads(last)["spec"]["basePath"] == "/petstore/v1"

    r = env.kubectl("apply", "-f", QUICKSTART)
    assert "api.gateway.sluice.dev/petstore unchanged" in r.stdout, r.stdout
    _, _, same = env.http("GET", NS + "/apis/petstore")
    assert same["metadata"]["resourceVersion"] == rv

    changed = tmp_path / "changed.yaml"
    with open(QUICKSTART) as f:
        text = f.read()
    changed.write_text(text.replace("basePath: /petstore/v1", "basePath: /petstore/v2"))
    r = env.kubectl("apply", "-f", str(changed))
    assert "api.gateway.sluice.dev/petstore configured" in r.stdout, r.stdout
    _, _, after = env.http("GET", NS + "/apis/petstore")
    assert after["spec"]["basePath"] == "/petstore/v2"
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1

    # get: printer columns, wide, all namespaces, label selector, yaml.
    r = env.kubectl("get", "apis")
    head = r.stdout.splitlines()[0].split()
    assert head[:3] == ["NAME", "BASE", "PATH"] and "AGE" in head, r.stdout
    assert "petstore" in r.stdout and "/petstore/v2" in r.stdout and "echo" in r.stdout
    assert "HOSTS" not in r.stdout
    r = env.kubectl("get", "apis", "-o", "wide")
    assert "HOSTS" in r.stdout.splitlines()[0], r.stdout
    r = env.kubectl("get", "slapi", "-A")
    assert r.stdout.splitlines()[0].split()[0] == "NAMESPACE", r.stdout
    assert "default" in r.stdout and "petstore" in r.stdout
    env.kubectl("label", "api", "petstore", "tier=gold")
    assert "petstore" in env.kubectl("get", "apis", "-l", "tier=gold").stdout
    r = env.kubectl("get", "apis", "-l", "tier=silver")
    assert "petstore" not in r.stdout and "No resources found" in r.stderr, r
    r = env.kubectl("get", "api", "petstore", "-o", "yaml")
    assert "apiVersion: gateway.sluice.dev/v1alpha1" in r.stdout and "kind: Api" in r.stdout
    assert "basePath: /petstore/v2" in r.stdout and "resourceVersion:" in r.stdout
    r = env.kubectl("get", "api", "nope", expect=1)
    assert 'apis.gateway.sluice.dev "nope" not found' in r.stderr, r.stderr

    r = env.kubectl("explain", "api.spec")
    assert "basePath" in r.stdout and "operations" in r.stdout, r.stdout

    # diff: a server-side dry run; exit 1 with the diff, nothing stored.
    _, _, cur = env.http("GET", NS + "/apis/petstore")
    changed.write_text(text.replace("basePath: /petstore/v1", "basePath: /petstore/v3"))
    r = env.kubectl("diff", "-f", str(changed), expect=1)
    assert "-  basePath: /petstore/v2" in r.stdout and "+  basePath: /petstore/v3" in r.stdout, r
    _, _, now = env.http("GET", NS + "/apis/petstore")
    assert now["spec"]["basePath"] == "/petstore/v2"
    assert now["metadata"]["resourceVersion"] == cur["metadata"]["resourceVersion"]

    # edit: the editor is a script that changes the file.
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nsed -i 's#basePath: /petstore/v2#basePath: /edited#' \"$1\"\n")
    editor.chmod(0o755)
    r = env.kubectl("edit", "api", "petstore", env={"KUBE_EDITOR": str(editor),
                                                    "EDITOR": str(editor)})
    assert "edited" in r.stdout, r
    _, _, now = env.http("GET", NS + "/apis/petstore")
    assert now["spec"]["basePath"] == "/edited"

    r = env.kubectl("delete", "-f", QUICKSTART)
    assert 'api.gateway.sluice.dev "petstore" deleted' in r.stdout, r.stdout
    status, _, doc = env.http("GET", NS + "/apis/petstore")
    assert status == 404
    assert_status(doc, 404, "NotFound")


@needs_kubectl
def test_kubectl_server_side_apply(env):
    r = env.kubectl("apply", "--server-side", "-f", QUICKSTART)
    assert "api.gateway.sluice.dev/petstore serverside-applied" in r.stdout, r
    r = env.kubectl("apply", "--server-side", "-f", QUICKSTART)
    assert "serverside-applied" in r.stdout
    status, _, doc = env.http("GET", NS + "/apis/petstore")
    assert status == 200 and doc["spec"]["basePath"] == "/petstore/v1"
    # --dry-run=server persists nothing.
    r = env.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-",
                    input=json.dumps(api_doc("dry")))
    assert "dry" in r.stdout
    status, _, _ = env.http("GET", NS + "/apis/dry")
    assert status == 404


@needs_kubectl
def test_kubectl_server_side_apply_owns_fields(env):
    """Field ownership as on a cluster: a field another manager changed
    conflicts (kubectl names the manager and the field), --force-conflicts
    takes it, and a field removed from the applied file is removed."""
    seed(env)
    doc = api_doc("owned", base_path="/owned", labels={"team": "pay"},
                  timeouts={"request": "5s"})
    applied = json.dumps(doc)
    r = env.kubectl("apply", "--server-side", "-f", "-", input=applied)
    assert "serverside-applied" in r.stdout, r
    r = env.kubectl("get", "api", "owned", "-o", "json", "--show-managed-fields")
    mf = json.loads(r.stdout)["metadata"]["managedFields"]
    assert [(e["manager"], e["operation"]) for e in mf] == [("kubectl", "Apply")], mf
    assert mf[0]["fieldsType"] == "FieldsV1"
    assert "f:basePath" in mf[0]["fieldsV1"]["f:spec"]
    assert "f:team" in mf[0]["fieldsV1"]["f:metadata"]["f:labels"]

    # Someone patches basePath: the next apply of the file conflicts.
    env.kubectl("patch", "api", "owned", "--type", "merge", "-p",
                '{"spec": {"basePath": "/patched"}}')
    r = env.kubectl("apply", "--server-side", "-f", "-", input=applied, expect=1)
    assert 'conflict with "kubectl-patch"' in r.stderr and ".spec.basePath" in r.stderr, r.stderr
    assert env.http("GET", NS + "/apis/owned")[2]["spec"]["basePath"] == "/patched"
    # The same conflict over HTTP: a 409 Status with one cause per field.
    status, _, st = env.http("PATCH", NS + "/apis/owned?fieldManager=kubectl", applied,
                             ctype="application/apply-patch+yaml")
    assert_status(st, 409, "Conflict")
    assert st["details"]["causes"] == [{
        "reason": "FieldManagerConflict", "field": ".spec.basePath",
        "message": 'conflict with "kubectl-patch" using gateway.sluice.dev/v1alpha1'}], st
    r = env.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=applied)
    assert env.http("GET", NS + "/apis/owned")[2]["spec"]["basePath"] == "/owned"

    # The file loses its label and its timeouts: the object loses them.
    del doc["metadata"]["labels"]
    del doc["spec"]["timeouts"]
    env.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
    now = env.http("GET", NS + "/apis/owned")[2]
    assert "labels" not in now["metadata"] and "timeouts" not in now["spec"], now

    # Apply needs a field manager; force only goes with apply.
    status, _, st = env.http("PATCH", NS + "/apis/owned", applied,
                             ctype="application/apply-patch+yaml")
    assert_status(st, 422, "Invalid")
    assert "fieldManager" in st["message"]
    status, _, st = env.http("PATCH", NS + "/apis/owned?force=true", {"spec": {}},
                             ctype="application/merge-patch+json")
    assert_status(st, 422, "Invalid")


@needs_kubectl
def test_kubectl_invalid_api_prints_causes(env):
    bad = api_doc("bad", base_path="no-slash")
    bad["spec"]["operations"] = [{"method": "FETCH", "path": "/a"}]
    r = env.kubectl("create", "-f", "-", input=json.dumps(bad), expect=1)
    assert 'The Api "bad" is invalid' in r.stderr, r.stderr
    assert "* spec.basePath: " in r.stderr and "* spec.operations[0].method: " in r.stderr, r.stderr
    # Unknown fields with default (strict) validation: refused by the server.
    odd = api_doc("odd")
    odd["spec"]["colour"] = "blue"
    r = env.kubectl("apply", "-f", "-", input=json.dumps(odd), expect=1)
    assert 'unknown field "spec.colour"' in r.stderr, r.stderr
    status, _, _ = env.http("GET", NS + "/apis/odd")
    assert status == 404


@needs_kubectl
def test_kubectl_too_large_body(env):
    big = api_doc("big")
    big["metadata"]["annotations"] = {"filler": "x" * (MAX_BODY + 100)}
    r = env.kubectl("create", "-f", "-", input=json.dumps(big), expect=1)
    assert "larger than the limit of %d bytes" % MAX_BODY in r.stderr, r.stderr


# --- direct HTTP ---------------------------------------------------------------

def seed(env):
    status, _, doc = env.http("POST", NS + "/backends", {
        "apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Backend",
        "metadata": {"name": "echo"}, "spec": {"endpoints": [{"address": "127.0.0.1",
                                                               "port": 9}]}})
    assert status == 201, doc


def test_create_get_list_status_shapes(env):
    seed(env)
    status, h, doc = env.http("POST", NS + "/apis", api_doc("a1", labels={"env": "prod"}))
    assert status == 201, doc
    assert doc["apiVersion"] == "gateway.sluice.dev/v1alpha1" and doc["kind"] == "Api"
    m = doc["metadata"]
    assert m["namespace"] == "default" and m["uid"] and m["resourceVersion"] and \
        m["generation"] == 1 and m["creationTimestamp"].endswith("Z")
    status, _, doc = env.http("POST", NS + "/apis", api_doc("a1"))
    assert status == 409
    assert_status(doc, 409, "AlreadyExists")
    assert doc["details"] == {"name": "a1", "group": "gateway.sluice.dev", "kind": "apis"}
    status, _, doc = env.http("GET", NS + "/apis/zz")
    assert_status(doc, 404, "NotFound")
    computed(env, NS + "/apis/a1")
    status, _, doc = env.http("GET", NS + "/apis")
    assert status == 200 and doc["kind"] == "ApiList" and doc["metadata"]["resourceVersion"]
    assert [i["metadata"]["name"] for i in doc["items"]] == ["a1"]
    # Computed status (the controller's): Accepted condition.
    assert accepted(doc["items"][0])
    # namespaces: another one, seen by the all-namespaces list only.
    status, _, doc = env.http("POST", GV + "/namespaces/team-b/apis", api_doc("b1"))
    assert status == 201 and doc["metadata"]["namespace"] == "team-b"
    status, _, doc = env.http("GET", GV + "/apis")
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in doc["items"]] == [
        ("default", "a1"), ("team-b", "b1")]
    status, _, doc = env.http("POST", NS + "/apis", dict(api_doc("c1"), kind="Backend"))
    assert_status(doc, 400, "BadRequest")
    wrong_ns = api_doc("c1")
    wrong_ns["metadata"]["namespace"] = "other"
    status, _, doc = env.http("POST", NS + "/apis", wrong_ns)
    assert_status(doc, 400, "BadRequest")
    status, _, doc = env.http("DELETE", NS + "/apis")
    assert_status(doc, 405, "MethodNotAllowed")
    status, _, doc = env.http("PATCH", NS + "/apis/a1", {"a": 1},
                              ctype="application/strategic-merge-patch+json")
    assert status == 415 and doc["kind"] == "Status" and "--type merge" in doc["message"]
    # 422 with one cause per model error.
    bad = api_doc("bad", base_path="nope")
    del bad["spec"]["operations"]
    status, _, doc = env.http("POST", NS + "/apis", bad)
    assert_status(doc, 422, "Invalid")
    assert doc["details"]["name"] == "bad" and doc["details"]["kind"] == "Api"
    causes = {c["field"]: c for c in doc["details"]["causes"]}
    assert causes["spec.operations"]["reason"] == "FieldValueRequired", causes
    assert causes["spec.basePath"]["reason"] == "FieldValueInvalid", causes
    assert doc["message"].startswith('Api.gateway.sluice.dev "bad" is invalid: ['), doc


def test_put_precondition_and_noop(env):
    seed(env)
    _, _, a = env.http("POST", NS + "/apis", api_doc("a"))
    rv = a["metadata"]["resourceVersion"]
    status, _, same = env.http("PUT", NS + "/apis/a", a)
    assert status == 200 and same["metadata"]["resourceVersion"] == rv  # nothing changed
    a["spec"]["basePath"] = "/y"
    status, _, b = env.http("PUT", NS + "/apis/a", a)
    assert status == 200 and b["spec"]["basePath"] == "/y" and b["metadata"]["generation"] == 2
    a["spec"]["basePath"] = "/z"  # still carries the old resourceVersion
    status, _, doc = env.http("PUT", NS + "/apis/a", a)
    assert_status(doc, 409, "Conflict")
    del a["metadata"]["resourceVersion"]
    status, _, doc = env.http("PUT", NS + "/apis/missing", dict(a, metadata={"name": "missing"}))
    assert_status(doc, 404, "NotFound")
    status, _, doc = env.http("PUT", NS + "/apis/other", a)
    assert_status(doc, 400, "BadRequest")


def test_merge_patch_json_patch_and_apply(env):
    seed(env)
    env.http("POST", NS + "/apis", api_doc("p", labels={"a": "1", "b": "2"}))
    status, _, doc = env.http("PATCH", NS + "/apis/p",
                              {"metadata": {"labels": {"a": None, "c": "3"}},
                               "spec": {"basePath": "/m"}},
                              ctype="application/merge-patch+json")
    assert status == 200, doc
    assert doc["metadata"]["labels"] == {"b": "2", "c": "3"} and doc["spec"]["basePath"] == "/m"
    ops = [{"op": "test", "path": "/spec/basePath", "value": "/m"},
           {"op": "add", "path": "/spec/operations/-", "value": {"method": "POST", "path": "/b"}},
           {"op": "replace", "path": "/spec/basePath", "value": "/j"},
           {"op": "remove", "path": "/metadata/labels/b"},
           {"op": "copy", "from": "/metadata/labels/c", "path": "/metadata/labels/d"},
           {"op": "move", "from": "/metadata/labels/c", "path": "/metadata/labels/e"}]
    status, _, doc = env.http("PATCH", NS + "/apis/p", ops, ctype="application/json-patch+json")
    assert status == 200, doc
    assert doc["spec"]["basePath"] == "/j"
    assert doc["spec"]["operations"][-1] == {"method": "POST", "path": "/b"}
    assert doc["metadata"]["labels"] == {"d": "3", "e": "3"}
    status, _, doc = env.http("PATCH", NS + "/apis/p",
                              [{"op": "test", "path": "/spec/basePath", "value": "/other"}],
                              ctype="application/json-patch+json")
    assert_status(doc, 422, "Invalid")
    status, _, doc = env.http("PATCH", NS + "/apis/p",
                              [{"op": "remove", "path": "/spec/nothing"}],
                              ctype="application/json-patch+json")
    assert_status(doc, 422, "Invalid")
    # A patch that makes the object invalid: 422 with causes, nothing stored.
    status, _, doc = env.http("PATCH", NS + "/apis/p", {"spec": {"basePath": "bad"}},
                              ctype="application/merge-patch+json")
    assert_status(doc, 422, "Invalid")
    assert doc["details"]["causes"][0]["field"] == "spec.basePath"
    status, _, doc = env.http("PATCH", NS + "/apis/none", {"spec": {}},
                              ctype="application/merge-patch+json")
    assert_status(doc, 404, "NotFound")
    # Server-side apply: creates, then merges into the live object.
    yaml_body = ("apiVersion: gateway.sluice.dev/v1alpha1\nkind: Api\nmetadata: {name: s}\n"
                 "spec:\n  basePath: /s\n  backendRefs: [{name: echo}]\n"
                 "  operations: [{method: GET, path: \"/s/{id}\"}]\n")
    status, _, doc = env.http("PATCH", NS + "/apis/s?fieldManager=me&force=true", yaml_body,
                              ctype="application/apply-patch+yaml")
    assert status == 201 and doc["spec"]["operations"][0]["path"] == "/s/{id}", doc
    status, _, doc = env.http("PATCH", NS + "/apis/s?fieldManager=me",
                              yaml_body.replace("basePath: /s", "basePath: /t"),
                              ctype="application/apply-patch+yaml")
    assert status == 200 and doc["spec"]["basePath"] == "/t", doc


def test_dry_run_persists_nothing(env):
    seed(env)
    status, _, doc = env.http("POST", NS + "/apis?dryRun=All", api_doc("d"))
    assert status == 201 and doc["metadata"]["name"] == "d"
    assert env.http("GET", NS + "/apis/d")[0] == 404
    _, _, live = env.http("POST", NS + "/apis", api_doc("d"))
    rv = live["metadata"]["resourceVersion"]
    status, _, doc = env.http("PATCH", NS + "/apis/d?dryRun=All", {"spec": {"basePath": "/dry"}},
                              ctype="application/merge-patch+json")
    assert status == 200 and doc["spec"]["basePath"] == "/dry"
    assert doc["metadata"]["generation"] == 2
    live["spec"]["basePath"] = "/dry2"
    status, _, doc = env.http("PUT", NS + "/apis/d?dryRun=All", live)
    assert status == 200 and doc["spec"]["basePath"] == "/dry2"
    status, _, doc = env.http("DELETE", NS + "/apis/d?dryRun=All")
    assert status == 200
    status, _, doc = env.http("PUT", NS + "/apis/d/status?dryRun=All",
                              dict(live, status={"conditions": []}))
    assert status == 200
    now = computed(env, NS + "/apis/d")
    assert now["spec"]["basePath"] == "/x"
    assert now["metadata"]["resourceVersion"] == rv
    status, _, doc = env.http("POST", NS + "/apis?dryRun=Some", api_doc("e"))
    assert_status(doc, 400, "BadRequest")


def test_field_validation(env):
    seed(env)
    odd = api_doc("f")
    odd["spec"]["colour"] = "blue"
    odd["metadata"]["extra"] = 1
    status, _, doc = env.http("POST", NS + "/apis?fieldValidation=Strict", odd)
    assert_status(doc, 400, "BadRequest")
    assert 'strict decoding error: unknown field "metadata.extra", unknown field "spec.colour"' \
        in doc["message"], doc
    status, h, doc = env.http("POST", NS + "/apis?fieldValidation=Warn", odd)
    assert status == 201 and "colour" not in doc["spec"], doc
    assert 'unknown field \\"spec.colour\\"' in h.get("warning", ""), h
    odd["metadata"]["name"] = "g"
    status, h, doc = env.http("POST", NS + "/apis?fieldValidation=Ignore", odd)
    assert status == 201 and "colour" not in doc["spec"] and "warning" not in h
    odd["metadata"]["name"] = "h"
    status, _, doc = env.http("POST", NS + "/apis?fieldValidation=Loose", odd)
    assert_status(doc, 400, "BadRequest")


def test_selectors(env):
    seed(env)
    for name, labels in [("s1", {"env": "prod", "tier": "a"}), ("s2", {"env": "dev"}),
                         ("s3", {"tier": "b"})]:
        assert env.http("POST", NS + "/apis", api_doc(name, labels=labels))[0] == 201

    def names(query):
        status, _, doc = env.http("GET", NS + "/apis?" + query)
        assert status == 200, doc
        return [i["metadata"]["name"] for i in doc["items"]]

    assert names("labelSelector=env%3Dprod") == ["s1"]
    assert names("labelSelector=env%3D%3Dprod") == ["s1"]
    assert names("labelSelector=env!%3Dprod") == ["s2", "s3"]
    assert names("labelSelector=env%20in%20(prod,dev)") == ["s1", "s2"]
    assert names("labelSelector=env%20notin%20(prod)") == ["s2", "s3"]
    assert names("labelSelector=tier") == ["s1", "s3"]
    assert names("labelSelector=!tier") == ["s2"]
    assert names("labelSelector=tier,env%3Dprod") == ["s1"]
    assert names("fieldSelector=metadata.name%3Ds2") == ["s2"]
    assert names("fieldSelector=metadata.name!%3Ds2") == ["s1", "s3"]
    assert names("fieldSelector=metadata.namespace%3Dother") == []
    assert names("limit=1") == ["s1", "s2", "s3"]  # limit may be ignored; the list is complete
    status, _, doc = env.http("GET", NS + "/apis?fieldSelector=spec.basePath%3D/x")
    assert_status(doc, 400, "BadRequest")
    assert "field label not supported" in doc["message"]
    status, _, doc = env.http("GET", NS + "/apis?labelSelector=a%20in%20b")
    assert_status(doc, 400, "BadRequest")


def test_status_subresource(env, tmp_path):
    seed(env)
    _, _, a = env.http("POST", NS + "/apis", api_doc("st"))
    gen, rv = a["metadata"]["generation"], a["metadata"]["resourceVersion"]
    doc = computed(env, NS + "/apis/st/status")
    assert doc["kind"] == "Api"
    written = {"conditions": [{"type": "Ready", "status": "True", "reason": "External",
                               "message": "set by a client"}]}
    status, _, doc = env.http("PUT", NS + "/apis/st/status", dict(a, status=written))
    assert status == 200 and doc["status"] == written, doc
    assert doc["metadata"]["generation"] == gen
    assert int(doc["metadata"]["resourceVersion"]) > int(rv)
    # From now on the written status is served, by both APIs, also after a spec write.
    assert env.http("GET", NS + "/apis/st")[2]["status"] == written
    assert env.http("GET", "/api/v1/apis/st")[2]["status"] == written
    status, _, doc = env.http("PATCH", NS + "/apis/st", {"spec": {"basePath": "/new"}},
                              ctype="application/merge-patch+json")
    assert status == 200 and doc["status"] == written and doc["metadata"]["generation"] == gen + 1
    status, _, doc = env.http("PATCH", NS + "/apis/st/status",
                              {"status": {"observedGeneration": 7}},
                              ctype="application/merge-patch+json")
    assert status == 200 and doc["status"]["observedGeneration"] == 7
    assert doc["status"]["conditions"] == written["conditions"]
    # A stale resourceVersion on a status write: 409.
    status, _, doc = env.http("PUT", NS + "/apis/st/status", dict(a, status=written))
    assert_status(doc, 409, "Conflict")
    # Durable: a restarted controller serves the written status.
    env.ctl.stop()
    env.ctl.start()
    status, _, doc = env.http("GET", NS + "/apis/st")
    assert doc["status"]["observedGeneration"] == 7
    # A deleted and recreated object starts again with the computed status.
    env.http("DELETE", NS + "/apis/st")
    env.http("POST", NS + "/apis", api_doc("st"))
    assert computed(env, NS + "/apis/st")["status"] != written


def test_table_output(env):
    seed(env)
    env.http("POST", NS + "/apis", api_doc("t", hosts=["a.example.com", "b.example.com"]))
    computed(env, NS + "/apis/t")
    status, h, doc = env.http("GET", NS + "/apis", headers={"Accept": TABLE})
    assert status == 200 and h["content-type"].startswith("application/json;as=Table"), h
    assert doc["kind"] == "Table" and doc["apiVersion"] == "meta.k8s.io/v1"
    cols = [(c["name"], c.get("priority", 0)) for c in doc["columnDefinitions"]]
    assert cols[0] == ("Name", 0) and ("Base Path", 0) in cols and ("Hosts", 1) in cols, cols
    row = doc["rows"][0]
    cells = dict(zip([c[0] for c in cols], row["cells"]))
    assert cells["Name"] == "t" and cells["Base Path"] == "/x" and cells["Backends"] == "echo"
    assert cells["Accepted"] in ("True", "False"), cells
    assert cells["Age"].endswith("s") and cells["Age"][:-1].isdigit(), cells
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == "t"
    status, _, doc = env.http("GET", NS + "/apis?includeObject=Object",
                              headers={"Accept": TABLE})
    assert doc["rows"][0]["object"]["kind"] == "Api" and doc["rows"][0]["object"]["spec"]
    status, _, doc = env.http("GET", NS + "/apis/t", headers={"Accept": TABLE})
    assert doc["kind"] == "Table" and len(doc["rows"]) == 1


def test_body_over_the_limit_is_a_status_or_json_error(env):
    body = b"x" * (MAX_BODY + 1)
    status, h, doc = env.http("POST", NS + "/apis", body)
    assert status == 413
    assert_status(doc, 413, "RequestEntityTooLarge")
    status, h, doc = env.http("POST", "/api/v1/apis", body)
    assert status == 413 and doc["error"]["code"] == "too_large", doc
    # Without Content-Length: a chunked body.
    s = socket.create_connection(("127.0.0.1", env.ctl.rest_port), timeout=10)
    try:
        s.sendall(("POST %s/apis HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                   "\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" % NS).encode())
        chunk = b"y" * 4096
        for _ in range((MAX_BODY // 4096) + 1):
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        s.sendall(b"0\r\n\r\n")
        resp = ResponseReader(s).read_response("POST")
    finally:
        s.close()
    assert resp.status == 413, resp
    assert_status(resp.json(), 413, "RequestEntityTooLarge")


def test_unauthorized_is_a_status(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    # Plain HTTP on loopback to read the Status shapes; kubectl over the
    # generated HTTPS is in test_rest_tls_auto.py.
    e = Env(tmp_path, extra_args=["--admin-token-file", str(token), "--rest-plain-http"])
    try:
        status, h, doc = e.http("GET", NS + "/apis")
        assert status == 401 and "bearer" in h["www-authenticate"].lower()
        assert_status(doc, 401, "Unauthorized")
        status, _, doc = e.http("GET", "/version", headers={"Authorization": "Bearer wrong"})
        assert_status(doc, 401, "Unauthorized")
        status, _, doc = e.http("GET", NS + "/apis",
                                headers={"Authorization": "Bearer s3cret-token"})
        assert status == 200 and doc["kind"] == "ApiList"
        status, _, doc = e.http("GET", "/api/v1/apis")
        assert status == 401 and doc["error"]["code"] == "unauthorized"
    finally:
        e.close()


def test_read_only_resources_mode(tmp_path):
    e = Env(tmp_path, resources=[QUICKSTART])
    try:
        status, _, doc = e.http("GET", NS + "/apis")
        assert status == 200 and [i["metadata"]["name"] for i in doc["items"]] == ["petstore"]
        status, _, doc = e.http("GET", NS + "/apis/petstore")
        assert status == 200 and doc["spec"]["basePath"] == "/petstore/v1"
        status, _, doc = e.http("POST", NS + "/apis", api_doc("new"))
        assert_status(doc, 405, "MethodNotAllowed")
        assert "--resources" in doc["message"]
        status, _, doc = e.http("PATCH", NS + "/apis/petstore", {"spec": {}},
                                ctype="application/merge-patch+json")
        assert_status(doc, 405, "MethodNotAllowed")
        _, _, rl = e.http("GET", GV)
        assert set({r["name"]: r for r in rl["resources"]}["apis"]["verbs"]) <= {
            "get", "list", "watch"}
    finally:
        e.close()


# --- watch (served once the watch hub, controller/watch.c, is merged) ----------

def watch_available(env):
    _, _, rl = env.http("GET", GV)
    return "watch" in {r["name"]: r for r in rl["resources"]}["apis"]["verbs"]


def test_watch_events_and_kubectl_get_w(env):
    assert watch_available(env)  # discovery lists the verb
    import http.client
    seed(env)
    assert env.http("POST", NS + "/apis", api_doc("w0", labels={"w": "yes"}))[0] == 201
    conn = http.client.HTTPConnection("127.0.0.1", env.ctl.rest_port, timeout=10)
    conn.request("GET", NS + "/apis?watch=true&resourceVersion=0&labelSelector=w%3Dyes")
    resp = conn.getresponse()
    assert resp.status == 200

    def event():
        line = resp.readline()
        assert line, "the watch ended"
        ev = json.loads(line)
        assert ev["object"]["apiVersion"] == "gateway.sluice.dev/v1alpha1"
        return ev["type"], ev["object"]["metadata"]["name"]

    assert event() == ("ADDED", "w0")  # the current state first
    env.http("POST", NS + "/apis", api_doc("skip"))  # filtered out by the selector
    env.http("POST", NS + "/apis", api_doc("w1", labels={"w": "yes"}))
    assert event() == ("ADDED", "w1")
    env.http("PATCH", NS + "/apis/w1", {"spec": {"basePath": "/w"}},
             ctype="application/merge-patch+json")
    assert event() == ("MODIFIED", "w1")
    env.http("DELETE", NS + "/apis/w1")
    assert event() == ("DELETED", "w1")
    conn.close()

    if KUBECTL is None:
        return
    p = subprocess.Popen([KUBECTL, "--kubeconfig", env.kubeconfig, "--cache-dir", env.cache,
                          "get", "apis", "--watch"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        env.http("POST", NS + "/apis", api_doc("w2"))
        deadline = time.monotonic() + 15
        seen = ""
        while time.monotonic() < deadline and "w2" not in seen:
            seen += p.stdout.readline()
        assert "w2" in seen, seen
    finally:
        p.terminate()
        p.wait(10)


def test_watch_never_shows_a_private_key(env, tmp_path):
    """A Certificate's events (ADDED, MODIFIED, DELETED: the last stored
    document) go through the same public view as a GET."""
    import http.client
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj", "/CN=w.example",
                    "-addext", "subjectAltName=DNS:w.example", "-keyout", str(key),
                    "-out", str(crt)], check=True, capture_output=True)
    doc = {"apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Certificate",
           "metadata": {"name": "w"},
           "spec": {"certificate": crt.read_text(), "privateKey": key.read_text()}}
    conn = http.client.HTTPConnection("127.0.0.1", env.ctl.rest_port, timeout=10)
    conn.request("GET", NS + "/certificates?watch=true&resourceVersion=0")
    resp = conn.getresponse()
    assert resp.status == 200
    assert env.http("POST", NS + "/certificates", doc)[0] == 201
    env.http("PATCH", NS + "/certificates/w", {"metadata": {"labels": {"x": "y"}}},
             ctype="application/merge-patch+json")
    assert env.http("DELETE", NS + "/certificates/w")[0] == 200
    seen = []
    while len(seen) < 3:
        line = resp.readline()
        assert line, "the watch ended"
        assert b"PRIVATE KEY" not in line, line[:200]
        ev = json.loads(line)
        assert "privateKey" not in ev["object"]["spec"], ev
        seen.append(ev["type"])
    assert seen == ["ADDED", "MODIFIED", "DELETED"]
    conn.close()
