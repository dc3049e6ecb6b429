#!/usr/bin/env bash
# The whole chain with every real upstream model (random weights) under the autoscaler, configs/real-gpu.yaml's
# layout: SAM 3 masks, ViPE lyra depth, TAPIP3D tracks, WiLoR hands, each in its own interpreter, on 24 two-second
# segments of bench/gpu_lib.sh's clips (dog, sheep, pstudio); and the synthetic model's 1 -> 4 GPU scaling. On a
# 4-GPU host with network, the steps one after another (each STEP=... bash bench/gpu_full_chain.sh):
#   for s in prep1 prep2 run1 run2 synth; do STEP=$s bash bench/gpu_full_chain.sh || break; done
# The environment is bench/gpu_lib.sh's gpu_env (.venv from `make install`, .device, or $ACTIVATE); it must hold what
# the real models import where the carried wheel folders below are absent (REAL_WHEELS, DECORD_WHEELS, and
# bench/gpu_vipe.sh's WHEELS, EXTRA, EIGEN: bench/gpu_carry.sh makes them). The sources come from gpu_lib.sh's
# upstream (UPSTREAM_ARCHIVES, default .gpu/up/upstream where carried, else a clone), the clips from its clip
# (FRAMEFLEET_REAL_DATA, default .gpu/up/data where carried, else shared/data/real, else synthetic ones, said so).
# On a lending machine without network: calls on one warm 4-GPU machine (kind nvidia-h100-x4), each started within
# the idle release of the one before, since only /tmp lasts between calls and what one call may carry (64 MiB)
# holds no two of the pieces:
#   STEP=prep1  carry .device .gpu/real .gpu/up   STEP=prep1 bash bench/gpu_full_chain.sh
#     keeps the machine's framefleet packages and redis for later calls (/tmp/ff-bin/activate.sh, from .device),
#     installs the real models' packages into /tmp/ff-full/site, keeps the archives and cuts the 24 videos (60 s).
#   STEP=prep2  carry .gpu/vipe .gpu/real2        STEP=prep2 bash bench/gpu_full_chain.sh
#     builds vipe_ext and ViPE's random cache (bench/gpu_vipe.sh FRAMES=0, WORK=/tmp/ff-vipe), TAPIP3D's
#     pointops2 and decord into /tmp/ff-full/site, then the chain's setup (random SAM 3, TAPIP3D and WiLoR
#     weights, every model loaded once: bench/gpu_real_autoscale.sh SETUP=only).
#   STEP=run1   carry nothing                     STEP=run1 bash bench/gpu_full_chain.sh
#     A: the autoscaler on GPU 0, enqueue -> statistics, verified; beside it the models' own compute bound,
#     the videos shared over GPUs 1-3 (real_chain.py bound --gpus 1,2,3: each stage process still alone on a GPU).
#   STEP=run2   carry nothing                     STEP=run2 bash bench/gpu_full_chain.sh
#     B: the autoscaler on GPUs 0 and 1 from the seeds, as a new cluster starts; beside it C, the predecessor's
#     pool (one process per model per round until one fails) on GPU 2 over A's intermediates; the report of
#     all four (busy fraction = bound / A, 1 -> 2 = A / (2 B)).
#   STEP=synth  carry nothing                     STEP=synth bash bench/gpu_full_chain.sh
#     the synthetic compute-bound model's 1 -> 4 GPU scaling (bench/gpu_scaling.sh PHASES=c KS="4 1",
#     VIDEOS=288), alone on the machine.
# On a 2-GPU machine (kind nvidia-h100-x2) run1 puts the whole bound on GPU 1 beside A and run2 runs B alone (no
# GPU is left for C); then COUNT=16 in prep1 keeps run1 within a call (the bound alone is about 20 s a video plus
# the loads), with BOUND_EXTRA_S=200 so the bound may end after A.
# Each step writes $OUT/<step>.txt and $OUT/<step>.tgz; knobs: COUNT (24 segments, prep1), VIDEOS (288), RUN_S (420), CHAIN_S (the enqueue's limit: 450 in run1, 420 in run2),
# MAX_FLAT_PCT (100: random-weight ViPE's depth is a plane, and y2r's flat-depth gate, 10 %, quarantined 18 of
# the 24 videos in the first run; 100 lets every video through the later stages).
source "$(dirname "$0")/gpu_lib.sh"
set -u
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
F=/tmp/ff-full
STEP=${STEP:?STEP=prep1, prep2, run1, run2 or synth}
# bench/gpu_carry.sh's folders, where carried; each can be named instead
[ -d .gpu/up/upstream ] && export UPSTREAM_ARCHIVES=${UPSTREAM_ARCHIVES:-.gpu/up/upstream}
[ -d .gpu/up/data ] && export FRAMEFLEET_REAL_DATA=${FRAMEFLEET_REAL_DATA:-.gpu/up/data}
REAL_WHEELS=${REAL_WHEELS:-$([ -d .gpu/real/whl ] && echo .gpu/real/whl)}
DECORD_WHEELS=${DECORD_WHEELS:-$([ -d .gpu/real2/whl ] && echo .gpu/real2/whl)}
VIPE_CARRY=${VIPE_CARRY:-$([ -d .gpu/vipe ] && echo .gpu/vipe)}
later() {  # a step after prep1: the environment prep1 kept (a later call on the lending machine carries no .device)
  [ -f "$F/prep1.done" ] || { echo "no $F/prep1.done: STEP=prep1 first, on this machine" >&2; exit 1; }
  [ -z "${ACTIVATE:-}" ] && [ -f /tmp/ff-bin/activate.sh ] && export ACTIVATE=/tmp/ff-bin/activate.sh
  gpu_env || exit 1
  # the archives prep1 kept, when it had some (else gpu_lib.sh's upstream clones)
  [ -n "$(ls -A "$F/archives" 2>/dev/null)" ] && export UPSTREAM_ARCHIVES=$F/archives
}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 YOLO_OFFLINE=1
say() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$OUT/$STEP.txt"; }

case $STEP in
prep1)
  gpu_env || exit 1
  rm -rf /tmp/ff-bin "$F"; mkdir -p "$F/site" "$F/archives" "$F/clips"
  if [ -d .device ]; then  # the lending machine: what .device set up, kept for the later calls that do not carry it
  mkdir -p /tmp/ff-bin && cp -r .device/redis /tmp/ff-bin/redis
  cat > /tmp/ff-bin/activate.sh <<'SH'
# What .device/activate.sh set up, for a later call on the same warm machine that does not carry .device.
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:/tmp/ff-bin/redis:$PATH
export LD_LIBRARY_PATH=/tmp/ff-bin/redis${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
(exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null || redis-server --daemonize yes --bind 127.0.0.1 --port 6379 \
  --save "" --appendonly no --logfile /tmp/redis.log
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && break; sleep 0.1; done
SH
  fi
  archives=$(archives_dir)
  if [ -n "$archives" ]; then
    for name in "${UPSTREAM_SOURCES[@]}"; do cp "$archives/$name.tar.gz" "$F/archives/" 2>/dev/null; done
  fi
  if [ -n "$REAL_WHEELS" ]; then
    python3 -m pip install -q --no-index --no-deps --target "$F/site" "$REAL_WHEELS"/*.whl > "$OUT/wheels.log" 2>&1 \
      || { tail -20 "$OUT/wheels.log"; exit 1; }
  fi
  for name in dog sheep pstudio; do c=$(clip "$name") && cp "$c" "$F/clips/$name.mp4" || exit 1; done
  python3 bench/real_segments.py "$F/clips" "$F/raw" --count "${COUNT:-24}" | tee -a "$OUT/$STEP.txt"
  touch "$F/prep1.done"
  say "packages and videos ready"
  ;;
prep2)
  later
  if [ -n "$DECORD_WHEELS" ]; then
    python3 -m pip install -q --no-index --no-deps --target "$F/site" "$DECORD_WHEELS"/decord*.whl >> "$OUT/wheels.log" 2>&1
  fi
  say "building ViPE and pointops2"
  carried=()
  [ -n "$VIPE_CARRY" ] && carried=(WHEELS="$VIPE_CARRY/whl" EXTRA="$VIPE_CARRY/extra" EIGEN="$VIPE_CARRY/eigen.tgz")
  env OUT="$OUT/vipe" WORK=/tmp/ff-vipe "${carried[@]}" FRAMES=0 MAX_JOBS=40 CUDA_VISIBLE_DEVICES=1 \
    bash bench/gpu_vipe.sh > "$OUT/vipe.log" 2>&1 &
  vipe=$!
  (
    tapip3d=$(UPSTREAM_DIR=$F/up upstream zbw001+TAPIP3D) &&
      cd "$tapip3d/third_party/pointops2" && TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 \
      python3 -m pip install --no-index --no-deps --no-build-isolation --target "$F/site" .
  ) > "$OUT/pointops2.log" 2>&1 &
  pointops=$!
  wait $pointops; say "pointops2: exit $? ($(tail -n 1 "$OUT/pointops2.log"))"
  wait $vipe; say "ViPE built: exit $? ($(tail -n 2 "$OUT/vipe/progress.txt" 2>/dev/null | tr '\n' ' '))"
  OUT=$OUT/setup BASE=/tmp/rc-full REAL=masks,depth,tracks,hands MASKS=sam3 \
    VIPE_WORK=/tmp/ff-vipe SITES=$F/site NO_TRACKS2D=1 RAW=$F/raw MAX_FLAT_PCT=${MAX_FLAT_PCT:-100} SETUP=only CUDA_VISIBLE_DEVICES=1 \
    bash bench/gpu_real_autoscale.sh > "$OUT/setup.log" 2>&1
  say "chain setup: exit $?; $(grep -h '"load_s"\|"error"' /tmp/rc-full/res/check.json 2>/dev/null | tr -s ' \n' ' ')"
  tar czf "$OUT/setup-prepare.tgz" -C /tmp/rc-full --exclude=weights --exclude=envs --exclude=raw --exclude=models \
    --exclude=upstream . 2>/dev/null
  ;;
run1)
  later
  bound_gpus=$([ "$NGPU" -ge 4 ] && echo 1,2,3 || echo 1)
  say "A on GPU 0; the bound over GPUs $bound_gpus"
  OUT=$OUT/chain BASE=/tmp/rc-full SETUP=reuse PARALLEL=1 PHASES=A A_GPUS=0 \
    BOUND_GPU=$bound_gpus MAXW=${MAXW:-6} CPUW=${CPUW:-8} RUN_TIMEOUT_S=${CHAIN_S:-450} BOUND_EXTRA_S=${BOUND_EXTRA_S:-40} \
    bash bench/gpu_real_autoscale.sh > "$OUT/chain.log" 2>&1
  say "A and the bound: exit $?"
  cat "$OUT/chain/report.txt" 2>/dev/null | tee -a "$OUT/$STEP.txt"
  ;;
run2)
  later
  phases=$([ "$NGPU" -ge 3 ] && echo BC || echo B)
  say "B on GPUs 0 and 1$([ "$phases" = BC ] && echo "; the pool on GPU 2 over A's intermediates")"
  OUT=$OUT/chain BASE=/tmp/rc-full SETUP=reuse PARALLEL=1 PHASES=$phases B_GPUS=0,1 \
    POOL_GPU=2 MAXW=${MAXW:-6} CPUW=${CPUW:-8} RUN_TIMEOUT_S=${CHAIN_S:-420} \
    bash bench/gpu_real_autoscale.sh > "$OUT/chain.log" 2>&1
  say "B and the pool: exit $?"
  cat "$OUT/chain/report.txt" 2>/dev/null | tee -a "$OUT/$STEP.txt"
  ;;
synth)
  later
  say "the synthetic model on 4 GPUs, then on 1"
  OUT=$OUT/scaling VIDEOS=${VIDEOS:-288} KS="4 1" PHASES=c RUN_S=${RUN_S:-420} \
    CPUW=16 bash bench/gpu_scaling.sh > "$OUT/scaling.log" 2>&1
  say "scaling: exit $?"
  cat "$OUT/scaling/scaling.txt" 2>/dev/null | tee -a "$OUT/$STEP.txt"
  ;;
*) echo "STEP=prep1, prep2, run1, run2 or synth" >&2; exit 2 ;;
esac
# Few files come back from the GPU machine: everything in one archive, beside this step's summary.
tar czf "/tmp/ff-$STEP.tgz" -C "$OUT" . 2>/dev/null
find "$OUT" -mindepth 1 ! -name "$STEP.txt" -delete
mv "/tmp/ff-$STEP.tgz" "$OUT/$STEP.tgz"
