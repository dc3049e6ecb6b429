#!/usr/bin/env bash
# The whole chain with every real upstream model (random weights) under the autoscaler, configs/real-gpu.yaml's
# layout: SAM 3 masks, ViPE lyra depth, TAPIP3D tracks, WiLoR hands, each in its own interpreter, on 24 two-second
# segments of ../shared/data/real's clips; and the synthetic model's 1 -> 4 GPU scaling. Calls on one warm 4-GPU
# machine (kind nvidia-h100-x4), each started within the idle release of the one before, since only /tmp lasts
# between calls and what one call may carry (64 MiB) holds no two of the pieces:
#   STEP=prep1  carry .device .gpu/real .gpu/up   source .device/activate.sh; STEP=prep1 bash bench/gpu_full_chain.sh
#     keeps the machine's framefleet packages and redis for later calls (/tmp/ff-bin/activate.sh), installs the
#     real models' packages into /tmp/ff-full/site and cuts the 24 videos (about 60 s).
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
set -u
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
F=/tmp/ff-full
STEP=${STEP:?STEP=prep1, prep2, run1, run2 or synth}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 YOLO_OFFLINE=1
say() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$OUT/$STEP.txt"; }

case $STEP in
prep1)
  [ -n "${PYTHONPATH:-}" ] || { echo "source .device/activate.sh first" >&2; exit 1; }
  rm -rf /tmp/ff-bin "$F"; mkdir -p /tmp/ff-bin "$F/site" "$F/archives"
  cp -r .device/redis /tmp/ff-bin/redis
  cat > /tmp/ff-bin/activate.sh <<'SH'
# What .device/activate.sh set up, for a later call on the same warm machine that does not carry .device.
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:/tmp/ff-bin/redis:$PATH
export LD_LIBRARY_PATH=/tmp/ff-bin/redis${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
(exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null || redis-server --daemonize yes --bind 127.0.0.1 --port 6379 \
  --save "" --appendonly no --logfile /tmp/redis.log
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && break; sleep 0.1; done
SH
  cp .gpu/up/upstream/*.tar.gz "$F/archives/"
  python3 -m pip install -q --no-index --no-deps --target "$F/site" .gpu/real/whl/*.whl > "$OUT/wheels.log" 2>&1 \
    || { tail -20 "$OUT/wheels.log"; exit 1; }
  python3 bench/real_segments.py .gpu/up/data "$F/raw" --count "${COUNT:-24}" | tee -a "$OUT/$STEP.txt"
  say "packages and videos ready"
  ;;
prep2)
  [ -f /tmp/ff-bin/activate.sh ] || { echo "no /tmp/ff-bin/activate.sh: STEP=prep1 first, on this machine" >&2; exit 1; }
  source /tmp/ff-bin/activate.sh
  python3 -m pip install -q --no-index --no-deps --target "$F/site" .gpu/real2/whl/decord*.whl >> "$OUT/wheels.log" 2>&1
  say "building ViPE and pointops2"
  OUT=$OUT/vipe WORK=/tmp/ff-vipe UPSTREAM_ARCHIVES=$F/archives CLIP=.gpu/up/data/sheep.mp4 WHEELS=.gpu/vipe/whl \
    EXTRA=.gpu/vipe/extra EIGEN=.gpu/vipe/eigen.tgz FRAMES=0 MAX_JOBS=40 CUDA_VISIBLE_DEVICES=1 \
    bash bench/gpu_vipe.sh > "$OUT/vipe.log" 2>&1 &
  vipe=$!
  (
    rm -rf "$F/up"; mkdir -p "$F/up" && tar xzf "$F/archives/zbw001+TAPIP3D.tar.gz" -C "$F/up" &&
      cd "$F/up/zbw001+TAPIP3D/third_party/pointops2" && TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 \
      python3 -m pip install --no-index --no-deps --no-build-isolation --target "$F/site" .
  ) > "$OUT/pointops2.log" 2>&1 &
  pointops=$!
  wait $pointops; say "pointops2: exit $? ($(tail -n 1 "$OUT/pointops2.log"))"
  wait $vipe; say "ViPE built: exit $? ($(tail -n 2 "$OUT/vipe/progress.txt" 2>/dev/null | tr '\n' ' '))"
  OUT=$OUT/setup BASE=/tmp/rc-full UPSTREAM_ARCHIVES=$F/archives REAL=masks,depth,tracks,hands MASKS=sam3 \
    VIPE_WORK=/tmp/ff-vipe SITES=$F/site NO_TRACKS2D=1 RAW=$F/raw MAX_FLAT_PCT=${MAX_FLAT_PCT:-100} SETUP=only CUDA_VISIBLE_DEVICES=1 \
    bash bench/gpu_real_autoscale.sh > "$OUT/setup.log" 2>&1
  say "chain setup: exit $?; $(grep -h '"load_s"\|"error"' /tmp/rc-full/res/check.json 2>/dev/null | tr -s ' \n' ' ')"
  tar czf "$OUT/setup-prepare.tgz" -C /tmp/rc-full --exclude=weights --exclude=envs --exclude=raw --exclude=models \
    --exclude=upstream . 2>/dev/null
  ;;
run1)
  [ -f /tmp/ff-bin/activate.sh ] || { echo "no /tmp/ff-bin/activate.sh: STEP=prep1 first, on this machine" >&2; exit 1; }
  source /tmp/ff-bin/activate.sh
  bound_gpus=$([ "$NGPU" -ge 4 ] && echo 1,2,3 || echo 1)
  say "A on GPU 0; the bound over GPUs $bound_gpus"
  OUT=$OUT/chain BASE=/tmp/rc-full UPSTREAM_ARCHIVES=$F/archives SETUP=reuse PARALLEL=1 PHASES=A A_GPUS=0 \
    BOUND_GPU=$bound_gpus MAXW=${MAXW:-6} CPUW=${CPUW:-8} RUN_TIMEOUT_S=${CHAIN_S:-450} BOUND_EXTRA_S=${BOUND_EXTRA_S:-40} \
    bash bench/gpu_real_autoscale.sh > "$OUT/chain.log" 2>&1
  say "A and the bound: exit $?"
  cat "$OUT/chain/report.txt" 2>/dev/null | tee -a "$OUT/$STEP.txt"
  ;;
run2)
  [ -f /tmp/ff-bin/activate.sh ] || { echo "no /tmp/ff-bin/activate.sh: STEP=prep1 first, on this machine" >&2; exit 1; }
  source /tmp/ff-bin/activate.sh
  phases=$([ "$NGPU" -ge 3 ] && echo BC || echo B)
  say "B on GPUs 0 and 1$([ "$phases" = BC ] && echo "; the pool on GPU 2 over A's intermediates")"
  OUT=$OUT/chain BASE=/tmp/rc-full UPSTREAM_ARCHIVES=$F/archives SETUP=reuse PARALLEL=1 PHASES=$phases B_GPUS=0,1 \
    POOL_GPU=2 MAXW=${MAXW:-6} CPUW=${CPUW:-8} RUN_TIMEOUT_S=${CHAIN_S:-420} \
    bash bench/gpu_real_autoscale.sh > "$OUT/chain.log" 2>&1
  say "B and the pool: exit $?"
  cat "$OUT/chain/report.txt" 2>/dev/null | tee -a "$OUT/$STEP.txt"
  ;;
synth)
  [ -f /tmp/ff-bin/activate.sh ] || { echo "no /tmp/ff-bin/activate.sh: STEP=prep1 first, on this machine" >&2; exit 1; }
  say "the synthetic model on 4 GPUs, then on 1"
  OUT=$OUT/scaling ACTIVATE=/tmp/ff-bin/activate.sh VIDEOS=${VIDEOS:-288} KS="4 1" PHASES=c RUN_S=${RUN_S:-420} \
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
