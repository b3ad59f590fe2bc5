"""Every YAML a user may copy from README.md, docs/ and examples/, and the
test data, is valid for every client: it parses with a strict YAML 1.2
parser (ruamel.yaml, pure, duplicate keys refused), with the real kubectl
(sigs.k8s.io/yaml), and with the model library's own reader, kubectl and the
model read the same values from it, and the resources in it pass sluice's
own model.

kubectl is run as `kubectl annotate --local -f FILE k=v -o json`: it reads
the file with the parser `kubectl apply` uses and prints what it read,
without a cluster. The model's reader is run through build/tests/tools/
yaml_to_json. Where kubectl (YAML 1.1 typing) and YAML 1.2 read one scalar
differently, the model must refuse it (test_model_agrees_with_kubectl_or_refuses).

Blocks are ```yaml fences, untyped fences that start resources, and here-
documents with resources inside shell fences (the admin API's curl examples).
Doc snippets show one resource at a time, so a reference to a resource the
snippet does not define, a fragment without `spec`, or a placeholder
certificate body is accepted; any other model error fails the test.
"""

import glob
import json
import os
import re
import shutil
import subprocess

import pytest
import ruamel.yaml as ruamel_yaml  # python3-ruamel.yaml, installed by make deps

from helpers import build_dir

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Model errors a doc snippet may give because it is a snippet.
SNIPPET_ERRORS = (
    re.compile(r': (Backend|Certificate|Consumer|Gateway|Api) "[^"]+" not found'),
    re.compile(r"certificate 1 of the chain does not parse"),
    re.compile(r"private key does not parse"),
    # In-cluster Service names resolve only inside the cluster.
    re.compile(r"\.svc\.cluster\.local:\d+: name does not resolve"),
    # Certificates from Kubernetes Secrets: only the controller's kubernetes
    # mode loads them; --check refuses them, naming that.
    re.compile(r"secretRef.*needs sluice-controller --source kubernetes"),
)
# Another project's resources (cert-manager's) shown next to ours: only the
# syntax applies.
FOREIGN = re.compile(r"^apiVersion: (?!gateway\.sluice\.dev/)", re.M)

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
HEREDOC = re.compile(r"<<-?'?(\w+)'?[^\n]*\n(.*?)^\1$", re.S | re.M)
RESOURCE = re.compile(r"^(apiVersion|kind):", re.M)


def yaml_blocks():
    """(where, text) of every YAML block in the docs and examples."""
    out = []
    md = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    md += [os.path.join(ROOT, "README.md")]
    md += sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.md"), recursive=True))
    for path in md:
        text = open(path, encoding="utf-8").read()
        rel = os.path.relpath(path, ROOT)
        for m in FENCE.finditer(text):
            lang, body = m.group(1), m.group(2)
            line = text.count("\n", 0, m.start()) + 2
            if lang in ("yaml", "yml") or (lang == "" and RESOURCE.search(body)):
                out.append(("%s:%d" % (rel, line), body))
            elif lang in ("sh", "bash", "console", ""):
                for h in HEREDOC.finditer(body):
                    if RESOURCE.search(h.group(2)):
                        hl = line + body.count("\n", 0, h.start()) + 1
                        out.append(("%s:%d" % (rel, hl), h.group(2)))
    files = glob.glob(os.path.join(ROOT, "examples", "**", "*.y*ml"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "tests", "data", "**", "*.y*ml"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "docs", "**", "*.y*ml"), recursive=True)
    # The chart's plain YAML (templates are checked rendered, by test_helm_chart.py).
    files += glob.glob(os.path.join(ROOT, "helm", "*", "*.yaml"))
    files += glob.glob(os.path.join(ROOT, "helm", "*", "crds", "*.yaml"))
    for path in sorted(files):
        out.append((os.path.relpath(path, ROOT), open(path, encoding="utf-8").read()))
    return out


BLOCKS = yaml_blocks()


def strict_yaml12():
    y = ruamel_yaml.YAML(typ="safe", pure=True)
    y.version = (1, 2)
    y.allow_duplicate_keys = False
    return y


def test_the_docs_have_yaml_to_check():
    # Guards the extraction itself: if the fence patterns stop matching, the
    # parametrised tests below would silently check nothing.
    assert len(BLOCKS) >= 8, [w for w, _ in BLOCKS]
    assert any(w.startswith("examples/") for w, _ in BLOCKS)
    assert any(w.startswith("docs/admin-api.md") for w, _ in BLOCKS)


def test_strict_parser_refuses_what_it_must():
    # The checker is only worth something if it refuses: a duplicate key, and
    # an unquoted {id} inside a flow mapping.
    y = strict_yaml12()
    for bad in ("a: 1\na: 2\n", "m: {path: /pets/{id}}\n"):
        with pytest.raises(ruamel_yaml.YAMLError):
            list(y.load_all(bad))


KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


def kubectl_read(path):
    """What kubectl reads from the file: (list of documents, None) or
    (None, its parse error). A document without apiVersion/kind, which
    kubectl parsed but will not annotate, reads as the string "fragment"."""
    r = subprocess.run([KUBECTL, "annotate", "--local", "-f", str(path), "sluice.test/k=v",
                        "-o", "json"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, KUBECONFIG="/dev/null"))
    if r.returncode != 0:
        if "Object 'Kind' is missing" in r.stderr:
            return "fragment", None
        return None, r.stderr.strip()
    items, dec, pos = [], json.JSONDecoder(), 0
    while r.stdout[pos:].strip():  # one JSON object per document
        while r.stdout[pos].isspace():
            pos += 1
        out, pos = dec.raw_decode(r.stdout, pos)
        items += out["items"] if out.get("kind") == "List" and "items" in out else [out]
    for item in items:  # undo the annotation that made kubectl print
        ann = item["metadata"]["annotations"]
        del ann["sluice.test/k"]
        if not ann:
            del item["metadata"]["annotations"]
    return items, None


def model_read(path):
    """What the model library reads: (documents, None) or (None, errors)."""
    r = subprocess.run([os.path.join(build_dir(), "tests", "tools", "yaml_to_json"), str(path)],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        assert r.returncode == 1 and r.stderr.strip(), "yaml_to_json crashed:\n" + r.stderr
        return None, r.stderr.strip()
    return json.loads(r.stdout), None


def numbers_as_json(v):
    """JSON has one number type: 1000.0 and 1000 are the same value."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: numbers_as_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [numbers_as_json(x) for x in v]
    return v


@needs_kubectl
@pytest.mark.parametrize("where,text", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_yaml_block_reads_the_same_in_kubectl_and_the_model(where, text, tmp_path):
    f = tmp_path / "block.yaml"
    f.write_text(text, encoding="utf-8")
    model, merr = model_read(f)
    assert merr is None, "%s: the model's reader refuses it:\n%s" % (where, merr)
    kube, kerr = kubectl_read(f)
    assert kerr is None, "%s: kubectl refuses it:\n%s" % (where, kerr)
    if kube == "fragment":
        return  # parsed; kubectl prints only objects with a kind
    docs = [d for d in model if d is not None]
    assert numbers_as_json(docs) == numbers_as_json(kube), \
        "%s: kubectl and the model read different values" % where


@pytest.mark.parametrize("where,text", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_yaml_block_parses_strictly_and_passes_the_model(where, text, tmp_path):
    docs = [d for d in strict_yaml12().load_all(text) if d is not None]
    assert docs, "%s: no YAML document" % where
    if not RESOURCE.search(text):
        return  # a fragment of a spec: only the syntax applies
    if where.startswith("tests/") or where.startswith("helm/"):
        return  # test data and CRDs: their own tests check what they mean
    if FOREIGN.search(text) and not re.search(r"^apiVersion: gateway\.sluice\.dev/", text, re.M):
        return
    f = tmp_path / "block.yaml"
    f.write_text(text, encoding="utf-8")
    r = subprocess.run([os.path.join(build_dir(), "bin", "sluice-runtime"), "--check",
                        "--config", str(f), "--log-level", "error"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode == 0:
        return
    errors = [ln for ln in r.stderr.splitlines() if "[error]" in ln]
    assert errors, "%s: --check exited %d without an error line:\n%s" % (
        where, r.returncode, r.stderr)
    unexpected = [e for e in errors if not any(p.search(e) for p in SNIPPET_ERRORS)
                  and not e.endswith("spec: required field missing")]
    assert not unexpected, "%s: the model refuses this block:\n%s" % (
        where, "\n".join(unexpected))


# --- the model's reader against kubectl's, scalar by scalar ---------------------

HEAD = "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Api\nmetadata: {name: x}\n"

# Plain scalars where YAML 1.1 (kubectl) and 1.2 may part ways, and some
# where they must not; each is tried as a value and as a key.
SCALARS = ["yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF",
           "y", "Y", "n", "N", "true", "True", "TRUE", "false", "False", "FALSE",
           "null", "Null", "NULL", "~", "017", "010", "08", "019", "007", "0o17", "0x1F", "0X1F",
           "-0x1F", "+0x1F", "0b101", "-0b101", "1_000", "1__0", "1_000.5", "42", "-7", "+3",
           "1.5", "1e3", "1E3", ".5", "+.5", "1.", "-1.5e-3", "12:30", "2001-12-14",
           "0.1.2", "=", "hello", "1_a", "0o8", "0x", "-", ".", "+1_0"]


def documents(text, tmp_path, name):
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    return f


@needs_kubectl
def test_model_agrees_with_kubectl_or_refuses(tmp_path):
    """For every scalar above, as a value and as a key: the model reads what
    kubectl reads, or refuses it with a hint, never a third reading."""
    disagreements, refused = [], []
    for i, sc in enumerate(SCALARS):
        for form in ("value", "key"):
            body = ("spec:\n  v: %s\n" % sc) if form == "value" else ("spec:\n  %s: v\n" % sc)
            f = documents(HEAD + body, tmp_path, "s%d%s.yaml" % (i, form))
            kube, kerr = kubectl_read(f)
            model, merr = model_read(f)
            if merr is not None and kerr is not None:
                continue  # a syntax error for both
            if merr is not None:
                assert "quote" in merr or "not supported" in merr or "out of range" in merr, \
                    "%r as a %s: refused without a hint: %s" % (sc, form, merr)
                refused.append((sc, form))
                continue
            if kerr is not None:
                disagreements.append((sc, form, "kubectl refuses: " + kerr, model))
                continue
            if numbers_as_json(kube[0]["spec"]) != numbers_as_json(model[0]["spec"]):
                disagreements.append((sc, form, kube[0]["spec"], model[0]["spec"]))
    assert not disagreements, "\n".join(repr(d) for d in disagreements)
    # The refusals are the YAML 1.1 readings, not everything.
    for must in ("yes", "on", "Off", "y", "017", "0b101", "1_000", "-0x1F"):
        assert (must, "value") in refused, must
    for must in ("on", "True", "0x1F", "017"):
        assert (must, "key") in refused, must
    for ok in ("true", "42", "0x1F", "0o17", "1.5", "08", "hello", "12:30"):
        assert (ok, "value") not in refused, ok


# Text kubectl refuses; the model refuses it too, with the line and the fix.
KUBECTL_REFUSES = [
    ("spec:\n  operations:\n  - {method: GET, path: /pets/{id}}\n",
     "line 6: a '{' or '}' inside a plain value in a flow mapping: quote the value: \"/pets/{id}\""),
    ("spec:\n  ops:\n  - {m: GET,\n     path: /a/{x}/b/{y}, t: [p]}\n",
     "line 7: a '{' or '}' inside a plain value in a flow mapping: quote the value: \"/a/{x}/b/{y}\""),
    ("spec:\n  paths: [/x/{y}, /z]\n",
     "line 5: a '{' or '}' inside a plain value in a flow sequence: quote the value: \"/x/{y}\""),
    ("spec:\n  a: [x]y\n", "line 5 column"),
    ("spec:\n  a: .inf\n", "infinite and NaN"),
    ("spec:\n  a: *nope\n", "unknown alias"),
]


@needs_kubectl
@pytest.mark.parametrize("body,expect", KUBECTL_REFUSES, ids=[b for b, _ in KUBECTL_REFUSES])
def test_what_kubectl_refuses_the_model_refuses(body, expect, tmp_path):
    f = documents(HEAD + body, tmp_path, "bad.yaml")
    kube, kerr = kubectl_read(f)
    assert kerr is not None, "kubectl reads it: %r" % kube
    model, merr = model_read(f)
    assert merr is not None, "the model reads it: %r" % model
    assert str(f) in merr and expect in merr, merr


def test_the_runtime_and_controller_report_the_hint(tmp_path):
    """--check names the file, the line and the value to quote: the same
    reader serves --config, the controller's files and its REST API."""
    f = documents(HEAD + "spec:\n  basePath: /p\n  operations:\n"
                  "  - {method: GET, path: /pets/{id}}\n", tmp_path, "api.yaml")
    r = subprocess.run([os.path.join(build_dir(), "bin", "sluice-runtime"), "--check",
                        "--config", str(f)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert '%s doc 1: line 7: a \'{\' or \'}\' inside a plain value in a flow mapping: ' \
        'quote the value: "/pets/{id}"' % f in r.stderr, r.stderr


BAD_API = HEAD + "spec:\n  basePath: /p\n  operations:\n  - {method: GET, path: /pets/{id}}\n"
HINT = "line 7: a '{' or '}' inside a plain value in a flow mapping: quote the value: \"/pets/{id}\""


def test_the_controller_rest_api_and_files_report_the_hint(tmp_path):
    """The controller reads YAML the same way from its REST API and from
    --resources files: refused with the line and the value to quote."""
    from controller_env import Controller
    c = Controller(tmp_path / "c").start()
    try:
        status, _, doc = c.rest("POST", "/api/v1/resources", BAD_API, "application/yaml")
        assert status == 400, (status, doc)
        assert [d["message"] for d in doc["error"]["details"]] == [HINT], doc
        status, _, doc = c.rest("POST", "/api/v1/resources", BAD_API.replace(
            "/pets/{id}}", '"/pets/{id}"}').replace("spec:\n", "spec:\n  via: yes\n"),
            "application/yaml")
        assert status == 400 and "yes is the boolean true for kubectl" in \
            doc["error"]["details"][0]["message"], doc
    finally:
        c.stop()
    assert not c.problems(), c.problems()
    f = tmp_path / "api.yaml"
    f.write_text(BAD_API)
    r = subprocess.run(Controller(tmp_path / "d", resources=[str(f)]).argv(),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "%s doc 1: %s" % (f, HINT) in r.stderr, r.stderr
