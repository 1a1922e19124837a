#!/bin/bash
# Runs Tair KVCM's own Python integration tests against `kvtier meta`, in a
# directory prepared by setup.sh (see README.md).
# Usage: tools/upstream-it/run.sh WORK_DIR /path/to/kvtier [suite...]
#   suites: admin-http admin-grpc meta-http meta-grpc reclaimer (default: all)
#   KVTIER_IT_INDEX=embedded  uses the embedded index instead of memory.
set -u
IT=$(cd "${1:?usage: run.sh WORK_DIR /path/to/kvtier [suite...]}" && pwd)
BIN=$(readlink -f "${2:?usage: run.sh WORK_DIR /path/to/kvtier [suite...]}")
shift 2
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(admin-http admin-grpc meta-http meta-grpc reclaimer)
STAMP=$(date +%Y%m%d-%H%M%S)
OUTDIR=$IT/results/$STAMP
mkdir -p "$OUTDIR"
export KVTIER_IT_BIN=$BIN
export KVTIER_IT_PIDFILE=$OUTDIR/pids
export PYTHONPATH=$IT:$IT/integration_test
export PYTHONUNBUFFERED=1
cd "$IT"
# kvtier creates file pools in the storages upstream's tests add (/tmp/1,
# /tmp/test_storage_01); start every suite without them.
clean_pools() { for d in /tmp/1 /tmp/test_storage_01; do rm -f "$d"/pool-*.kv; rmdir "$d" 2>/dev/null; done; }
for s in "${SUITES[@]}"; do
  case $s in
    admin-http) mod=integration_test.admin_service.http_interface_test;;
    admin-grpc) mod=integration_test.admin_service.grpc_interface_test;;
    meta-http)  mod=integration_test.meta_service.http_interface_test;;
    meta-grpc)  mod=integration_test.meta_service.grpc_interface_test;;
    reclaimer)  mod=integration_test.reclaimer.reclaiming_test;;
    *) echo "unknown suite $s"; exit 2;;
  esac
  clean_pools
  echo "== $s ($mod)" >&2
  timeout 900 "$IT/venv/bin/python" "$IT/runner.py" "$mod" "$OUTDIR/$s.json" > "$OUTDIR/$s.log" 2>&1
  # stop any server this suite left running (only pids the shim started)
  if [ -f "$KVTIER_IT_PIDFILE" ]; then
    while read -r p; do kill -0 "$p" 2>/dev/null && kill "$p"; done < "$KVTIER_IT_PIDFILE"
    : > "$KVTIER_IT_PIDFILE"
  fi
done
clean_pools
"$IT/venv/bin/python" - "$OUTDIR" "${SUITES[@]}" <<'PY'
import json, sys, os
outdir, suites = sys.argv[1], sys.argv[2:]
rows, order = {}, []
for s in suites:
    f = os.path.join(outdir, s + ".json")
    data = json.load(open(f)) if os.path.exists(f) else {}
    for k, (r, tb) in data.items():
        if k not in rows:
            rows[k] = {}; order.append(k)
        rows[k][s] = r
        if r != "pass":
            last = [l for l in tb.strip().splitlines() if l.strip()][-1:] or [""]
            print("# %s %s %s: %s" % (s, k, r, last[0][:300]), file=sys.stderr)
w = max([len(k) for k in order] + [4])
print("%-*s  %s" % (w, "case", "  ".join("%-10s" % s for s in suites)))
tot = {s: [0, 0] for s in suites}
for k in order:
    cells = []
    for s in suites:
        r = rows[k].get(s, "-")
        cells.append("%-10s" % r)
        if r != "-":
            tot[s][1] += 1; tot[s][0] += r == "pass"
    print("%-*s  %s" % (w, k, "  ".join(cells)))
print("%-*s  %s" % (w, "passed", "  ".join("%-10s" % ("%d/%d" % tuple(tot[s])) for s in suites)))
print("logs:", outdir)
PY
