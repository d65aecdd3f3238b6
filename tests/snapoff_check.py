"""A job's events file after snapshots were turned off for want of room (tests/it_memrecover.sh,
tests/it_pytorch_mem.sh): one snapshot_off event, blaming no device, saying disk_only and why,
and every relaunch resumed from disk. Prints ok/FAIL lines for itlib's it_count.
Usage: python3 tests/snapoff_check.py EVENTS"""
import json
import sys

ev = [json.loads(l) for l in open(sys.argv[1])]
off = [e for e in ev if e["kind"] == "snapshot_off"]
print(("ok - " if len(off) == 1 else "FAIL - ") + f"{len(off)} snapshot_off event(s), one wanted: {[e['detail'] for e in off]}")
print(("ok - " if off and off[0]["rank"] is None and not off[0]["device"] and off[0]["action"] == "disk_only"
       and "MiB short" in off[0]["detail"] else "FAIL - ") + "it blames no device, says disk_only and why (room)")
rel = [e for e in ev if e["action"] == "relaunch"]
print(("ok - " if rel and all("resumed from disk checkpoint" in e["detail"] for e in rel) else "FAIL - ")
      + f"the relaunch resumed from disk: {[e['detail'][-50:] for e in rel]}")
