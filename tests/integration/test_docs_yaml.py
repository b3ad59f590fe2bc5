"""Every YAML a user may copy from README.md, docs/ and examples/ is valid
for every client: it parses with a strict YAML 1.2 parser (ruamel.yaml,
pure, duplicate keys refused, as kubectl's sigs.k8s.io/yaml does), and the
resources in it pass sluice's own model.

Blocks are ```yaml fences, untyped fences that start resources, and here-
documents with resources inside shell fences (the admin API's curl examples).
Doc snippets show one resource at a time, so a reference to a resource the
snippet does not define, a fragment without `spec`, or a placeholder
certificate body is accepted; any other model error fails the test.
"""

import glob
import os
import re
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
)

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
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.y*ml"), recursive=True)):
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


@pytest.mark.parametrize("where,text", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_yaml_block_parses_strictly_and_passes_the_model(where, text, tmp_path):
    docs = [d for d in strict_yaml12().load_all(text) if d is not None]
    assert docs, "%s: no YAML document" % where
    if not RESOURCE.search(text):
        return  # a fragment of a spec: only the syntax applies
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
