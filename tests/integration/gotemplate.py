"""A small evaluator of Go's text/template with the Helm functions the
chart uses (helm/sluice/templates), so that the chart can be rendered and
checked where no helm binary exists.

Supported: {{ }} actions with '-' trimming, comments, if / else if / else,
with / else, define, pipelines, parenthesised sub-pipelines, string and
number literals, field chains on '.' and '$', and the functions in FUNCS.
Anything else is an error (TemplateError), so a template that uses more of
Go templates than this evaluates fails the test instead of rendering wrong.
Accessed `.Values` paths that do not exist are recorded in `missing`.
"""

import base64
import random
import re
import string

import yaml


class TemplateError(Exception):
    pass


ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
TOKEN = re.compile(r'\s*(\(|\)|\||"(?:[^"\\]|\\.)*"|`[^`]*`|[^\s()|]+)')


def tokenize_template(text):
    """[(kind, value)]: ('text', s) and ('action', expr), trims applied."""
    out, pos = [], 0
    for m in ACTION.finditer(text):
        chunk = text[pos:m.start()]
        if m.group(1):
            chunk = chunk.rstrip()
        out.append(["text", chunk])
        expr = m.group(2)
        out.append(["action", expr, bool(m.group(3))])
        pos = m.end()
    out.append(["text", text[pos:]])
    for i, t in enumerate(out):  # right trims
        if t[0] == "action" and t[2] and i + 1 < len(out):
            out[i + 1][1] = out[i + 1][1].lstrip()
    return [(t[0], t[1]) for t in out if not (t[0] == "action" and t[1].startswith("/*"))]


def parse(tokens, i=0, stop=("end",)):
    """Nodes until one of stop; returns (nodes, index of the stop token, its word)."""
    nodes = []
    while i < len(tokens):
        kind, val = tokens[i]
        if kind == "text":
            nodes.append(("text", val))
            i += 1
            continue
        word = val.split(None, 1)[0] if val else ""
        if word in stop or (word == "else" and "else" in stop):
            return nodes, i, word
        if word in ("if", "with"):
            branches, i = parse_branches(tokens, i, word)
            nodes.append((word, branches))
            continue
        if word == "define":
            name = parse_string(val.split(None, 1)[1])
            body, j, _ = parse(tokens, i + 1, ("end",))
            nodes.append(("define", name, body))
            i = j + 1
            continue
        if word in ("range", "template", "block", "break", "continue"):
            raise TemplateError("unsupported action %r" % val)
        nodes.append(("expr", val))
        i += 1
    if stop != ("__eof__",):
        raise TemplateError("missing {{ end }}")
    return nodes, i, None


def parse_branches(tokens, i, word):
    """if/with with else-if/else chains: [(cond or None, nodes)], next index."""
    branches = []
    cond = tokens[i][1].split(None, 1)[1]
    i += 1
    while True:
        body, j, stopword = parse(tokens, i, ("end", "else"))
        branches.append((cond, body))
        if stopword == "end":
            return branches, j + 1
        rest = tokens[j][1].split(None, 1)
        if len(rest) > 1 and rest[1].startswith("if "):
            cond = rest[1][3:]
        else:
            cond = None
        i = j + 1


def parse_string(s):
    s = s.strip()
    if s.startswith('"'):
        return bytes(s[1:-1], "utf-8").decode("unicode_escape")
    if s.startswith("`"):
        return s[1:-1]
    raise TemplateError("expected a string, got %r" % s)


def truthy(v):
    return not (v is None or v is False or v == 0 or v == "" or v == [] or v == {})


def to_yaml(v):
    if v in ({}, [], None):
        return ""
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=False).rstrip("\n")


class Renderer:
    def __init__(self, values, release=None, chart=None):
        self.root = {"Values": values,
                     "Release": release or {"Name": "demo", "Namespace": "sluice",
                                            "Service": "Helm"},
                     "Chart": chart, "Capabilities": {}}
        self.defines = {}
        self.missing = set()
        self.FUNCS = {
            "include": lambda name, ctx: self.render_nodes(self.defines[name], ctx),
            "default": lambda d, v=None: v if truthy(v) else d,
            "quote": lambda v: '"%s"' % str("" if v is None else v).replace("\\", "\\\\")
            .replace('"', '\\"'),
            "toYaml": to_yaml,
            "nindent": lambda n, s: "\n" + "\n".join(" " * n + ln if ln else ln
                                                     for ln in str(s).split("\n")),
            "indent": lambda n, s: "\n".join(" " * n + ln for ln in str(s).split("\n")),
            "printf": lambda f, *a: re.sub(r"%[sdv]", "%s", f) % a,
            "b64enc": lambda s: base64.b64encode(str(s).encode()).decode(),
            "randAlphaNum": lambda n: "".join(random.choice(string.ascii_letters + string.digits)
                                              for _ in range(n)),
            "trunc": lambda n, s: str(s)[:n],
            "trimSuffix": lambda suf, s: s[:-len(suf)] if suf and s.endswith(suf) else s,
            "contains": lambda sub, s: sub in s,
            "not": lambda v: not truthy(v),
            "and": lambda *a: all(truthy(x) for x in a),
            "or": lambda *a: any(truthy(x) for x in a),
            "eq": lambda a, b: a == b,
            "ne": lambda a, b: a != b,
            "add": lambda *a: sum(int(x) for x in a),
        }

    def load_defines(self, text):
        nodes, _, _ = parse(tokenize_template(text), 0, ("__eof__",))
        for n in nodes:
            if n[0] == "define":
                self.defines[n[1]] = n[2]

    def render(self, text):
        nodes, _, _ = parse(tokenize_template(text), 0, ("__eof__",))
        return self.render_nodes(nodes, self.root)

    def render_nodes(self, nodes, dot):
        out = []
        for n in nodes:
            if n[0] == "text":
                out.append(n[1])
            elif n[0] == "expr":
                v = self.pipeline(n[1], dot)
                out.append("" if v is None else (str(v).lower() if isinstance(v, bool)
                                                  else str(v)))
            elif n[0] == "define":
                self.defines[n[1]] = n[2]
            elif n[0] in ("if", "with"):
                for cond, body in n[1]:
                    if cond is None:
                        out.append(self.render_nodes(body, dot))
                        break
                    v = self.pipeline(cond, dot)
                    if truthy(v):
                        out.append(self.render_nodes(body, v if n[0] == "with" else dot))
                        break
        return "".join(out)

    def pipeline(self, expr, dot):
        toks = [t for t in TOKEN.findall(expr) if t]
        value, rest = self.parse_pipe(toks, dot)
        if rest:
            raise TemplateError("trailing tokens in %r" % expr)
        return value

    def parse_pipe(self, toks, dot):
        cmds, cur = [], []
        while toks and toks[0] != ")":
            t = toks.pop(0)
            if t == "|":
                cmds.append(cur)
                cur = []
            elif t == "(":
                v, toks = self.parse_pipe(toks, dot)
                if not toks or toks.pop(0) != ")":
                    raise TemplateError("unbalanced parentheses")
                cur.append(("value", v))
            else:
                cur.append(("tok", t))
        cmds.append(cur)
        value, first = None, True
        for cmd in cmds:
            value = self.command(cmd, dot, None if first else value, not first)
            first = False
        return value, toks

    def operand(self, item, dot):
        kind, t = item
        if kind == "value":
            return t
        if t.startswith('"') or t.startswith("`"):
            return parse_string(t)
        if re.fullmatch(r"-?\d+", t):
            return int(t)
        if t in ("true", "false"):
            return t == "true"
        if t == "nil":
            return None
        if t == ".":
            return dot
        if t.startswith("$"):
            return self.field(self.root, t[1:], t)
        if t.startswith("."):
            return self.field(dot, t, t)
        raise TemplateError("unknown operand %r" % t)

    def field(self, base, chain, text):
        v = base
        parts = [p for p in chain.split(".") if p]
        for i, p in enumerate(parts):
            if not isinstance(v, dict) or p not in v:
                if base is self.root and parts[0] == "Values":
                    self.missing.add(".".join(parts[:i + 1]))
                return None
            v = v[p]
        return v

    def command(self, cmd, dot, piped, has_piped):
        if not cmd:
            raise TemplateError("empty command")
        kind, t = cmd[0]
        if kind == "tok" and t in self.FUNCS:
            args = [self.operand(a, dot) for a in cmd[1:]]
            if has_piped:
                args.append(piped)
            return self.FUNCS[t](*args)
        if len(cmd) != 1 or has_piped:
            raise TemplateError("%r is not a function" % t)
        return self.operand(cmd[0], dot)
