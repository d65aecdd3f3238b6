#!/usr/bin/env python3
"""Which .c files of a directory call each other in a circle.

Reads the .c files of each DIR given (not their subdirectories), finds every function each
defines (at file scope: a name, its parameters, then a body) and every name each mentions,
and draws an edge A -> B when A mentions a function that B defines and A does not define
itself (a static function of A shadows B's). A mention is a call (`f(`) or a reference (`&f`,
`= f`, a callback handed on): either makes A depend on B. Comments and string literals do
not count, nor a member (`x.f`, `x->f`): a call through a table of function pointers is the
seam that breaks a circle, not a part of one. Macro bodies count as their file's mentions.

A circle is a set of files each reachable from each other (a strongly connected component of
more than one file); a file that calls itself is no circle. Several DIRs make one graph, so
a circle between two directories shows too.

Usage: call-cycles.py [--list] [--max N] DIR...
           --list: for each circle, its edges with the functions that make each, then its
                   simple cycles, shortest first (N at most, default 40)
       call-cycles.py --self-test
Exit: 0 no circle, 1 circles (listed), 2 bad usage or a file it cannot read as C.
"""
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree (it may be read-only)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from csource import blank  # noqa: E402

TOKEN = re.compile(r"[A-Za-z_]\w*|->|\S")
IDENT = re.compile(r"[A-Za-z_]\w*")
MAX_BYTES = 4 << 20


class SourceError(Exception):
    pass


def split_branches(code, path):
    """(structure, mentions, directive names) of blanked code: structure keeps only the
    first live branch of each #if (so that two branches cannot unbalance the braces),
    mentions every branch but those of #if 0; both with directives blanked, lines kept."""
    structure, mention, names = [], [], []
    stack = []  # per open #if: [this branch live, a branch taken, under #if 0]
    lines = code.split("\n")
    k = 0
    while k < len(lines):
        line = lines[k]
        group = [line]
        while line.rstrip().endswith("\\") and k + 1 < len(lines):
            k += 1
            line = lines[k]
            group.append(line)
        k += 1
        text = " ".join(g.rstrip().rstrip("\\") for g in group)
        m = re.match(r"\s*#\s*(\w*)(.*)", text)
        if m:
            word, rest = m.group(1), m.group(2).strip()
            if word in ("if", "ifdef", "ifndef"):
                zero = word == "if" and rest == "0"
                stack.append([not zero, not zero, zero])
            elif word in ("elif", "else"):
                if not stack:
                    raise SourceError(f"{path}: #{word} without #if")
                top = stack[-1]
                top[0], top[1], top[2] = not top[1], True, False
            elif word == "endif":
                if not stack:
                    raise SourceError(f"{path}: #endif without #if")
                stack.pop()
            elif word == "define":
                body = TOKEN.findall(re.sub(r"^\s*[A-Za-z_]\w*", "", rest))
                names += [(t, j + 1 < len(body) and body[j + 1] == "(")
                          for j, t in enumerate(body) if IDENT.fullmatch(t)]
            blank_lines = [" " * len(g) for g in group]
            structure += blank_lines
            mention += blank_lines
            continue
        live = all(e[0] for e in stack)
        dead = any(e[2] for e in stack)
        structure += group if live else [" " * len(g) for g in group]
        mention += [" " * len(g) for g in group] if dead else group
    if stack:
        raise SourceError(f"{path}: {len(stack)} #if left open at the end")
    return "\n".join(structure), "\n".join(mention), names


def read_c(path):
    """(defined, mentions) of one .c file: defined {name: static?}, mentions {name: call?}."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise SourceError(f"{path}: larger than {MAX_BYTES} bytes, not a source file")
        with open(path, encoding="utf-8", errors="replace") as f:
            code = blank(f.read(), strings=True)
    except OSError as e:
        raise SourceError(f"{path}: {e}")
    structure, mention, macro_names = split_branches(code, path)
    toks = TOKEN.findall(structure)
    defined, brace, stmt_start = {}, 0, 0
    for i, t in enumerate(toks):
        if t == "{":
            brace += 1
        elif t == "}":
            brace -= 1
            if brace < 0:
                raise SourceError(f"{path}: unbalanced braces (a '}}' closes nothing)")
            if brace == 0:
                stmt_start = i + 1
        elif t == ";" and brace == 0:
            stmt_start = i + 1
        elif brace == 0 and IDENT.fullmatch(t) and i + 1 < len(toks) and toks[i + 1] == "(":
            depth, j = 0, i + 1
            while j < len(toks):
                depth += {"(": 1, ")": -1}.get(toks[j], 0)
                if depth == 0:
                    break
                j += 1
            if j + 1 < len(toks) and toks[j + 1] == "{":
                defined[t] = "static" in toks[stmt_start:i]
    if brace != 0:
        raise SourceError(f"{path}: unbalanced braces ({brace} left open at the end)")
    # A mention of a name the file defines itself is the file's own business (graph()).
    mentions = {}
    for name, call in macro_names:
        mentions[name] = mentions.get(name, False) or call
    toks = TOKEN.findall(mention)
    for k, t in enumerate(toks):
        if not IDENT.fullmatch(t) or (k and toks[k - 1] in (".", "->")):
            continue
        call = k + 1 < len(toks) and toks[k + 1] == "("
        mentions[t] = mentions.get(t, False) or call
    return defined, mentions


def graph(dirs):
    """{file: {file: {function: call?}}} over the .c files of dirs."""
    files = []
    for d in dirs:
        files += [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".c")]
    parsed = {f: read_c(f) for f in files}
    owners = {}  # an external function's name -> the files defining it
    for f, (defined, _) in parsed.items():
        for name, static in defined.items():
            if not static:
                owners.setdefault(name, []).append(f)
    g = {f: {} for f in files}
    for f, (defined, mentions) in parsed.items():
        for name, call in mentions.items():
            if name in defined:
                continue
            for owner in owners.get(name, ()):
                if owner != f:
                    g[f].setdefault(owner, {})[name] = call
    return g


def circles(g):
    """The strongly connected components of more than one file (Tarjan), each sorted."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(1000, 4 * len(g) + 100))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def simple_cycles(g, comp, limit):
    """Up to limit simple cycles inside comp, shortest first; and whether there were more."""
    order = {v: k for k, v in enumerate(comp)}
    found = []
    budget = [200000]  # steps: the enumeration stays bounded on any graph

    def walk(start, path, seen):
        for w in sorted(g[path[-1]]):
            if w not in order or order[w] < order[start] or budget[0] <= 0:
                continue
            budget[0] -= 1
            if w == start:
                found.append(list(path))
            elif w not in seen:
                seen.add(w)
                path.append(w)
                walk(start, path, seen)
                path.pop()
                seen.discard(w)

    for v in comp:
        walk(v, [v], {v})
    found.sort(key=lambda c: (len(c), c))
    more = len(found) > limit or budget[0] <= 0
    return found[:limit], more


def report(g, comps, listing, limit, out):
    def short(f):
        return f if len(set(os.path.dirname(x) for x in g)) > 1 else os.path.basename(f)

    for k, comp in enumerate(comps, 1):
        out.append(f"circle {k}: {len(comp)} files: " + " ".join(short(f) for f in comp))
        if not listing:
            continue
        for a in comp:
            for b in sorted(g[a]):
                if b in comp:
                    names = ", ".join(f"{n}()" if c else f"&{n}"
                                      for n, c in sorted(g[a][b].items()))
                    out.append(f"  {short(a)} -> {short(b)}: {names}")
        cycles, more = simple_cycles(g, comp, limit)
        for c in cycles:
            out.append("  cycle: " + " -> ".join(short(f) for f in c + [c[0]]))
        if more:
            out.append(f"  (more cycles than the {limit} shown: --max N)")


# ---- the self-test: a fake directory whose circles are known --------------------------------
FAKE = {
    # a -> b -> c -> a: one circle; d -> a only; e calls its own static copy of c_go
    "a.c": '#include "x.h"\nint a_go(void) { return b_go(); }\n'
           'static int helper(void) { return 1; }\n',
    "b.c": "int b_go(void)\n{\n    if (1) {\n        return c_go();\n    }\n    return 0;\n}\n",
    "c.c": "struct t { int (*cb)(void); };\nstatic struct t tab = { .cb = a_go };\n"
           "int c_go(void) { return tab.cb(); }\n",
    "d.c": "int d_go(void) { return a_go() + helper(); }\n",
    "e.c": "static int c_go(void) { return 0; }\nint e_go(void) { return c_go(); }\n"
           "/* b_go() in a comment */\nconst char *s = \"d_go()\";\n"
           "int f(struct s *p) { return p->d_go + p->a_go(); }\n",
    # f and g: a circle through a macro's body and a prototype
    "f.c": "#define CALL_G() \\\n    g_go()\nint f_go(void) { return CALL_G(); }\n",
    "g.c": "int f_go(void);\n#if X\nint g_go(void) {\n#else\nint g_go(int x) {\n#endif\n"
           "    return f_go();\n}\n",
}
FAKE_WANT = [
    "circle 1: 3 files: a.c b.c c.c",
    "  a.c -> b.c: b_go()",
    "  b.c -> c.c: c_go()",
    "  c.c -> a.c: &a_go",
    "  cycle: a.c -> b.c -> c.c -> a.c",
    "circle 2: 2 files: f.c g.c",
    "  f.c -> g.c: g_go()",
    "  g.c -> f.c: f_go()",
    "  cycle: f.c -> g.c -> f.c",
]


def self_test():
    fails = []
    with tempfile.TemporaryDirectory() as d:
        for name, text in FAKE.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        g = graph([d])
        got = []
        report(g, circles(g), True, 40, got)
        if got != FAKE_WANT:
            fails.append("the fake directory:\n    got  " + "\n         ".join(got)
                         + "\n    want " + "\n         ".join(FAKE_WANT))
        if sorted(g[os.path.join(d, "e.c")]) or sorted(g[os.path.join(d, "d.c")]) != [
                os.path.join(d, "a.c")]:
            fails.append(f"d.c, e.c: edges {g[os.path.join(d, 'd.c')]}, "
                         f"{g[os.path.join(d, 'e.c')]}: want d.c -> a.c only")
        with open(os.path.join(d, "h.c"), "w") as f:
            f.write("int h(void) { return 0; }\n}\n")
        try:
            graph([d])
            fails.append("unbalanced braces accepted")
        except SourceError:
            pass
    if fails:
        print("call-cycles self-test FAILED: " + "\n".join(fails))
        return 1
    print("call-cycles self-test: the fake directory's two circles found with their edges "
          "(a call, a callback, a macro), no edge from comments, strings, members or a static "
          "copy; unbalanced braces refused")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    listing, limit, dirs = False, 40, []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--list":
            listing = True
        elif a == "--max" and args and args[0].isdigit() and int(args[0]) > 0:
            limit = int(args.pop(0))
        elif not a.startswith("-") and os.path.isdir(a):
            dirs.append(a.rstrip("/") or "/")
        else:
            print("usage: call-cycles.py [--list] [--max N] DIR... | --self-test "
                  f"(each DIR a directory; {a!r} is not)", file=sys.stderr)
            return 2
    if not dirs:
        print("usage: call-cycles.py [--list] [--max N] DIR... | --self-test", file=sys.stderr)
        return 2
    try:
        g = graph(dirs)
    except SourceError as e:
        print(f"call-cycles: {e}", file=sys.stderr)
        return 2
    comps = circles(g)
    edges = sum(len(v) for v in g.values())
    where = " ".join(dirs)
    if not comps:
        print(f"call-cycles: {where}: no two .c files call each other in a circle "
              f"({len(g)} files, {edges} edges between them)")
        return 0
    out = []
    report(g, comps, listing, limit, out)
    print("\n".join(out))
    print(f"call-cycles: {where}: {len(comps)} circle(s) among {len(g)} files "
          f"({edges} edges between them){'' if listing else '; --list names the calls'}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
