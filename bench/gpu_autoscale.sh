#!/usr/bin/env bash
# On a GPU host: the spawn-until-failure baseline, then the autoscaler on GPU 0 alone and on every GPU,
# with a synthetic depth model that holds HOLD_MIB after loading and ACT_MIB more at peak; one worker is
# SIGKILLed mid-task. -> $OUT
#   bash bench/gpu_autoscale.sh        (the environment: bench/gpu_lib.sh's gpu_env)
source "$(dirname "$0")/gpu_lib.sh"; gpu_env || exit 1  # .venv (make install), .device or $ACTIVATE; a Redis
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
rm -rf /tmp/out-one /tmp/out-all /tmp/as-one /tmp/as-all  # a warm machine keeps earlier runs
HOLD_MIB=${HOLD_MIB:-13000}; ACT_MIB=${ACT_MIB:-3000}; MATMULS=${MATMULS:-20000}
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/gpus.csv"
python3 bench/spawn_until_failure.py --gpu 0 --hold-mib "$HOLD_MIB" --activation-mib "$ACT_MIB" \
  | tee "$OUT/baseline.json"
python3 scripts/make_sample_dataset.py /tmp/raw --videos ${VIDEOS:-48} --seconds 2-3 > /dev/null
cat > /tmp/big.yaml <<YAML
stages:
  depth: {params: {hold_mib: $HOLD_MIB, activation_mib: $ACT_MIB, matmuls_per_frame: $MATMULS}}
YAML
export FRAMEFLEET_CONFIG=/tmp/big.yaml
python3 -m celery -A tasks worker -Q cpu -c 8 -n cpu@%h --loglevel WARNING > "$OUT/cpu.log" 2>&1 &
cpu=$!
py_redis() { python3 -c "import redis; r = redis.Redis(decode_responses=True); $1"; }
sample() {  # GPU memory and process counts every second
  while true; do
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits | tr '\n' ' ' | sed "s/^/$(date +%s) /"
    echo; sleep 1
  done
}
for phase in ${PHASES:-one all}; do
  gpus=$([ $phase = one ] && echo 0 || echo all)
  py_redis "r.delete('ff:autoscale', 'ff:oom')" > /dev/null
  [ "${FRESH_PROFILES:-0}" = 1 ] && py_redis "r.delete('ff:profiles')"
  sample > "$OUT/$phase-samples.txt" &
  sampler=$!
  python3 scripts/autoscaler.py --gpus "$gpus" --max-workers-per-gpu 16 --headroom-mib 2048 --tick-s 1 \
    --cooldown-s 4 --stop-grace-s 60 --log-dir "/tmp/as-$phase" > "$OUT/$phase-autoscaler.log" 2>&1 &
  scaler=$!
  start=$(date +%s)
  python3 scripts/enqueue_dataset.py /tmp/raw --out "/tmp/out-$phase" > "$OUT/$phase-enqueue.txt" 2>&1 &
  enq=$!
  if [ $phase = all ]; then  # kill one busy worker mid-task, once workers are packed
    sleep 30
    victim=$(pgrep -f "worker -Q gpu1" | head -1)
    echo "$(date +%s) SIGKILL $victim $(tr '\0' ' ' < /proc/$victim/cmdline)" | tee "$OUT/kill.txt"
    [ -n "$victim" ] && kill -9 "$victim"
  fi
  wait $enq; echo "enqueue exit $? after $(( $(date +%s) - start )) s" >> "$OUT/$phase-enqueue.txt"
  py_redis "print('\\n'.join(reversed(r.lrange('ff:autoscale', 0, -1))))" > "$OUT/$phase-decisions.jsonl"
  py_redis "print('\\n'.join(r.lrange('ff:oom', 0, -1)))" > "$OUT/$phase-oom.jsonl"
  py_redis "print(r.hgetall('ff:profiles'))" > "$OUT/$phase-profiles.txt"
  kill -TERM $scaler; wait $scaler; echo "autoscaler exit $?" >> "$OUT/$phase-autoscaler.log"
  kill $sampler
  python3 scripts/verify_dataset.py "/tmp/out-$phase" > "$OUT/$phase-verify.txt" 2>&1
  cp "/tmp/out-$phase/run_summary.json" "$OUT/$phase-summary.json"
  grep -h "OutOfMemory\|exited\|restart" /tmp/as-$phase/*.log 2>/dev/null | tail -20 > "$OUT/$phase-worker-events.txt"
done
kill $cpu
tar -czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
tail -n 3 "$OUT"/*-enqueue.txt "$OUT"/*-verify.txt
