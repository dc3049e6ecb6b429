#!/usr/bin/env bash
# On a GPU host: the local cluster on real CUDA (one worker per GPU), then the GPU tests.
#   bash bench/gpu_smoke.sh        (the environment: bench/gpu_lib.sh's gpu_env; results go to $OUT)
source "$(dirname "$0")/gpu_lib.sh"; gpu_env || exit 1  # .venv (make install), .device or $ACTIVATE; a Redis
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv | tee "$OUT/gpus.csv"
python3 scripts/make_sample_dataset.py /tmp/raw --videos ${VIDEOS:-6} > /dev/null
cat > /tmp/gpu.yaml <<YAML
stages:
  depth: {params: {hold_mib: 2048, activation_mib: 1024, matmuls_per_frame: 2000}}
  tracks: {params: {hold_mib: 512}}
  hands: {params: {hold_mib: 512}}
YAML
unset REDIS_URL
/usr/bin/time -v python3 scripts/run_local.py /tmp/raw --out /tmp/out --config /tmp/gpu.yaml \
  > "$OUT/run_local.txt" 2> "$OUT/run_local.time"
echo "run_local exit $?" | tee -a "$OUT/run_local.txt"
grep -h "pinned\|loaded\|no GPU" /tmp/out/logs/gpu*.log | tee "$OUT/pinning.txt"
python3 scripts/verify_dataset.py /tmp/out > "$OUT/verify.txt" 2>&1; echo "verify exit $?" >> "$OUT/verify.txt"
python3 bench/overhead.py /tmp/out > "$OUT/overhead.txt"
cp /tmp/out/run_summary.json "$OUT/"
mkdir -p "$OUT/logs" && cp /tmp/out/logs/*.log "$OUT/logs/"
python3 -m pytest -q -m gpu tests/test_gpu_probe.py tests/test_gpu_pinning.py -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests exit $?" >> "$OUT/gpu_tests.txt"
tail -n 3 "$OUT/gpu_tests.txt" "$OUT/verify.txt" "$OUT/run_local.txt" "$OUT/overhead.txt"
