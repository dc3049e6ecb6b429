#!/usr/bin/env bash
# On a GPU host: the GPU readings of `inspect gpu`, scripts/status.py and the Prometheus exporter,
# idle and during a task. Results in $OUT.
#   bash bench/gpu_observability.sh        (the environment: bench/gpu_lib.sh's gpu_env)
source "$(dirname "$0")/gpu_lib.sh"; gpu_env || exit 1  # .venv (make install), .device or $ACTIVATE; a Redis
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
rm -rf /tmp/obs
python3 scripts/make_sample_dataset.py /tmp/raw --videos 3 > /dev/null
cat > /tmp/obs.yaml <<YAML
stages:
  depth: {params: {hold_mib: 4000, activation_mib: 1000, matmuls_per_frame: ${MATMULS:-40000}}}
YAML
export FRAMEFLEET_CONFIG=/tmp/obs.yaml
python3 -m celery -A tasks worker -Q gpu0 -P solo -c 1 -n gpu0@%h -E --without-gossip --without-mingle \
  > "$OUT/gpu0.log" 2>&1 &
python3 -m celery -A tasks worker -Q cpu -c 2 -n cpu@%h > "$OUT/cpu.log" 2>&1 &
python3 - <<'PY'
import time, redis
r = redis.Redis()
for _ in range(120):
    if len(list(r.scan_iter("ff:worker:*"))) >= 2:
        break
    time.sleep(0.5)
PY
python3 -m celery -A tasks inspect gpu --timeout 10 > "$OUT/inspect-idle.txt" 2>&1
python3 scripts/status.py > "$OUT/status-idle.txt" 2>&1
python3 scripts/enqueue_dataset.py /tmp/raw --out /tmp/obs --no-wait > "$OUT/enqueue.txt" 2>&1
python3 - "$OUT" <<'PY'
import json, sys, time, urllib.request
from pathlib import Path
from prometheus_client.parser import text_string_to_metric_families
from tasks import settings
from tasks.observe.metrics import start_exporter
out = Path(sys.argv[1])
exporter = start_exporter(0, settings())
port = exporter.port if hasattr(exporter, "port") else exporter.server.server_port
busy_scrape = None
rows = []
for _ in range(240):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    values = {(f.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    used = {k: v for k, v in values.items() if k[0].startswith("framefleet_gpu_memory_used_bytes")}
    workers = {k: v for k, v in values.items() if k[0].startswith("framefleet_worker_gpu_memory")}
    rows.append({"t": time.time(), "gpu_used": list(used.values()), "worker_gpu": list(workers.values())})
    if workers and max(workers.values(), default=0) > 4e9 and busy_scrape is None:
        busy_scrape = text
        (out / "metrics-busy.txt").write_text(text)
    if (Path("/tmp/obs") / "run_summary.json").exists():
        break
    time.sleep(1)
(out / "metrics-series.json").write_text(json.dumps(rows))
(out / "metrics-last.txt").write_text(text)
print("scrapes", len(rows), "busy scrape captured", busy_scrape is not None)
PY
python3 scripts/status.py --out /tmp/obs > "$OUT/status-after.txt" 2>&1
python3 -m celery -A tasks inspect gpu --timeout 10 > "$OUT/inspect-after.txt" 2>&1
nvidia-smi --query-gpu=index,name,uuid,memory.used,memory.total --format=csv > "$OUT/nvidia-smi.csv"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> "$OUT/nvidia-smi.csv"
pkill -TERM -f "celery -A tasks worker"; sleep 3
tar -czf /tmp/obs-results.tgz -C "$OUT" . && find "$OUT" -type f -delete && mv /tmp/obs-results.tgz "$OUT/"
