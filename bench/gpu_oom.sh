#!/usr/bin/env bash
# On a GPU host: a real CUDA out-of-memory error in a task is caught, the cache freed, and the
# retry with half the activation chunk succeeds. -> $OUT
#   bash bench/gpu_oom.sh        (the environment: bench/gpu_lib.sh's gpu_env)
source "$(dirname "$0")/gpu_lib.sh"; gpu_env || exit 1  # .venv (make install), .device or $ACTIVATE; a Redis
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
rm -rf /tmp/oom-out
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
hold=$(( total * 60 / 100 )); act=$(( total * 50 / 100 ))   # 110 % of the card: the first try cannot fit
echo "GPU total ${total} MiB; depth holds ${hold} MiB and asks ${act} MiB more per call" | tee "$OUT/oom.txt"
cat > /tmp/oom.yaml <<YAML
stages:
  depth: {params: {hold_mib: $hold, activation_mib: $act, matmuls_per_frame: 200}}
YAML
export FRAMEFLEET_CONFIG=/tmp/oom.yaml
python3 scripts/make_sample_dataset.py /tmp/raw1 --videos 1 > /dev/null
python3 -m celery -A tasks worker -Q gpu0 -P solo -c 1 -n gpu0@%h -E --without-gossip --without-mingle \
  > "$OUT/gpu0.log" 2>&1 &
python3 -m celery -A tasks worker -Q cpu -c 2 -n cpu@%h > "$OUT/cpu.log" 2>&1 &
timeout 240 python3 scripts/enqueue_dataset.py /tmp/raw1 --out /tmp/oom-out >> "$OUT/oom.txt" 2>&1
echo "enqueue exit $?" >> "$OUT/oom.txt"
python3 -c "import redis; print('\n'.join(redis.Redis(decode_responses=True).lrange('ff:oom', 0, -1)))" >> "$OUT/oom.txt"
grep -h "OutOfMemory\|retry\|ran depth" "$OUT/gpu0.log" | cut -c1-300 >> "$OUT/oom.txt"
python3 -c "import json; s=json.load(open('/tmp/oom-out/run_summary.json')); print('done', s['done'], 'failed', s['failed'])" >> "$OUT/oom.txt"
pkill -TERM -f "celery -A tasks worker"; sleep 2
cat "$OUT/oom.txt"
