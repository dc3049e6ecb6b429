#!/usr/bin/env bash
# Per-video latency and peak intermediates on one GPU, stage priorities off (first in, first out) and on,
# in one call on a GPU host (about 6 minutes):
#   bash bench/gpu_latency.sh          (the environment: bench/gpu_lib.sh's gpu_env; results go to $OUT)
# bench/latency.py runs scripts/run_local.py --gpus 0 --gpu-workers PER_GPU --cpu-workers CPUW on VIDEOS
# sample videos with --intermediates drop, ROUNDS rounds alternating the order; the baseline is the
# same tree with FRAMEFLEET_STAGE_PRIORITIES=false. Latency = a video's HDF5 written minus the run's
# start; peak intermediates = the most OUT/work held, read every 0.5 s. The synthetic depth model
# does MATMULS float32 matmuls of SIZE x SIZE per frame, so the GPU queue is the bottleneck.
source "$(dirname "$0")/gpu_lib.sh"; gpu_env || exit 1  # .venv (make install), .device or $ACTIVATE; a Redis
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
VIDEOS=${VIDEOS:-32}; ROUNDS=${ROUNDS:-2}; MATMULS=${MATMULS:-16}; SIZE=${SIZE:-4096}; PER_GPU=${PER_GPU:-1}; CPUW=${CPUW:-8}
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/gpus.csv"
rm -rf /tmp/lat-*  # a warm machine keeps earlier runs
python3 scripts/make_sample_dataset.py /tmp/lat-raw --videos "$VIDEOS" --seconds 2-3 > /dev/null
cat > /tmp/lat.yaml <<YAML
stages:
  depth: {params: {hold_mib: 2048, activation_mib: 1024, matmuls_per_frame: $MATMULS, matmul_size: $SIZE}}
YAML
export FRAMEFLEET_CONFIG=/tmp/lat.yaml
timeout 540 python3 bench/latency.py /tmp/lat-raw --before . --before-env FRAMEFLEET_STAGE_PRIORITIES=false \
  --rounds "$ROUNDS" --work /tmp/lat-out -- --gpus 0 --gpu-workers "$PER_GPU" --cpu-workers "$CPUW" \
  > "$OUT/latency.txt" 2> "$OUT/latency.err"
echo "latency.py exit $?" >> "$OUT/latency.txt"
python3 - "$OUT/latency.txt" <<'PY' | tee "$OUT/summary.txt"
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("round "):
        name, data = line.split(": ", 1)[0].split()[-1], json.loads(line.split(": ", 1)[1])
        rows.setdefault(name, []).append(data)
for name, runs in rows.items():
    med = lambda f: statistics.median(f(r) for r in runs)
    print(f"{name}: {len(runs)} run(s), {runs[0]['videos']} videos; latency median {med(lambda r: r['latency_s']['median']):.1f} s, "
          f"p90 {med(lambda r: r['latency_s']['p90']):.1f} s, max {med(lambda r: r['latency_s']['max']):.1f} s; "
          f"first HDF5 {med(lambda r: r['first_hdf5_s']):.1f} s; in flight median {med(lambda r: r['in_flight_s']['median']):.1f} s; "
          f"peak work {med(lambda r: r['peak_work_mib']):.0f} MiB ({med(lambda r: r['peak_work_videos']):.0f} videos); "
          f"run {med(lambda r: r['run_wall_s']):.1f} s; waits {json.dumps({k: round(v['mean'], 2) for k, v in runs[0]['waits_s'].items()}, ensure_ascii=False)}")
PY
tar -czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
