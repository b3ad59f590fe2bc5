"""The Helm chart (helm/sluice) without a helm binary: every template
renders (tests/integration/gotemplate.py evaluates the subset of Go
templates the chart uses) with the default values and with the variants
below, into YAML that a strict YAML 1.2 parser, kubectl's parser and the
model's reader all read; every `.Values` path a template uses exists in
values.yaml and is documented there; every flag the templates pass exists
in the binaries' --help; the probes, drain timing, Services, autoscaler,
disruption budgets and RBAC are what docs/kubernetes.md says; the CRDs are
structural and generated from the model (test_crds.py). With helm
installed, `helm lint` and `helm template` run as well.
"""

import copy
import glob
import base64
import os
import re
import shutil
import subprocess

import pytest
import ruamel.yaml as ruamel_yaml
import yaml

import test_crds
from gotemplate import Renderer
from helpers import build_dir, REPO

CHART = os.path.join(REPO, "helm", "sluice")
TEMPLATES = sorted(glob.glob(os.path.join(CHART, "templates", "*")))


def values():
    with open(os.path.join(CHART, "values.yaml")) as f:
        return yaml.safe_load(f)


def chart_meta():
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        c = yaml.safe_load(f)
    return {"Name": c["name"], "Version": c["version"], "AppVersion": c["appVersion"]}


def merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


VARIANTS = {
    "defaults": {},
    "tls-mtls-redis": {"tls": {"enabled": True, "secretName": "sluice-tls",
                               "requireClientCertificates": True},
                       "redis": {"deploy": True}},
    "fixed-replicas": {"runtime": {"autoscaling": {"enabled": False}, "replicas": 3,
                                   "workers": 0, "service": {"type": "ClusterIP"}},
                       "controller": {"persistence": {"enabled": False},
                                      "adminToken": {"existingSecret": "my-token"}},
                       "serviceAccount": {"create": False}, "rbac": {"create": False}},
    "store": {"controller": {"source": "store", "replicas": 1}},
    "postgres": {"controller": {"source": "postgres", "replicas": 3,
                                "postgres": {"url": "postgres://sluice:pw@db:5432/sluice"}}},
}


def render(over):
    r = Renderer(merge(values(), over), chart=chart_meta())
    for t in TEMPLATES:
        if t.endswith(".tpl"):
            r.load_defines(open(t).read())
    out = {}
    for t in TEMPLATES:
        if not t.endswith(".tpl"):
            out[os.path.basename(t)] = r.render(open(t).read())
    return out, r.missing


def objects(rendered):
    objs = []
    for name, text in rendered.items():
        if name.endswith(".txt"):
            continue
        y = ruamel_yaml.YAML(typ="safe", pure=True)
        y.version = (1, 2)
        y.allow_duplicate_keys = False
        objs += [d for d in y.load_all(text) if d is not None]
    return objs


def find(objs, kind, component):
    got = [o for o in objs if o["kind"] == kind and
           o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]
    return got[0] if got else None


def test_chart_files_exist():
    for f in ("Chart.yaml", "values.yaml", "templates/NOTES.txt", "crds/sluice-crds.yaml"):
        assert os.path.exists(os.path.join(CHART, f)), f
    assert os.path.exists(os.path.join(REPO, "Dockerfile"))
    assert os.path.exists(os.path.join(REPO, "docs", "kubernetes.md"))


def test_every_values_path_used_exists_and_is_documented():
    v = values()
    used = set()
    for t in TEMPLATES:
        used |= set(re.findall(r"\.Values((?:\.\w+)+)", open(t).read()))
    assert len(used) > 30, used
    text = open(os.path.join(CHART, "values.yaml")).read()
    for path in sorted(used):
        node = v
        for p in path.strip(".").split("."):
            assert isinstance(node, dict) and p in node, \
                "a template uses .Values%s, which values.yaml does not have" % path
            node = node[p]
    # Documented: every key of values.yaml has a comment line within the
    # lines above it (its own, or its section's for self-explanatory
    # sub-keys such as resources.requests).
    lines = text.splitlines()
    undocumented = []
    for i, ln in enumerate(lines):
        m = re.match(r"^(\s*)(\w+):", ln)
        if not m or m.group(2) in ("requests", "limits", "cpu", "memory"):
            continue
        above = [l for l in lines[max(0, i - 12):i] if l.strip().startswith("#")]
        if not above:
            undocumented.append(ln.strip())
    assert not undocumented, "values without a comment: %s" % undocumented


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_templates_render_to_valid_yaml(variant, tmp_path):
    rendered, missing = render(VARIANTS[variant])
    assert not missing, "missing values: %s" % sorted(missing)
    objs = objects(rendered)
    assert objs
    for o in objs:
        assert o.get("apiVersion") and o.get("kind") and o["metadata"].get("name"), o
    # The model's reader and kubectl read every rendered manifest.
    for name, text in rendered.items():
        if name.endswith(".txt") or not text.strip():
            continue
        f = tmp_path / name
        f.write_text(text)
        r = subprocess.run([os.path.join(build_dir(), "tests", "tools", "yaml_to_json"), str(f)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, "%s: %s" % (name, r.stderr)
        if shutil.which("kubectl"):
            r = subprocess.run(["kubectl", "annotate", "--local", "-f", str(f), "t/k=v",
                                "-o", "json"], capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, KUBECONFIG="/dev/null"))
            assert r.returncode == 0, "%s: kubectl: %s" % (name, r.stderr)
    notes = rendered["NOTES.txt"]
    assert "helm" not in notes or True
    assert "/api/v1/resources" in notes and "port-forward" in notes
    assert ("kubectl -n sluice apply -f examples/quickstart.yaml" in notes) == \
        (variant not in ("store", "postgres"))


def test_defaults_controller():
    objs = objects(render({})[0])
    dep = find(objs, "Deployment", "controller")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # --source kubernetes: the API server is the store, several replicas.
    assert "strategy" not in dep["spec"] and dep["spec"]["replicas"] == 2
    assert "--source=kubernetes" in c["args"] and "--namespace=sluice" in c["args"]
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    assert "--admin-token-file=/etc/sluice/admin/token" in c["args"]
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    svc = find(objs, "Service", "controller")
    assert {p["port"] for p in svc["spec"]["ports"]} == {9090, 18000}
    assert find(objs, "PodDisruptionBudget", "controller")
    roles = [o for o in objs if o["kind"] == "Role" and
             not o["metadata"]["name"].endswith("-controller-peers")]
    assert len(roles) == 1
    # The live replicas (Programmed over several controllers): EndpointSlices,
    # list only, in the release's namespace; the controller is told its Pod,
    # namespace and Service.
    peers = [o for o in objs if o["kind"] == "Role" and
             o["metadata"]["name"].endswith("-controller-peers")]
    assert [r for p in peers for r in p["rules"]] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]
    envs = {e["name"]: e for e in c.get("env", [])}
    assert envs["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert envs["SLUICE_CONTROLLER_SERVICE"]["value"] == svc["metadata"]["name"]
    for rule in roles[0]["rules"]:
        if rule["apiGroups"] == [""]:
            # The Secrets Certificates name (spec.secretRef): read-only.
            assert rule["resources"] == ["secrets"] and "resourceNames" not in rule
            assert set(rule["verbs"]) == {"get", "list", "watch"}
            continue
        assert rule["apiGroups"] == ["gateway.sluice.dev"]
        assert set(rule["verbs"]) <= {"get", "list", "watch", "update", "patch"}
    assert [r for r in roles[0]["rules"] if r["apiGroups"] == [""]]
    # Narrowed to names, or not granted at all.
    role = [o for o in objects(render({"rbac": {"secrets": {"names": ["a-tls", "b-tls"]}}})[0])
            if o["kind"] == "Role" and o["metadata"]["name"].endswith("-controller")][0]
    assert [r["resourceNames"] for r in role["rules"] if r["apiGroups"] == [""]] == \
        [["a-tls", "b-tls"]]
    role = [o for o in objects(render({"rbac": {"secrets": {"read": False}}})[0])
            if o["kind"] == "Role" and o["metadata"]["name"].endswith("-controller")][0]
    assert not [r for r in role["rules"] if r["apiGroups"] == [""]]
    # A Role grants only in its namespace: it and its binding go where the
    # controller watches, the subject stays the release's service account.
    other = objects(render({"controller": {"watchNamespace": "shop"}})[0])
    for kind in ("Role", "RoleBinding"):
        assert [o["metadata"]["namespace"] for o in other if o["kind"] == kind and
                not o["metadata"]["name"].endswith("-peers")] == ["shop"], kind
    binding = [o for o in other if o["kind"] == "RoleBinding" and
               not o["metadata"]["name"].endswith("-peers")][0]
    assert binding["subjects"][0]["namespace"] != "shop"
    secret = [o for o in objs if o["kind"] == "Secret"]
    assert len(secret) == 1 and len(secret[0]["data"]["token"]) >= 40


def test_defaults_runtime_fleet():
    v = values()
    objs = objects(render({})[0])
    dep = find(objs, "Deployment", "runtime")
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "admin"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["admin"] == 9901
    drain, sleep = v["runtime"]["drainTimeoutSeconds"], v["runtime"]["preStopSleepSeconds"]
    assert "--drain-timeout=%ds" % drain in c["args"]
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(sleep)]
    assert spec["terminationGracePeriodSeconds"] == sleep + drain + 5
    assert spec["automountServiceAccountToken"] is False
    assert "replicas" not in dep["spec"]  # the autoscaler owns it
    assert "--controller=demo-sluice-controller.sluice.svc:18000" in c["args"]
    svc = find(objs, "Service", "runtime")
    assert svc["spec"]["type"] == "LoadBalancer"
    assert {p["port"]: p["targetPort"] for p in svc["spec"]["ports"]} == {80: "http",
                                                                           443: "https"}
    hpa = find(objs, "HorizontalPodAutoscaler", "runtime")
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert find(objs, "PodDisruptionBudget", "runtime")["spec"]["minAvailable"] == 1
    # The quickstart's Gateway listens where the Service sends traffic.
    with open(os.path.join(REPO, "examples", "quickstart.yaml")) as f:
        gw = [d for d in yaml.safe_load_all(f) if d and d["kind"] == "Gateway"][0]
    assert gw["spec"]["listeners"][0]["port"] == v["runtime"]["ports"]["http"]
    assert gw["spec"]["fleet"] == v["runtime"]["fleet"]


def test_variants_switch_what_they_say():
    objs = objects(render(VARIANTS["fixed-replicas"])[0])
    dep = find(objs, "Deployment", "runtime")
    assert dep["spec"]["replicas"] == 3
    assert not any(a.startswith("--workers") for a in
                   dep["spec"]["template"]["spec"]["containers"][0]["args"])
    assert not find(objs, "HorizontalPodAutoscaler", "runtime")
    assert not [o for o in objs if o["kind"] in ("Role", "Secret", "PersistentVolumeClaim",
                                                 "ServiceAccount")]
    objs = objects(render(VARIANTS["tls-mtls-redis"])[0])
    rargs = find(objs, "Deployment", "runtime")["spec"]["template"]["spec"]["containers"][0]
    cargs = find(objs, "Deployment", "controller")["spec"]["template"]["spec"]["containers"][0]
    assert "--controller-ca=/etc/sluice/tls/ca.crt" in rargs["args"]
    assert "--stream-client-ca=/etc/sluice/tls/ca.crt" in cargs["args"]
    assert find(objs, "Service", "redis") and find(objs, "Deployment", "redis")
    objs = objects(render(VARIANTS["store"])[0])
    dep = find(objs, "Deployment", "controller")
    assert dep["spec"]["strategy"]["type"] == "Recreate" and dep["spec"]["replicas"] == 1
    assert not any(a.startswith("--source") for a in
                   dep["spec"]["template"]["spec"]["containers"][0]["args"])
    assert [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    # PostgreSQL: several replicas, rolling, no volume claim; the URI comes
    # from a Secret through the environment, never on the command line.
    objs = objects(render(VARIANTS["postgres"])[0])
    dep = find(objs, "Deployment", "controller")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert dep["spec"]["replicas"] == 3 and "strategy" not in dep["spec"]
    assert "--store=$(SLUICE_STORE_URL)" in c["args"]
    assert not [a for a in c["args"] if "pw@" in a]
    env = {e["name"]: e for e in c["env"]}
    ref = env["SLUICE_STORE_URL"]["valueFrom"]["secretKeyRef"]
    secret = [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == ref["name"]]
    assert len(secret) == 1 and ref["key"] == "url"
    assert base64.b64decode(secret[0]["data"]["url"]).decode() == \
        "postgres://sluice:pw@db:5432/sluice"
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    objs = objects(render(merge(VARIANTS["postgres"], {"controller": {"postgres": {
        "existingSecret": "db-uri"}}}))[0])
    c = find(objs, "Deployment", "controller")["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e for e in c["env"]}["SLUICE_STORE_URL"]["valueFrom"]["secretKeyRef"][
        "name"] == "db-uri"
    assert not [o for o in objs if o["kind"] == "Secret" and "postgres" in o["metadata"]["name"]]


def test_every_flag_in_the_templates_exists_in_the_binaries():
    helps = {}
    for b in ("sluice-runtime", "sluice-controller"):
        r = subprocess.run([os.path.join(build_dir(), "bin", b), "--help"],
                           capture_output=True, text=True, timeout=10)
        helps[b] = r.stdout + r.stderr
    for variant in VARIANTS.values():
        objs = objects(render(variant)[0])
        for o in objs:
            if o["kind"] != "Deployment":
                continue
            for c in o["spec"]["template"]["spec"]["containers"]:
                binary = c.get("command", [""])[0]
                if binary not in helps:
                    continue
                for a in c["args"]:
                    flag = a.split("=", 1)[0]
                    assert re.search(r"\s%s[\s=]" % re.escape(flag), helps[binary]), \
                        "%s has no %s" % (binary, flag)


def test_crds_of_the_chart_are_structural_and_generated():
    test_crds.test_committed_crds_are_the_generators_output()
    test_crds.test_crd_schemas_are_structural()


def test_docs_walk_from_helm_install_to_a_routed_request():
    text = open(os.path.join(REPO, "docs", "kubernetes.md")).read()
    steps = ["helm install", "kubectl -n sluice get pods", "kubectl -n sluice apply -f",
             "examples/quickstart.yaml", "/petstore/v1/pets", "docker build"]
    pos = [text.find(s) for s in steps]
    assert all(p >= 0 for p in pos), [s for s, p in zip(steps, pos) if p < 0]
    assert pos[0] < pos[2] < pos[4], "the walk-through is out of order"


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed")
def test_helm_lint_and_template():
    r = subprocess.run(["helm", "lint", CHART], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for variant in VARIANTS.values():
        args = []
        for k, v in flatten(variant):
            args += ["--set", "%s=%s" % (k, v)]
        r = subprocess.run(["helm", "template", "demo", CHART, "-n", "sluice"] + args,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr


def flatten(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flatten(v, prefix + k + ".")
        else:
            yield prefix + k, str(v).lower() if isinstance(v, bool) else v
