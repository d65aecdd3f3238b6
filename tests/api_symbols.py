#!/usr/bin/env python3
"""The functions and variables that installed headers declare, one per line:
"NAME KIND HEADER EXPORTED", KIND function or variable, EXPORTED yes when the declaration
carries RK_API (a visibility("default") attribute), else no. Static (inline) functions are
not symbols of the library and are left out.

Usage: api_symbols.py INCLUDE_DIR   (the directory holding rekindle/*.h)
       api_symbols.py --mark INCLUDE_DIR HEADER...
The second form puts RK_API (and the include of rekindle/export.h) in front of each
declaration of the named headers (base names: ckpt.h) that lacks it, in place: a header's
declarations start a line, as the project writes them.

It asks clang for the AST (JSON) of a file that includes every header of INCLUDE_DIR/rekindle,
so nothing here parses C by hand. Run by tests/it_install.sh.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile


def declarations(inc):
    """(name, kind, header base name, exported) of every declaration in inc/rekindle/*.h."""
    headers = sorted(glob.glob(os.path.join(inc, "rekindle", "*.h")))
    if not headers:
        sys.exit(f"api_symbols.py: no headers in {inc}/rekindle")
    with tempfile.NamedTemporaryFile("w", suffix=".c") as src:
        for h in headers:
            src.write(f'#include "rekindle/{os.path.basename(h)}"\n')
        src.flush()
        out = subprocess.run(["clang", "-std=c17", "-I", inc, "-fsyntax-only", "-Xclang",
                              "-ast-dump=json", src.name], check=True, capture_output=True,
                             text=True).stdout
    ast = json.loads(out)

    # clang writes a location's file only when it differs from the previous location
    # written, so the file of a declaration is the last one seen, walking in output order.
    state = {"file": None}

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "includedFrom":
                    continue
                if key == "file":
                    state["file"] = value
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    prefix = os.path.join(inc, "rekindle") + os.sep
    for decl in ast.get("inner", []):
        walk(decl.get("loc", {}))
        where = state["file"]
        walk({k: v for k, v in decl.items() if k != "loc"})
        kind = {"FunctionDecl": "function", "VarDecl": "variable"}.get(decl.get("kind"))
        if not kind or not where or not os.path.abspath(where).startswith(prefix):
            continue
        if decl.get("storageClass") == "static":
            continue
        exported = any(c.get("kind") == "VisibilityAttr" for c in decl.get("inner", []))
        yield decl["name"], kind, os.path.basename(where), exported


def mark(inc, headers):
    todo = {}
    for name, _, header, exported in declarations(inc):
        if header in headers and not exported:
            todo.setdefault(header, []).append(name)
    for header, names in todo.items():
        path = os.path.join(inc, "rekindle", header)
        lines = open(path).read().split("\n")
        for name in names:
            at = [i for i, line in enumerate(lines)
                  if re.match(r"[A-Za-z_]", line) and not line.startswith("RK_API ")
                  and re.search(r"\b%s\b" % re.escape(name), line)]
            if len(at) != 1:
                sys.exit(f"api_symbols.py: {header}: {name}: no single line starts it")
            lines[at[0]] = "RK_API " + lines[at[0]]
        include = '#include "rekindle/export.h"'
        if include not in lines:
            quoted = [i for i, line in enumerate(lines) if line.startswith('#include "')]
            if not quoted:
                sys.exit(f"api_symbols.py: {header}: add {include} by hand")
            at = next((i for i in quoted if lines[i] > include), quoted[-1] + 1)
            lines.insert(at, include)
        open(path, "w").write("\n".join(lines))
        print(f"{header}: RK_API on {len(names)} declarations")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--mark":
        mark(os.path.abspath(sys.argv[2]), set(sys.argv[3:]))
        return
    if len(sys.argv) != 2:
        sys.exit("usage: api_symbols.py INCLUDE_DIR | --mark INCLUDE_DIR HEADER...")
    for name, kind, header, exported in declarations(os.path.abspath(sys.argv[1])):
        print(name, kind, header, "yes" if exported else "no")


if __name__ == "__main__":
    main()
