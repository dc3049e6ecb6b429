#!/usr/bin/env bash
# On a GPU host: the autoscaler with every model stage in its own environment (the stand-ins of
# tests/standins, configs/real-gpu.yaml's layout), one GPU: it starts a family per queue (gpu0.<stage>),
# learns each family's peak and scales each by its own backlog. -> $OUT/envs_autoscale.txt
#   bash bench/gpu_envs_autoscale.sh          (VIDEOS=16 by default; the environment: bench/gpu_lib.sh's gpu_env)
source "$(dirname "$0")/gpu_lib.sh"; gpu_env || exit 1  # .venv (make install), .device or $ACTIVATE; a Redis
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
rm -rf /tmp/fa-models /tmp/fa-raw /tmp/fa-out /tmp/fa-logs
PY=$(python3 -c "from tests.backends.standin_env import standin_python; print(standin_python())")
python3 - "$PY" > /tmp/fa.yaml <<'PYEOF'
import sys
from pathlib import Path
from tests.backends.standin_env import lay_out_upstream, real_gpu_yaml_on
models = Path("/tmp/fa-models")
lay_out_upstream(models)
print(real_gpu_yaml_on(models, sys.argv[1]))
PYEOF
python3 scripts/make_sample_dataset.py /tmp/fa-raw --videos "${VIDEOS:-16}" > /dev/null
export REDIS_URL=redis://127.0.0.1:6379/3
python3 -m celery -A tasks worker -Q cpu -P solo -c 1 -n cpu1@%h -l INFO > /tmp/fa-cpu1.log 2>&1 &
python3 -m celery -A tasks worker -Q cpu -P solo -c 1 -n cpu2@%h -l INFO > /tmp/fa-cpu2.log 2>&1 &
python3 -m tasks.autoscaler --gpus 0 --config /tmp/fa.yaml --tick-s 1 --cooldown-s 2 --max-workers-per-gpu 3 \
  --log-dir /tmp/fa-logs > "$OUT/autoscaler.log" 2>&1 &
auto=$!
sleep 20
start=$(date +%s.%N)
python3 scripts/enqueue_dataset.py /tmp/fa-raw --out /tmp/fa-out --config /tmp/fa.yaml > "$OUT/enqueue.txt" 2>&1
echo "enqueue exit $? after $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s" | tee -a "$OUT/envs_autoscale.txt"
python3 scripts/verify_dataset.py /tmp/fa-out >> "$OUT/envs_autoscale.txt" 2>&1
python3 - >> "$OUT/envs_autoscale.txt" <<'PYEOF'
import collections, json, redis
r = redis.Redis.from_url("redis://127.0.0.1:6379/3", decode_responses=True)
decisions = [json.loads(x) for x in r.lrange("ff:autoscale", 0, -1)]
family = lambda d: (d.get("worker") or "?").rsplit("-", 1)[0]
print("scale-ups per family:", dict(collections.Counter(family(d) for d in decisions if d.get("action") == "up")))
for d in decisions[:40]:
    print(d.get("action"), family(d), d.get("reason"))
print("profiles:", r.hgetall("ff:profiles"))
PYEOF
kill -TERM $auto; wait $auto
cat "$OUT/envs_autoscale.txt"
