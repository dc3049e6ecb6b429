#!/usr/bin/env bash
# GPU busy share and 1 -> 2 -> 4 GPU scaling, in one call on a GPU host (about 7 minutes with VIDEOS=144 on 2 GPUs):
#   bash bench/gpu_scaling.sh          (the environment: bench/gpu_lib.sh's gpu_env; results go to $OUT)
# Every GPU's NVML utilisation is sampled at 4 Hz for the whole call (bench/busy_share.py sample).
# (a) the compute bound: bench/gpu_bound.py, the GPU stages' calls on inputs in memory, one process; on a machine of
#     several GPUs it runs on the last GPU beside (b) on 1 GPU, else before it;
# (b) framefleet with the NVML autoscaler on the first k GPUs for each k in BK, enqueue to statistics: the sampled
#     busy share of each GPU over the run's window (bench/busy_share.py report), idle split into start, hand-offs and
#     tail; beside it the old ratio (a) / (b, 1 GPU); 1 -> 2 efficiency T1 / (2 T2). Each (b) is a new cluster (a
#     fresh Redis, no worker) whose pool starts before the first video (WARM=1: the enqueue waits for one registered
#     worker per GPU) and whose learned store remembers the peak of the last run (PRIME=1: a run of PRIME_VIDEOS on
#     GPU 0 first, its ff:profiles put into each fresh Redis; PRIME=0: nothing remembered);
# (c) scripts/run_local.py on 1, 2 and 4 GPUs (PER_GPU solo workers each); efficiency T1 / (k * Tk).
# The synthetic depth model does MATMULS float32 matmuls of SIZE x SIZE per frame: compute-bound.
# ACTIVATE: e.g. /tmp/ff-bin/activate.sh (bench/gpu_full_chain.sh) on a warm machine without .device
source "$(dirname "$0")/gpu_lib.sh"; gpu_env || exit 1  # .venv (make install), .device or $ACTIVATE; a Redis
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; R=$OUT/z; mkdir -p "$R"  # R: every file but the figures and the samples, archived at the end
VIDEOS=${VIDEOS:-48}; MATMULS=${MATMULS:-16}; SIZE=${SIZE:-4096}; PER_GPU=${PER_GPU:-2}; CPUW=${CPUW:-8}
PHASES=${PHASES:-ab}  # which of (a), (b), (c) to run: a longer (c) fits one call without (a) and (b)
WARM=${WARM:-1}  # 1: (b) enqueues once the autoscaler's POOL workers on each GPU are up; 0: at the autoscaler's start
# POOL: the workers each GPU keeps before the first video (the autoscaler's --min-workers-per-gpu): with two, one
# computes while the other hands off between tasks during the seconds the rest take to load
POOL=${POOL:-2}
BK=${BK:-1 2}  # the GPU counts (b) runs the autoscaler on
PRIME=${PRIME:-1}; PRIME_VIDEOS=${PRIME_VIDEOS:-4}
# AUTOSCALER_FLAGS: more flags for (b)'s autoscaler; the code before the busy-share work ran as WARM=0 PRIME=0 POOL=1
# AUTOSCALER_FLAGS="--quick-load-s 0" (an empty learned store, the pool started with the enqueue, two loads at a time)
CHAIN_S=${CHAIN_S:-420}  # each (b) run's time limit
PORT=${PORT:-6391}  # the (b) runs' Redis
KS=${KS:-1 2 4}  # the GPU counts (c) runs, e.g. KS="1 4" for a long 4-GPU figure within one call
RUN_S=${RUN_S:-300}  # each (c) run's time limit
# KEEP_RAW=1: reuse /tmp/sc-raw from an earlier call on the same warm machine (e.g. KS=4, then KS=1 next call)
NGPU=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$R/gpus.csv"
if [ "${KEEP_RAW:-0}" = 1 ] && [ -d /tmp/sc-raw ]; then  # the videos an earlier call wrote (a warm machine keeps /tmp)
  rm -rf /tmp/sc-[abc]* /tmp/sc-prime* /tmp/sc-as-*  # every output of the runs: an enqueue refuses a folder that holds one
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
python3 bench/busy_share.py sample "$OUT/samples.csv" --period-s 0.25 &
smp=$!

BOUND_GPU=0; [ "$NGPU" -gt 1 ] && BOUND_GPU=$((NGPU - 1))
bound=
if [[ $PHASES == *a* ]]; then
  echo "(a) compute bound on GPU $BOUND_GPU $(date +%T)"
  timeout 600 python3 bench/gpu_bound.py /tmp/sc-raw --device "cuda:$BOUND_GPU" > "$R/a-bound.json" 2> "$R/a-bound.err" &
  bound=$!
  [ "$BOUND_GPU" = 0 ] && { wait $bound; bound=; }
fi

rpy() { python3 -c "import redis; r = redis.Redis(port=$PORT); $1"; }  # the machine has no redis-cli

run_b() {  # TAG K RAW: framefleet with the autoscaler on GPUs 0..K-1, a new cluster, enqueue -> statistics
  local tag=$1 k=$2 raw=$3 gpus
  gpus=$(seq -s, 0 $((k - 1)))
  echo "($tag) $k GPU(s) with the autoscaler $(date +%T)"
  redis-server --port $PORT --save '' --appendonly no --daemonize yes > /dev/null
  export REDIS_URL=redis://127.0.0.1:$PORT/0
  rpy "import time
for _ in range(100):
    try:
        r.ping(); break
    except redis.ConnectionError:
        time.sleep(0.1)"
  [ -s /tmp/sc-profiles.json ] && python3 -c "import json, redis; p = json.load(open('/tmp/sc-profiles.json')); \
p and redis.Redis(port=$PORT).hset('ff:profiles', mapping=p)"
  python3 -m celery -A tasks worker -Q cpu -c "$CPUW" -n cpu@%h --loglevel WARNING > "$R/$tag-cpu.log" 2>&1 &
  local cpu=$!
  python3 scripts/autoscaler.py --gpus "$gpus" --max-workers-per-gpu 8 --headroom-mib 2048 --tick-s 1 --cooldown-s 2 \
    --stop-grace-s 30 --min-workers-per-gpu "$POOL" --log-dir "/tmp/sc-as-$tag" ${AUTOSCALER_FLAGS:-} > "$R/$tag-autoscaler.log" 2>&1 &
  local scaler=$!
  if [ "$WARM" = 1 ]; then  # the pool starts before the first video: one registered worker per GPU
    rpy "import time
for _ in range(480):
    if all(len(list(r.scan_iter('ff:worker:gpu%d-*' % g, count=1000))) >= $POOL for g in range($k)):
        break
    time.sleep(0.25)
else:
    print('($tag) not $POOL registered workers on each of $k GPU(s) after 120 s: enqueueing anyway')"
  fi
  timeout "$CHAIN_S" python3 scripts/enqueue_dataset.py "$raw" --out "/tmp/sc-$tag" --gpus "$gpus" > "$R/$tag-enqueue.txt" 2>&1
  local status=$?
  echo "enqueue exit $status" >> "$R/$tag-enqueue.txt"
  [ $status = 0 ] || echo "($tag) the enqueue failed (exit $status): $(tail -n 3 "$R/$tag-enqueue.txt" | tr '\n' ' ')"
  kill -TERM $scaler; wait $scaler; kill -TERM $cpu; wait $cpu
  python3 - "$R/$tag" "$PORT" <<'PY'
import json, sys, redis
r = redis.Redis(port=int(sys.argv[2]), decode_responses=True)
json.dump(r.hgetall("ff:profiles"), open("/tmp/sc-profiles.json", "w"))  # the learned store the next run remembers
open(sys.argv[1] + "-autoscale.jsonl", "w").write("\n".join(r.lrange("ff:autoscale", 0, -1)) + "\n")
open(sys.argv[1] + "-stages.jsonl", "w").write("\n".join(r.lrange("ff:stages", 0, -1)) + "\n")
PY
  rpy "import time
try:
    r.shutdown(nosave=True)
except redis.ConnectionError:
    pass
for _ in range(50):  # gone before the next run's starts on the port
    try:
        r.ping(); time.sleep(0.1)
    except redis.ConnectionError:
        break"
  unset REDIS_URL
  cp "/tmp/sc-$tag/run_summary.json" "$R/$tag-summary.json"
}

if [[ $PHASES == *b* ]]; then
  rm -f /tmp/sc-profiles.json
  if [ "$PRIME" = 1 ]; then  # the last run, whose learned peak the measured runs remember
    mkdir -p /tmp/sc-prime-raw
    ls /tmp/sc-raw | tail -n "$PRIME_VIDEOS" | while read -r v; do cp "/tmp/sc-raw/$v" "/tmp/sc-prime-raw/p-$v"; done
    run_b prime 1 /tmp/sc-prime-raw
    echo "remembered: $(cat /tmp/sc-profiles.json)"
  fi
  for k in $BK; do
    [ "$k" -le "$NGPU" ] && run_b "b$k" "$k" /tmp/sc-raw
    [ -n "$bound" ] && { wait $bound; bound=; }  # (a) beside the first run only
  done
fi
[ -n "$bound" ] && wait $bound

for k in $KS; do
  [[ $PHASES == *c* && "$k" -le "$NGPU" ]] || continue
  echo "(c) $k GPU(s) $(date +%T)"
  timeout "$RUN_S" python3 scripts/run_local.py /tmp/sc-raw --out "/tmp/sc-c$k" --gpus "$(seq -s, 0 $((k - 1)))" \
    --gpu-workers "$PER_GPU" --cpu-workers "$CPUW" > "$R/c$k-run_local.txt" 2>&1
  echo "run_local exit $?" >> "$R/c$k-run_local.txt"
  cp "/tmp/sc-c$k/run_summary.json" "$R/c$k-summary.json"
done

kill $smp; wait $smp

python3 - "$R" "$OUT/samples.csv" <<'PY' | tee "$OUT/scaling.txt"
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
from bench.busy_share import busy, read_samples
out = Path(sys.argv[1])
def load(name):
    p = out / name
    return json.loads(p.read_text().strip().splitlines()[-1] if name.endswith("bound.json") else p.read_text()) if p.exists() else None
def shares(summary, gpus):
    """The strict measure of each GPU over the run's window, from the samples of the whole call."""
    return [busy(read_samples(Path(sys.argv[2]), g), summary["started"], summary["finished"], g) for g in gpus]
figures = {}
a = load("a-bound.json")
if a:
    print(f"(a) compute bound {a['bound_s']:.1f} s for {a['videos']} videos, {a['frames']} frames on {a['device']}; per stage {a['per_stage_s']}")
for tag in ("prime", "b1", "b2", "b4", *(f"c{k}" for k in (1, 2, 4))):
    s = load(f"{tag}-summary.json")
    if not s:
        continue
    k = 1 if tag == "prime" else int(tag[1:])
    try:
        found = shares(s, list(range(k)))
    except (ValueError, KeyError, OSError) as exc:
        print(f"({tag}) {s['wall_s']:.1f} s, {s['done']} done; no sampled busy share: {exc}")
        continue
    figures[tag] = {"wall_s": s["wall_s"], "done": s["done"], "videos": s["videos"], "gpus": [vars(b) for b in found]}
    old = f"; old ratio (a)/(b) = {a['bound_s'] / s['wall_s']:.3f}" if a and tag == "b1" else ""
    mean = sum(b.share for b in found) / len(found)
    print(f"({tag}) {k} GPU(s): {s['wall_s']:.1f} s enqueue->statistics, {s['done']}/{s['videos']} done; "
          f"sampled busy share {mean:.3f}{old}")
    steps = [json.loads(l) for l in (out / f"{tag}-autoscale.jsonl").read_text().splitlines() if l.strip()] \
        if (out / f"{tag}-autoscale.jsonl").exists() else []
    ups = {}
    for d in steps:
        if d.get("action") == "up":  # one record per worker started; grouped by GPU and second
            at = (d["gpu"], round(d["time"] - s["started"]))
            ups[at] = ups.get(at, 0) + 1
    print("    autoscaler, workers started (GPU: +n at s from the enqueue): "
          + ", ".join(f"{g}: +{n} at {t:+d}" for (g, t), n in sorted(ups.items())))
    for b in found:
        print(f"    GPU {b.gpu}: share {b.share:.3f} over {b.window_s:.1f} s ({b.hz:.1f} Hz); idle start {b.start_s:.1f} s, "
              f"hand-offs {b.handoffs_s:.1f} s, tail {b.tail_s:.1f} s")
for kind in ("b", "c"):
    one = figures.get(f"{kind}1")
    for k in (2, 4):
        more = figures.get(f"{kind}{k}")
        if one and more:
            print(f"({kind}) 1 -> {k} GPUs: efficiency T1/({k}*T{k}) = {one['wall_s'] / (k * more['wall_s']):.3f}")
(out.parent / "busy.json").write_text(json.dumps({"bound": a, "runs": figures}, indent=2))
PY
# what comes back is at most 8 files: the figures, the samples, and the rest in one archive
tar -czf "$OUT/results.tgz" -C "$R" . 2>/dev/null && rm -rf "$R"
