#!/usr/bin/env python3
"""Checks `rk doctor --json` output against the tables of docs/doctor-json.md (standard library
only): every key documented, required keys present, each value of its documented type, integers
never written as reals. Usage: doctor_json_check.py DOC JSON; exit 1 naming every problem."""
import json, re, sys

SECTIONS = {"Top level": "root", "A GPU": "gpu", "A finding": "finding",
            "Readings": "readings", "Per-Xid counts": "xid", "The last burn-in": "burn"}


def read_schema(path):
    schema, cur = {}, None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^## (.*?)(?: \(|$)", line)
        if m:
            cur = SECTIONS.get(m.group(1).strip())
            if cur:
                schema[cur] = {}
            continue
        m = re.match(r"^\| ([a-z_0-9]+) \| ([a-z\\|]+) \| (yes|no) \|", line)
        if cur and m:
            schema[cur][m.group(1)] = (m.group(2).replace("\\", "").split("|"), m.group(3) == "yes")
    missing = set(SECTIONS.values()) - set(schema)
    if missing or not all(schema.values()):
        sys.exit(f"{path}: schema tables missing or empty: {sorted(missing)}")
    return schema


def type_ok(v, t):
    return {"string": isinstance(v, str), "boolean": isinstance(v, bool),
            "integer": isinstance(v, int) and not isinstance(v, bool),
            "number": isinstance(v, (int, float)) and not isinstance(v, bool),
            "array": isinstance(v, list), "object": isinstance(v, dict), "null": v is None}[t]


def check(obj, section, where, schema, problems):
    if not isinstance(obj, dict):
        problems.append(f"{where}: not an object")
        return
    for k, (types, req) in schema[section].items():
        if req and k not in obj:
            problems.append(f"{where}: required key {k} missing")
    for k, v in obj.items():
        if k not in schema[section]:
            problems.append(f"{where}.{k}: not in docs/doctor-json.md")
        elif not any(type_ok(v, t) for t in schema[section][k][0]):
            problems.append(f"{where}.{k}: {v!r} is not {'|'.join(schema[section][k][0])}")


def main():
    schema = read_schema(sys.argv[1])
    # json keeps integers apart from reals: 1.0 loads as a float, 1 as an int
    doc = json.load(open(sys.argv[2], encoding="utf-8"))
    problems = []
    check(doc, "root", "$", schema, problems)
    for i, g in enumerate(doc.get("gpus") or []):
        check(g, "gpu", f"$.gpus[{i}]", schema, problems)
        for q, f in enumerate(g.get("findings") or []):
            check(f, "finding", f"$.gpus[{i}].findings[{q}]", schema, problems)
        if "burn" in g:
            check(g["burn"], "burn", f"$.gpus[{i}].burn", schema, problems)
        r = g.get("readings")
        if isinstance(r, dict):
            check(r, "readings", f"$.gpus[{i}].readings", schema, problems)
            if r.get("lost") and len(r) != 1:
                problems.append(f"$.gpus[{i}].readings: a lost GPU has readings {sorted(r)}")
            for q, x in enumerate(r.get("xids") or []):
                check(x, "xid", f"$.gpus[{i}].readings.xids[{q}]", schema, problems)
    if "error" in doc and doc.get("gpus") != []:
        problems.append("$: error with GPUs listed")
    if "error" not in doc and "threshold" not in doc:
        problems.append("$: no threshold")
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)


main()
