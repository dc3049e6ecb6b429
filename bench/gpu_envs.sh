#!/usr/bin/env bash
# On a GPU host: the per-stage-environment layout (configs/real-gpu.yaml, every model stage
# on its own queue gpuN.<stage>, its worker started from that stage's interpreter) with the
# upstream stand-ins (tests/standins) on real CUDA, on 1 GPU and on 2 GPUs. -> $OUT
#   bash bench/gpu_envs.sh            (VIDEOS=12 by default; the environment: bench/gpu_lib.sh's gpu_env)
source "$(dirname "$0")/gpu_lib.sh"; gpu_env || exit 1  # .venv (make install), .device or $ACTIVATE; a Redis
# Records: the dataset verifies; which GPU ran each stage of each video (locality.json: a video
# is local when all its GPU stages ran on one GPU); per-process GPU memory every second.
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
rm -rf /tmp/ff-models /tmp/ff-raw /tmp/ff-out-*
nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv | tee "$OUT/gpus.csv"
PY=$(python3 -c "from tests.backends.standin_env import standin_python; print(standin_python())")
python3 - "$PY" > /tmp/ff-envs.yaml <<'PYEOF'
import sys
from pathlib import Path
from tests.backends.standin_env import lay_out_upstream, real_gpu_yaml_on
models = Path("/tmp/ff-models")
lay_out_upstream(models)
print(real_gpu_yaml_on(models, sys.argv[1]))
PYEOF
cp /tmp/ff-envs.yaml "$OUT/settings.yaml"
python3 scripts/make_sample_dataset.py /tmp/ff-raw --videos "${VIDEOS:-12}" > /dev/null
unset REDIS_URL
for gpus in 0 0,1; do
  tag=$(echo "$gpus" | tr ',' '-')
  nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,used_memory --format=csv -l 1 \
    > "$OUT/apps-$tag.csv" 2>/dev/null &
  sampler=$!
  /usr/bin/time -v python3 scripts/run_local.py /tmp/ff-raw --out "/tmp/ff-out-$tag" --gpus "$gpus" \
    --config /tmp/ff-envs.yaml > "$OUT/run_local-$tag.txt" 2> "$OUT/run_local-$tag.time"
  echo "run_local exit $?" | tee -a "$OUT/run_local-$tag.txt"
  kill "$sampler" 2>/dev/null
  python3 scripts/verify_dataset.py "/tmp/ff-out-$tag" > "$OUT/verify-$tag.txt" 2>&1
  echo "verify exit $?" >> "$OUT/verify-$tag.txt"
  python3 bench/stage_locality.py "/tmp/ff-out-$tag" > "$OUT/locality-$tag.json"
  cp "/tmp/ff-out-$tag/run_summary.json" "$OUT/summary-$tag.json"
  mkdir -p "$OUT/logs-$tag" && cp /tmp/ff-out-$tag/logs/*.log "$OUT/logs-$tag/"
  grep -h "pinned\|no GPU" /tmp/ff-out-$tag/logs/gpu*.log > "$OUT/pinning-$tag.txt"
done
tail -n 2 "$OUT"/run_local-*.txt "$OUT"/verify-*.txt
python3 -c "
import json, glob
for f in sorted(glob.glob('$OUT/locality-*.json')):
    d = json.load(open(f)); print(f, d['videos'], 'videos,', d['local'], 'local;', d['per_stage_gpu'])"
