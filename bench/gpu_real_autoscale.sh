#!/usr/bin/env bash
# The autoscaler with the real upstream models (random weights) on a GPU host, configs/real-gpu.yaml's
# layout (every model stage on its own queue gpuN.<stage>, started from its own interpreter), against the
# models' own compute bound and the predecessor's pool, on the same videos, in one call. -> $OUT
#   make install-upstream && bash bench/gpu_real_autoscale.sh
# The environment: bench/gpu_lib.sh's gpu_env (.venv from `make install`, .device, or $ACTIVATE). The sources:
# gpu_lib.sh's upstream for each real stage (facebookresearch+sam2 or +sam3, facebookresearch+co-tracker,
# rolpotamias+WiLoR, zbw001+TAPIP3D at deploy/envs/pins.sh's commits) into UPSTREAM_DIR (default /tmp/ff-upstream):
# from UPSTREAM_ARCHIVES (on a host without network: bench/gpu_carry.sh up's .gpu/up/upstream), else
# shared/upstream beside the repository, else a clone. About 5.5 minutes on 2 GPUs (setup 60 s).
# masks (GroundingDINO-base + SAM 2.1-L), tracks2d (CoTracker3) and hands (the WiLoR network) run their
# real code (REAL=masks,tracks2d,hands); depth (ViPE) and tracks (TAPIP3D) run the
# stand-ins of tests/standins (bench/real_chain.py says what else is a stand-in). WHEELS, if set: wheels the real
# models need that the environment lacks (hydra-core, omegaconf, antlr4-python3-runtime, iopath, yacs, smplx,
# trimesh; bench/gpu_carry.sh real's .gpu/real/whl).
#  0. setup: random weights, one venv per stage, $B/real.yaml; each real stage loaded once (a stage that
#     fails to load runs its stand-in instead, said in envs.json and the report)
#  A. the autoscaler on GPU 0 (enqueue once every family's first worker is up), and at the same time
#     the compute bound on GPU 1 (bench/real_chain.py bound: one stage process at a time)
#  B. the autoscaler on GPUs 0 and 1, the same videos
#  C. the predecessor's pool on GPU 0 (bench/spawn_until_failure.py --stages-config), on A's intermediates
# Knobs: VIDEOS (6), CLIP_S (2-2.5 s), MAXW (--max-workers-per-gpu, 4), CPUW (CPU workers, 6), PHASES (ABC), AUTOSCALER_FLAGS (more autoscaler flags, e.g. "--max-starting-per-gpu 8" for every load at once).
# The whole chain (bench/gpu_full_chain.sh): REAL=masks,depth,tracks,hands MASKS=sam3 VIPE_WORK=DIR (gpu_vipe.sh's
# WORK) SITES=DIR[:DIR] (more package folders: pointops2, decord) NO_TRACKS2D=1 (configs/real-gpu.yaml as it
# ships) RAW=DIR (these videos, not sample ones) MAX_FLAT_PCT (quality.max_flat_frame_pct; 100: random-weight
# ViPE's planar depth passes y2r's flat-depth gate). A_GPUS (0) and B_GPUS (0,1): the GPUs of A and B;
# BOUND_GPU: the bound's (a list, e.g. 1,2,3, shares the videos over those GPUs: real_chain.py bound --gpus);
# POOL_GPU (0): C's. PARALLEL=1 runs the phases of PHASES side by side (on a 4-GPU host: A_GPUS=0
# BOUND_GPU=1 B_GPUS=2,3), B then without A's learned peaks (it starts from the seeds, as a new cluster does);
# with SETUP=reuse a later call can run the rest (PHASES=BC B_GPUS=0,1 POOL_GPU=2: C over the earlier call's A).
# SETUP=only / SETUP=reuse: the setup in one call, the phases in the next (see BASE below).
source "$(dirname "$0")/gpu_lib.sh"; gpu_env || exit 1
set -u
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
B=${BASE:-/tmp/rc}
# SETUP=only: lay out and check the models, then stop; SETUP=reuse: the phases on what an earlier call laid out
# in BASE (a warm machine keeps /tmp): the setup of the whole chain (random SAM 3 and TAPIP3D weights, every
# model loaded once) and its run then fit one call each.
if [ "${SETUP:-}" = reuse ]; then
  [ -f "$B/real.yaml" ] || { echo "SETUP=reuse: no $B/real.yaml; run SETUP=only first" >&2; exit 1; }
  # only what the phases of this call will make again: an earlier call's A is what C's pool reads
  for p in $(echo "${PHASES:-ABC}" | grep -o .); do rm -rf "$B/out-$p" "$B/$p"-* "$B/res/$p"-*; done
  [[ ${PHASES:-ABC} == *A* ]] && rm -rf "$B"/out-bound "$B"/res/bound.*
  [[ ${PHASES:-ABC} == *C* ]] && rm -rf "$B"/pool-logs "$B"/res/pool.*
else
  rm -rf "$B"; mkdir -p "$B/res"
fi
R=$B/res  # everything measured; $OUT gets report.txt, results.tgz (R) and logs.tgz (every worker's log)
PHASES=${PHASES:-ABC}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
DEV=$([ "$NGPU" -gt 0 ] && echo cuda:0 || echo cpu)
BOUND_GPU=${BOUND_GPU:-$([ "$NGPU" -gt 1 ] && echo 1 || echo 0)}
A_GPUS=${A_GPUS:-0} B_GPUS=${B_GPUS:-0,1} PARALLEL=${PARALLEL:-0}
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$R/gpus.csv" 2>&1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
t0=$(date +%s)
SITE=()
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$B/site" "$WHEELS"/* || exit 1
  SITE=(--site "$B/site")
fi
save() {  # what is measured so far comes back even if the call is cut short
  echo "$1 $(( $(date +%s) - t0 )) s" >> "$OUT/progress.txt"
  tar czf "$OUT/results.tgz" -C "$R" . 2>/dev/null
}

save "wheels installed"
if [ "${SETUP:-}" != reuse ]; then
IFS=: read -r -a more <<< "${SITES:-}"
for d in "${more[@]}"; do SITE+=(--site "$d"); done
[ -n "${VIPE_WORK:-}" ] && SITE+=(--vipe-work "$VIPE_WORK")
[ "${NO_TRACKS2D:-0}" = 1 ] && SITE+=(--no-tracks2d)
[ -n "${MAX_FLAT_PCT:-}" ] && SITE+=(--max-flat-frame-pct "$MAX_FLAT_PCT")
# each real stage's upstream source at its pin (depth's ViPE comes built: VIPE_WORK)
export UPSTREAM_DIR=${UPSTREAM_DIR:-/tmp/ff-upstream}
declare -A SOURCE=([masks]=facebookresearch+$([ "${MASKS:-grounded_sam}" = sam3 ] && echo sam3 || echo sam2)
  [tracks2d]=facebookresearch+co-tracker [hands]=rolpotamias+WiLoR [tracks]=zbw001+TAPIP3D)
for stage in $(echo "${REAL-masks,tracks2d,hands}" | tr ',' ' '); do
  [ -z "${SOURCE[$stage]:-}" ] || upstream "${SOURCE[$stage]}" > /dev/null || exit 1
done
SITE+=(--upstream "$UPSTREAM_DIR")
python3 bench/real_chain.py setup --base "$B" --real "${REAL-masks,tracks2d,hands}" --masks "${MASKS:-grounded_sam}" \
  "${SITE[@]}" > "$R/setup.txt" 2>&1 || { cat "$R/setup.txt" "$B"/prepare-*.log; exit 1; }
if [ -n "${RAW:-}" ]; then
  cp -r "$RAW" "$B/raw"
else
  python3 scripts/make_sample_dataset.py "$B/raw" --videos "${VIDEOS:-6}" --seconds "${CLIP_S:-2-2.5}" > /dev/null
fi
save "models and environments laid out"
python3 bench/real_chain.py check --base "$B" --device "$DEV" > "$R/check.json" 2> "$R/check.err"
cp "$B/real.yaml" "$B/envs.json" "$R/"
echo "setup $(( $(date +%s) - t0 )) s" | tee "$R/report.txt"
save "setup done"
if [ "${SETUP:-}" = only ]; then cat "$R/check.json" "$R/check.err" | tail -n 40; exit 0; fi
else
  echo "setup reused from $B (SETUP=reuse)" | tee "$R/report.txt"
fi
export FRAMEFLEET_CONFIG=$B/real.yaml
# the GPU families each GPU starts one worker of: the enabled stages with an interpreter of their own
FAMILIES=$(python3 -c "import yaml; s = yaml.safe_load(open('$B/real.yaml'))['stages']; \
print(sum(1 for v in s.values() if v.get('python') and v.get('enabled', True)))")

phase() {  # tag, GPUs, Redis db: the autoscaler over the videos, enqueue -> statistics, verified
  local tag=$1 gpus=$2 db=$3 cpus=() smi
  export REDIS_URL=redis://127.0.0.1:${REDIS_PORT:-6379}/$db
  python3 -c "import redis; redis.Redis.from_url('$REDIS_URL').flushdb()"
  # B starts from the peaks A learned (ff:profiles persists in a real deployment's Redis)
  [ "$tag" = B ] && [ "$PARALLEL" != 1 ] && python3 -c "import redis; p = redis.Redis(port=${REDIS_PORT:-6379}, db=4).hgetall('ff:profiles'); \
p and redis.Redis.from_url('$REDIS_URL').hset('ff:profiles', mapping=p)"
  for i in $(seq "${CPUW:-6}"); do
    python3 -m celery -A tasks worker -Q cpu -P solo -n "cpu$i-$tag@%h" -l WARNING > "$B/$tag-cpu$i.log" 2>&1 &
    cpus+=($!)
  done
  nvidia-smi -i "$gpus" --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 \
    > "$R/$tag-smi.csv" 2>/dev/null &
  smi=$!
  python3 bench/busy_share.py sample "$R/$tag-samples.csv" --period-s 0.25 &  # the strict busy share, 4 Hz
  local busy=$!
  python3 -m tasks.autoscaler --gpus "$gpus" --tick-s 1 --cooldown-s 2 --max-workers-per-gpu "${MAXW:-4}" \
    --stop-grace-s 20 --log-dir "$B/$tag-logs" ${AUTOSCALER_FLAGS:-} > "$R/$tag-autoscaler.log" 2>&1 &
  local scaler=$! want=$(( FAMILIES * $(echo "$gpus" | tr ',' '\n' | wc -l) ))
  for _ in $(seq 240); do  # every family's first worker up (models loaded), as on a running cluster
    [ "$(python3 -c "import redis; print(len(list(redis.Redis.from_url('$REDIS_URL').scan_iter('ff:worker:gpu*'))))")" -ge "$want" ] && break
    sleep 0.5
  done
  echo "$tag: workers up $(( $(date +%s) - t0 )) s after start" >> "$R/report.txt"
  save "$tag: workers up"
  timeout "${RUN_TIMEOUT_S:-200}" python3 scripts/enqueue_dataset.py "$B/raw" --out "$B/out-$tag" \
    > "$R/$tag-enqueue.txt" 2>&1
  echo "enqueue exit $?" >> "$R/$tag-enqueue.txt"
  python3 - "$REDIS_URL" "$R/$tag" <<'PYEOF'
import json, sys, redis
r = redis.Redis.from_url(sys.argv[1], decode_responses=True)
with open(sys.argv[2] + "-redis.json", "w") as f:
    json.dump({"decisions": [json.loads(x) for x in r.lrange("ff:autoscale", 0, -1)],
               "oom": r.lrange("ff:oom", 0, -1), "profiles": r.hgetall("ff:profiles")}, f)
PYEOF
  kill -TERM $scaler; wait $scaler; kill $smi $busy "${cpus[@]}" 2>/dev/null; wait $busy "${cpus[@]}" 2>/dev/null
  python3 scripts/verify_dataset.py "$B/out-$tag" > "$R/$tag-verify.txt" 2>&1; echo "verify exit $?" >> "$R/$tag-verify.txt"
  cp "$B/out-$tag/run_summary.json" "$R/$tag-summary.json" 2>/dev/null
  python3 bench/busy_share.py report "$R/$tag-samples.csv" "$R/$tag-summary.json" --gpus "$gpus" \
    --json "$R/$tag-busy.json" > "$R/$tag-busy.txt" 2>&1
  grep -l "OutOfMemory\|out of memory" "$B/$tag-logs"/*.log > "$R/$tag-oom-logs.txt" 2>/dev/null
  tail -n 30 "$B/$tag-logs"/*.log > "$R/$tag-worker-tails.txt" 2>/dev/null
  save "$tag done"
}

pool() {  # C: the predecessor's pool on POOL_GPU, over A's intermediates (out-A, this call's or an earlier one's)
  python3 bench/spawn_until_failure.py --stages-config "$B/real.yaml" --raw "$B/raw" --inputs "$B/out-A" \
    --gpu "${POOL_GPU:-0}" --device "$DEV" --every-s "${EVERY_S:-1}" --max-rounds "${MAX_ROUNDS:-16}" \
    --timeout-s "${POOL_TIMEOUT_S:-120}" --host-floor-mib "${HOST_FLOOR_MIB:-49152}" --log-dir "$B/pool-logs" \
    > "$R/pool.json" 2> "$R/pool.err"
}
bound_start() {  # the bound on BOUND_GPU, or shared over the GPUs of a list (BOUND_GPU=1,2,3: real_chain.py --gpus)
  [ "$BOUND_GPU" = none ] && return  # A alone (bench/gpu_full_chain.sh runs y2r's way in a step of its own)
  if [[ $BOUND_GPU == *,* ]]; then
    python3 bench/real_chain.py bound --config "$B/real.yaml" --raw "$B/raw" --out "$B/out-bound" --device "$DEV" \
      --gpus "$BOUND_GPU" > "$R/bound.json" 2> "$R/bound.err" &
  else
    CUDA_VISIBLE_DEVICES=$BOUND_GPU python3 bench/real_chain.py bound --config "$B/real.yaml" --raw "$B/raw" \
      --out "$B/out-bound" --device "$DEV" > "$R/bound.json" 2> "$R/bound.err" &
  fi
  bound=$!
}

if [ "$PARALLEL" = 1 ]; then  # the phases of PHASES side by side, each on its own GPUs (A with the bound beside it)
  running=() bound=
  if [[ $PHASES == *A* ]]; then
    bound_start
    phase A "$A_GPUS" 4 > "$B/A-phase.log" 2>&1 &
    running+=($!)
  fi
  if [[ $PHASES == *B* ]]; then phase B "$B_GPUS" 5 > "$B/B-phase.log" 2>&1 & running+=($!); fi
  if [[ $PHASES == *C* ]]; then pool & running+=($!); fi
  wait "${running[@]}"
  # the bound has until the phases' end plus BOUND_EXTRA_S; its stages so far are in bound.json
  if [ -n "$bound" ]; then
    for _ in $(seq "${BOUND_EXTRA_S:-60}"); do kill -0 $bound 2>/dev/null || break; sleep 1; done
    kill $bound 2>/dev/null; wait $bound
  fi
  save "parallel phases done"
elif [[ $PHASES == *A* ]]; then
  bound_start
  phase A "$A_GPUS" 4
  wait $bound
fi
[[ $PHASES == *B* ]] && [ "$PARALLEL" != 1 ] && [ "$NGPU" -gt 1 ] && phase B "$B_GPUS" 5
[[ $PHASES == *C* ]] && [ "$PARALLEL" != 1 ] && pool
python3 bench/real_chain.py report --results "$R" | tee -a "$R/report.txt"
cp "$R/report.txt" "$OUT/"
tar czf "$OUT/results.tgz" -C "$R" .
tar czf "$OUT/logs.tgz" -C "$B" --exclude=res --exclude='*.npz' --exclude='*.hdf5' --exclude='*.h5' --exclude=weights \
  --exclude=envs --exclude=upstream --exclude=models --exclude=raw --exclude=site . 2>/dev/null
