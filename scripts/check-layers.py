#!/usr/bin/env python3
"""The layering of docs/design.md ("Who may include whom"), checked.

Reads every #include of the C, header and CUDA files under src/, cli/ and include/, resolves
each as the compiler does (a quoted name in the includer's directory first, then src/, then
include/; a name that is in none of them and was written <...> is a system header), and
names, one line each, every include the table (scripts/layers.txt) forbids:

  FILE:LINE: ROOM includes HEADER: upward (ROOM is layer N, HEADER's room layer M)
  FILE:LINE: ROOM includes HEADER: sideways (ROOM and HEADER's room are both layer N)
  FILE:LINE: ROOM includes HEADER: not in ROOM's rule (table line L)   (a lower layer's)
  FILE:LINE: ROOM includes HEADER: into another room's private header  (alone, or after
                                                                        one of the above)
  FILE:LINE: "NAME" is no file of the tree and no generated header of the table
  FILE: its directory is no room of the table
  TABLE:LINE: except FILE HEADER: stale (...): remove it from the table

Usage: check-layers.py [--root DIR] [--table FILE] [--list]
           DIR: the tree (default: this script's repository); FILE: default DIR/scripts/layers.txt
           --list: also print every edge between rooms with its count
       check-layers.py --self-test
Exit: 0 every include allowed, 1 forbidden includes (listed), 2 bad usage or a bad table.
"""
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree (it may be read-only)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from csource import blank  # noqa: E402

SCANNED = ("src", "cli", "include")  # the directories read
SEARCH = ("src", "include")  # the -I directories, in the compiler's order
EXTS = (".c", ".h", ".cu")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)


class TableError(Exception):
    pass


def read_table(path, root):
    """The table as a dict; TableError naming the line on anything wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            if os.fstat(f.fileno()).st_size > 1 << 20:
                raise TableError(f"{path}: larger than 1 MiB")
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise TableError(f"{path}: {e}")
    t = {"rooms": {}, "files": {}, "private": set(), "generated": {}, "except": {}}
    pending = []  # (line number, what, value) checked once every room is known

    def bad(ln, why):
        raise TableError(f"{path}:{ln}: {why}")

    entries = []  # (first line's number, the entry): an indented line continues the one above
    for ln, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if raw[0] in " \t":
            if not entries:
                bad(ln, "an indented line continues nothing")
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line)
        else:
            entries.append((ln, line))
    for ln, line in entries:
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if word == "room":
            m = re.fullmatch(r"(\S+)\s+(\d+):\s*(.*)", rest)
            if not m:
                bad(ln, "want `room DIR LAYER: TARGET...`")
            d, layer, targets = m.group(1).rstrip("/"), int(m.group(2)), m.group(3).split()
            if d in t["rooms"]:
                bad(ln, f"room {d} given twice")
            if not os.path.isdir(os.path.join(root, d)):
                bad(ln, f"room {d}: no such directory under {root}")
            t["rooms"][d] = {"layer": layer, "targets": targets, "line": ln}
            pending += [(ln, "target", x) for x in targets]
        elif word == "file":
            m = re.fullmatch(r"(\S+):\s*(.*)", rest)
            if not m:
                bad(ln, "want `file FILE: TARGET...`")
            f, targets = m.group(1), m.group(2).split()
            if not os.path.isfile(os.path.join(root, f)):
                bad(ln, f"file {f}: no such file under {root}")
            if f in t["files"]:
                bad(ln, f"file {f} given twice")
            t["files"][f] = {"targets": targets, "line": ln}
            pending += [(ln, "target", x) for x in targets] + [(ln, "in a room", f)]
        elif word == "private":
            if not rest:
                bad(ln, "want `private HEADER...`")
            for h in rest.split():
                if not os.path.isfile(os.path.join(root, h)):
                    bad(ln, f"private {h}: no such file under {root}")
                t["private"].add(h)
                pending.append((ln, "in a room", h))
        elif word == "generated":
            m = re.fullmatch(r"(\S+)\s+(\S+)", rest)
            if not m:
                bad(ln, "want `generated NAME ROOM`")
            t["generated"][m.group(1)] = m.group(2).rstrip("/")
            pending.append((ln, "room", m.group(2).rstrip("/")))
        elif word == "except":
            m = re.fullmatch(r"(\S+)\s+(\S+):\s*(.*)", rest)
            if not m or not m.group(3).strip():
                bad(ln, "want `except FILE HEADER: WHY` (the reason is required)")
            for p in m.group(1), m.group(2):
                if not os.path.isfile(os.path.join(root, p)):
                    bad(ln, f"except: {p}: no such file under {root}")
            key = (m.group(1), m.group(2))
            if key in t["except"]:
                bad(ln, f"except {key[0]} {key[1]} given twice")
            t["except"][key] = ln
        else:
            bad(ln, f"unknown line kind {word!r} (room, file, private, generated, except)")
    if not t["rooms"]:
        raise TableError(f"{path}: no room")
    for ln, what, x in pending:
        if what == "target":
            if x != "*" and x not in t["rooms"] and not (
                    os.path.isfile(os.path.join(root, x)) and room_of(t, x)):
                bad(ln, f"target {x}: neither *, a room nor a header in a room")
        elif what == "room" and x not in t["rooms"]:
            bad(ln, f"{x}: no room of the table")
        elif what == "in a room" and not room_of(t, x):
            bad(ln, f"{x}: in no room of the table")
    return t


def room_of(t, path):
    """The room (longest directory prefix) a tree path belongs to, or None."""
    best = None
    for d in t["rooms"]:
        if path.startswith(d + "/") and (best is None or len(d) > len(best)):
            best = d
    return best


def tree_files(root):
    out = []
    for top in SCANNED:
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(EXTS):
                    out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def includes(root, rel):
    """(line, delimiter, name) of each #include of a file, comments ignored."""
    path = os.path.join(root, rel)
    if os.path.getsize(path) > 4 << 20:
        raise TableError(f"{rel}: larger than 4 MiB, not a source file")
    with open(path, encoding="utf-8", errors="replace") as f:
        code = blank(f.read(), strings=False)
    return [(code.count("\n", 0, m.start()) + 1, m.group(1), m.group(2).strip())
            for m in INCLUDE.finditer(code)]


def resolve(root, rel, delim, name):
    """The tree path an include names, None for a system header."""
    dirs = ([os.path.dirname(rel)] if delim == '"' else []) + list(SEARCH)
    for d in dirs:
        p = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(os.path.join(root, p)):
            return p
    return None


def allowed(t, src, target):
    """None if src may include target (both tree paths), else the rule it breaks."""
    sroom, troom = room_of(t, src), room_of(t, target)
    if sroom == troom and src not in t["files"]:
        return None
    private = "into another room's private header" if (
        target in t["private"] and sroom != troom) else None
    rule = t["files"].get(src) or t["rooms"][sroom]
    if any(x in (target, troom, "*") for x in rule["targets"]):
        return private
    if src in t["files"]:
        why = f"not in {src}'s own rule (table line {rule['line']})"
    else:
        ls, lt = t["rooms"][sroom]["layer"], t["rooms"][troom]["layer"]
        if lt > ls:
            why = f"upward ({sroom} is layer {ls}, {troom} layer {lt})"
        elif lt == ls:
            why = f"sideways ({sroom} and {troom} are both layer {ls})"
        else:
            why = f"not in {sroom}'s rule (table line {rule['line']})"
    return why + (", and " + private if private else "")


def check(root, table_path):
    """(findings, edges): findings a list of lines, edges {(room, room): count}."""
    t = read_table(table_path, root)
    findings, edges, used = [], {}, set()
    for rel in tree_files(root):
        sroom = room_of(t, rel)
        if sroom is None:
            findings.append(f"{rel}: its directory is no room of the table")
            continue
        for ln, delim, name in includes(root, rel):
            target = resolve(root, rel, delim, name)
            if target is None:
                if delim == '"' and name in t["generated"]:
                    troom = t["generated"][name]
                    edges[(sroom, troom)] = edges.get((sroom, troom), 0) + 1
                    if troom != sroom:
                        findings.append(f"{rel}:{ln}: {sroom} includes the generated {name}, "
                                        f"which is {troom}'s")
                elif delim == '"':
                    findings.append(f'{rel}:{ln}: "{name}" is no file of the tree and no '
                                    "generated header of the table")
                continue
            troom = room_of(t, target)
            if troom is None:
                findings.append(f"{rel}:{ln}: {sroom} includes {target}, in no room of the table")
                continue
            edges[(sroom, troom)] = edges.get((sroom, troom), 0) + 1
            why = allowed(t, rel, target)
            if why is None:
                continue
            if (rel, target) in t["except"]:
                used.add((rel, target))
                continue
            findings.append(f"{rel}:{ln}: {sroom} includes {target}: {why}")
    for key, ln in sorted(t["except"].items()):
        if key not in used:
            findings.append(f"{table_path}:{ln}: except {key[0]} {key[1]}: stale (no such "
                            "forbidden include any more): remove it from the table")
    return findings, edges


# ---- the self-test: a small fake tree, a table, and what must be named ----------------------
FAKE_TABLE = """\
room include/rekindle 1:
room src/base 0: include/rekindle/error.h
  include/rekindle/fileio.h   # a continued line
room src/health 1: src/base include/rekindle
room src/runtime 1: src/base include/rekindle
room src/gpu 2: src/base src/health/nvml.h
file src/gpu/pool.c: src/gpu/pool.h
room src/supervisor 3: src/base include/rekindle src/health
room cli 4: *
private src/runtime/internal.h src/health/nvml_api.h src/supervisor/sup.h
generated api.pb-c.h src/supervisor
"""
FAKE_FILES = {
    "include/rekindle/error.h": "",
    "include/rekindle/fileio.h": "",
    "include/rekindle/worker.h": '#include "rekindle/error.h"\n',
    "src/base/clock.h": "",
    "src/base/msg.c": '#include "base/clock.h"\n#include "rekindle/error.h"\n#include <stdio.h>\n',
    "src/health/nvml.h": '#include "health/nvml_api.h"\n',
    "src/health/nvml_api.h": "",
    "src/health/sim.h": "",
    "src/runtime/internal.h": "",
    "src/runtime/ckpt.c": '#include "runtime/internal.h"\n#include "base/clock.h"\n',
    "src/gpu/pool.h": "",
    "src/gpu/pool.c": '#include "gpu/pool.h"\n',
    "src/gpu/burn.c": '#include "health/nvml.h"\n/* #include "supervisor/sup.h" */\n'
                      '#include "ref.h"\n',
    "src/gpu/ref.h": "",
    "src/supervisor/sup.h": "",
    "src/supervisor/run.c": '#include "supervisor/sup.h"\n#include "health/sim.h"\n'
                            '#include "api.pb-c.h"\n#include <net/if.h>\n',
    "cli/rk.h": "",
    "src/supervisor/supervisor.h": "",
    "cli/cmd_run.c": '#include "rk.h"\n#include "supervisor/supervisor.h"\n#include "gpu/pool.h"\n',
}
# Each case: (file to add or replace, its text, table lines to add, the findings wanted).
FAKE_CASES = [
    ("the clean tree", None, None, "", []),
    ("base including a supervisor header", "src/base/bad.c",
     '#include "base/clock.h"\n  #  include "supervisor/sup.h"\n#include "health/sim.h"\n', "",
     ["src/base/bad.c:2: src/base includes src/supervisor/sup.h: upward "
      "(src/base is layer 0, src/supervisor layer 3), and into another room's private header",
      "src/base/bad.c:3: src/base includes src/health/sim.h: upward "
      "(src/base is layer 0, src/health layer 1)"]),
    ("base including a public header it does not implement", "src/base/bad.c",
     '#include <rekindle/worker.h>\n', "",
     ["src/base/bad.c:1: src/base includes include/rekindle/worker.h: upward "
      "(src/base is layer 0, include/rekindle layer 1)"]),
    ("health including the runtime (sideways)", "src/health/bad.c",
     '#include "runtime/ckpt.c"\n', "",
     ["src/health/bad.c:1: src/health includes src/runtime/ckpt.c: sideways "
      "(src/health and src/runtime are both layer 1)"]),
    ("gpu including a private header of health", "src/gpu/bad.c",
     '#include "health/nvml_api.h"\n#include "health/sim.h"\n', "",
     ["src/gpu/bad.c:1: src/gpu includes src/health/nvml_api.h: not in src/gpu's rule "
      "(table line 6), and into another room's private header",
      "src/gpu/bad.c:2: src/gpu includes src/health/sim.h: not in src/gpu's rule (table line 6)"]),
    ("cli including a private header (* does not reach it)", "cli/bad.c",
     '#include "runtime/internal.h"\n', "",
     ["cli/bad.c:1: cli includes src/runtime/internal.h: into another room's private header"]),
    ("a file rule replaces its room's", "src/gpu/pool.c",
     '#include "gpu/pool.h"\n#include "gpu/ref.h"\n#include "base/clock.h"\n', "",
     ["src/gpu/pool.c:2: src/gpu includes src/gpu/ref.h: not in src/gpu/pool.c's own rule "
      "(table line 7)",
      "src/gpu/pool.c:3: src/gpu includes src/base/clock.h: not in src/gpu/pool.c's own rule "
      "(table line 7)"]),
    ("an include of nothing", "src/base/bad.c", '#include "base/nothing.h"\n', "",
     ['src/base/bad.c:1: "base/nothing.h" is no file of the tree and no generated header of '
      "the table"]),
    ("a directory outside the table", "src/cluster/x.c", '#include "base/clock.h"\n', "",
     ["src/cluster/x.c: its directory is no room of the table"]),
    ("an exception allows its one include", "src/base/bad.c",
     '#include "supervisor/sup.h"\n#include "health/sim.h"\n',
     "except src/base/bad.c src/supervisor/sup.h: the fake reason\n",
     ["src/base/bad.c:2: src/base includes src/health/sim.h: upward "
      "(src/base is layer 0, src/health layer 1)"]),
    ("a stale exception", None, None,
     "except src/base/msg.c src/health/sim.h: no longer included\n",
     ["TABLE:12: except src/base/msg.c src/health/sim.h: stale (no such forbidden include any "
      "more): remove it from the table"]),
]
FAKE_BAD_TABLES = [
    ("room src/nowhere 1: src/base\n", "room src/nowhere: no such directory"),
    ("room src/base 1: src/base\n", "room src/base given twice"),
    ("file src/base/msg.c: src/nothing\n", "target src/nothing: neither"),
    ("except src/base/msg.c src/health/sim.h:\n", "the reason is required"),
    ("allow src/base src/net\n", "unknown line kind"),
    ("private src/base/none.h\n", "private src/base/none.h: no such file"),
]


def write_fake(root, files, extra):
    """The fake tree `files` under root and its table (FAKE_TABLE + extra); the table's path."""
    for p, body in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(p)), exist_ok=True)
        with open(os.path.join(root, p), "w") as f:
            f.write(body)
    table = os.path.join(root, "layers.txt")
    with open(table, "w") as f:
        f.write(FAKE_TABLE + extra)
    return table


def self_test():
    fails = []
    for name, path, text, extra, want in FAKE_CASES:
        with tempfile.TemporaryDirectory() as root:
            files = dict(FAKE_FILES)
            if path:
                files[path] = text
            table = write_fake(root, files, extra)
            try:
                got, _ = check(root, table)
            except TableError as e:
                got = [f"bad table: {e}"]
            got = [g.replace(table, "TABLE") for g in got]
            if got != want:
                fails.append(f"{name}: named {got}, want {want}")
    for extra, want in FAKE_BAD_TABLES:
        with tempfile.TemporaryDirectory() as root:
            table = write_fake(root, FAKE_FILES, extra)
            try:
                check(root, table)
                fails.append(f"bad table {extra.strip()!r}: accepted")
            except TableError as e:
                if want not in str(e):
                    fails.append(f"bad table {extra.strip()!r}: {e}, want {want!r}")
    if fails:
        print("check-layers self-test FAILED:\n  " + "\n  ".join(fails))
        return 1
    print(f"check-layers self-test: {len(FAKE_CASES)} fake trees judged as they must be "
          f"(upward, sideways, private, file rules, exceptions), {len(FAKE_BAD_TABLES)} bad "
          "tables refused")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    table, listing = None, False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in ("--root", "--table") and args:
            v = args.pop(0)
            if a == "--root":
                root = v
            else:
                table = v
        elif a == "--list":
            listing = True
        else:
            print("usage: check-layers.py [--root DIR] [--table FILE] [--list] | --self-test",
                  file=sys.stderr)
            return 2
    if not os.path.isdir(root):
        print(f"check-layers: {root}: not a directory", file=sys.stderr)
        return 2
    table = table or os.path.join(root, "scripts", "layers.txt")
    try:
        findings, edges = check(root, table)
    except TableError as e:
        print(f"check-layers: bad table: {e}", file=sys.stderr)
        return 2
    if listing:
        for (a, b), n in sorted(edges.items()):
            if a != b:
                print(f"{a} -> {b}: {n}")
    for f in findings:
        print(f)
    if findings:
        print(f"check-layers: {len(findings)} include(s) that docs/design.md's layering forbids "
              f"(the table: {table}): fix the include, or change the rule in the table and "
              "design.md together")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
