#!/usr/bin/env bash
# GPU busy fraction and 1 -> 2 -> 4 GPU scaling, in one call on the GPU machine (about 6 minutes):
#   bash bench/gpu_scaling.sh          (it sources .device/activate.sh itself; results go to $OUT)
# (a) the compute bound: bench/gpu_bound.py, the GPU stages' calls on inputs in memory, one process;
# (b) framefleet on GPU 0 with the NVML autoscaler, enqueue to statistics; busy fraction = (a) / (b);
# (c) scripts/run_local.py on 1, 2 and 4 GPUs (PER_GPU solo workers each); efficiency T1 / (k * Tk).
# The synthetic depth model does MATMULS float32 matmuls of SIZE x SIZE per frame: compute-bound.
source "${ACTIVATE:-.device/activate.sh}"  # ACTIVATE: /tmp/ff-bin/activate.sh on a warm machine without .device
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
VIDEOS=${VIDEOS:-48}; MATMULS=${MATMULS:-16}; SIZE=${SIZE:-4096}; PER_GPU=${PER_GPU:-2}; CPUW=${CPUW:-8}
PHASES=${PHASES:-abc}  # which of (a), (b), (c) to run: a longer (c) fits one call without (a) and (b)
WARM=${WARM:-0}  # 1: (b) enqueues once the autoscaler's first worker is up (a running cluster), not at its start
KS=${KS:-1 2 4}  # the GPU counts (c) runs, e.g. KS="1 4" for a long 4-GPU figure within one call
RUN_S=${RUN_S:-300}  # each (c) run's time limit
# KEEP_RAW=1: reuse /tmp/sc-raw from an earlier call on the same warm machine (e.g. KS=4, then KS=1 next call)
NGPU=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/gpus.csv"
if [ "${KEEP_RAW:-0}" = 1 ] && [ -d /tmp/sc-raw ]; then  # the videos an earlier call wrote (a warm machine keeps /tmp)
  rm -rf /tmp/sc-[abc]*
  echo "videos: kept from an earlier call: $(ls /tmp/sc-raw | wc -l)"
else
  rm -rf /tmp/sc-*  # a warm machine keeps earlier runs
  python3 scripts/make_sample_dataset.py /tmp/sc-raw --videos "$VIDEOS" --seconds 2-3 --jobs "$(nproc)" > /dev/null
fi
cat > /tmp/sc.yaml <<YAML
stages:
  depth: {params: {hold_mib: 2048, activation_mib: 1024, matmuls_per_frame: $MATMULS, matmul_size: $SIZE}}
YAML
export FRAMEFLEET_CONFIG=/tmp/sc.yaml
sample() {  # GPU utilisation and memory twice a second: "epoch index util% used-MiB"
  while true; do
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits | sed "s/^/$(date +%s.%N), /"
    sleep 0.5
  done
}

if [[ $PHASES == *a* ]]; then
echo "(a) compute bound $(date +%T)"
timeout 300 python3 bench/gpu_bound.py /tmp/sc-raw > "$OUT/a-bound.json" 2> "$OUT/a-bound.err"
fi

if [[ $PHASES == *b* ]]; then
echo "(b) one GPU with the autoscaler $(date +%T)"
redis-server --port 6391 --save '' --appendonly no --daemonize yes > /dev/null
export REDIS_URL=redis://127.0.0.1:6391/0
python3 -m celery -A tasks worker -Q cpu -c "$CPUW" -n cpu@%h --loglevel WARNING > "$OUT/b-cpu.log" 2>&1 &
cpu=$!
sample > "$OUT/b-samples.csv" &
smp=$!
python3 scripts/autoscaler.py --gpus 0 --max-workers-per-gpu 8 --headroom-mib 2048 --tick-s 1 --cooldown-s 2 \
  --stop-grace-s 30 --log-dir /tmp/sc-as > "$OUT/b-autoscaler.log" 2>&1 &
scaler=$!
if [ "$WARM" = 1 ]; then
  for _ in $(seq 240); do
    [ -n "$(redis-cli -p 6391 --scan --pattern 'ff:worker:gpu0*' | head -1)" ] && break
    sleep 0.5
  done
fi
timeout 300 python3 scripts/enqueue_dataset.py /tmp/sc-raw --out /tmp/sc-b > "$OUT/b-enqueue.txt" 2>&1
echo "enqueue exit $?" >> "$OUT/b-enqueue.txt"
kill $smp; kill -TERM $scaler; wait $scaler; kill -TERM $cpu; wait $cpu
python3 -c "import redis; r = redis.Redis(port=6391, decode_responses=True); \
print('\n'.join(r.lrange('ff:stages', 0, -1)))" > "$OUT/b-stages.jsonl"
redis-cli -p 6391 shutdown nosave > /dev/null 2>&1
unset REDIS_URL
cp /tmp/sc-b/run_summary.json "$OUT/b-summary.json"
fi

for k in $KS; do
  [[ $PHASES == *c* && "$k" -le "$NGPU" ]] || continue
  echo "(c) $k GPU(s) $(date +%T)"
  sample > "$OUT/c$k-samples.csv" &
  smp=$!
  timeout "$RUN_S" python3 scripts/run_local.py /tmp/sc-raw --out "/tmp/sc-c$k" --gpus "$(seq -s, 0 $((k - 1)))" \
    --gpu-workers "$PER_GPU" --cpu-workers "$CPUW" > "$OUT/c$k-run_local.txt" 2>&1
  echo "run_local exit $?" >> "$OUT/c$k-run_local.txt"
  kill $smp
  cp "/tmp/sc-c$k/run_summary.json" "$OUT/c$k-summary.json"
done

python3 - "$OUT" <<'PY' | tee "$OUT/scaling.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    p = out / name
    return json.loads(p.read_text().strip().splitlines()[-1] if name.endswith("bound.json") else p.read_text()) if p.exists() else None
def util(name, gpus):
    rows = [l.split(", ") for l in (out / name).read_text().splitlines() if l.count(",") == 3] if (out / name).exists() else []
    vals = [float(r[2]) for r in rows if int(r[1]) in gpus]
    return sum(vals) / len(vals) if vals else float("nan")
a, b = load("a-bound.json"), load("b-summary.json")
if a and b:
    print(f"(a) compute bound {a['bound_s']:.1f} s for {a['videos']} videos, {a['frames']} frames on {a['device']}; per stage {a['per_stage_s']}")
    print(f"(b) framefleet + autoscaler, 1 GPU: {b['wall_s']:.1f} s enqueue->statistics, {b['done']} done; "
          f"busy fraction (a)/(b) = {a['bound_s'] / b['wall_s']:.3f}; mean GPU util {util('b-samples.csv', [0]):.0f} %")
def idle(name, gpu):
    """Where a GPU's idle time went, from the samples: before its first busy sample (start), after
    its last (tail), and the unused share in between (hand-offs), in seconds."""
    path = out / name
    if not path.exists():
        return None
    rows = [l.split(", ") for l in path.read_text().splitlines() if l.count(",") == 3]
    pts = [(float(r[0]), float(r[2])) for r in rows if int(r[1]) == gpu]
    if len(pts) < 3:
        return None
    busy = [t for t, u in pts if u >= 50]
    if not busy:
        return None
    mid = [(t, u) for t, u in pts if busy[0] <= t <= busy[-1]]
    lost = sum((t2 - t1) * (1 - u1 / 100) for (t1, u1), (t2, _) in zip(mid, mid[1:]))
    return f"GPU {gpu}: {pts[-1][0] - pts[0][0]:.1f} s sampled; start {busy[0] - pts[0][0]:.1f} s, hand-offs {lost:.1f} s, tail {pts[-1][0] - busy[-1]:.1f} s idle"
for name, gpus in (("b-samples.csv", [0]), ("c1-samples.csv", [0]), ("c2-samples.csv", [0, 1]), ("c4-samples.csv", [0, 1, 2, 3])):
    for g in gpus:
        line = idle(name, g)
        if line:
            print(f"idle {name.split('-')[0]}: {line}")
t = {k: load(f"c{k}-summary.json") for k in (1, 2, 4)}
for k, s in t.items():
    if s and t[1]:
        print(f"(c) {k} GPU(s): {s['wall_s']:.1f} s, {s['done']} done; speed-up {t[1]['wall_s'] / s['wall_s']:.2f}; "
              f"efficiency T1/(k*Tk) = {t[1]['wall_s'] / (k * s['wall_s']):.3f}; "
              f"mean util {util(f'c{k}-samples.csv', list(range(k))):.0f} %")
PY
tar -czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
