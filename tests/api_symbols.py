#!/usr/bin/env python3
"""The functions and variables that installed headers declare, one per line:
"NAME KIND HEADER EXPORTED", KIND function or variable, EXPORTED yes when the declaration
carries RK_API (a visibility("default") attribute), else no. Static (inline) functions are
not symbols of the library and are left out.

Usage: api_symbols.py INCLUDE_DIR   (the directory holding rekindle/*.h)

It asks clang for the AST (JSON) of a file that includes every header of INCLUDE_DIR/rekindle,
so nothing here parses C by hand. Run by tests/it_install.sh.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: api_symbols.py INCLUDE_DIR")
    inc = os.path.abspath(sys.argv[1])
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
        print(decl["name"], kind, os.path.basename(where), "yes" if exported else "no")


if __name__ == "__main__":
    main()
