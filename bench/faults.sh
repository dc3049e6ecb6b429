#!/usr/bin/env bash
# Run the whole fault-injection suite and print its table (scenario, faults, lost, duplicated, stage
# runs counted from the workers' logs and how many ran twice, statistics difference, time to recover)
# from the rows the tests record.
set -u
cd "$(dirname "$0")/.."
report=$(mktemp)
FRAMEFLEET_FAULT_REPORT=$report .venv/bin/python -m pytest -q -m "not gpu" tests/faults "$@"
status=$?
.venv/bin/python - "$report" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("| scenario | faults injected | videos | complete | quarantined | lost | duplicated | stage runs | double runs | temporary files | statistics rel. diff | recovered after (s) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    diff = "n/a" if r["stats_rel_diff"] is None else f"{r['stats_rel_diff']:.1e}"
    rec = "–" if r["recovered_s"] is None else f"{r['recovered_s']:.1f}"
    print(f"| {r['scenario']} | {r['faults']} | {r['videos']} | {r['complete']} | {r['quarantined']} | "
          f"{r['lost']} | {r['duplicated']} | {r.get('stage_runs', '–')} | {r.get('double_runs', '–')} | "
          f"{r['temporary']} | {diff} | {rec} |")
PY
rm -f "$report"
exit $status
