#!/usr/bin/env bash
# The real chain (SAM 3 masks, ViPE lyra + MoGe depth, TAPIP3D tracks, WiLoR hands; random weights; configs/real-gpu.yaml's
# layout, each model in its own interpreter) under framefleet's autoscaler against y2r's own way, on the same videos and
# GPUs: COUNT (16) two-second segments dealt in turn from the three real clips (bench/real_segments.py), every quality
# gate off (random weights cannot pass them: the setup says so), so that both sides run every stage on every video.
# One step per call, on one warm machine (each call within the idle release of the one before: only /tmp lasts), on
# every GPU the machine has (1, or 2 when lent):
#   STEP=prep1  carry .device .gpu/up               the framefleet packages and redis kept for later calls
#                                                   (/tmp/ff-bin), the archives, the videos (about 1 minute)
#   STEP=prep2  carry .gpu/vipe .gpu/real .gpu/real2 the real models' packages, ViPE, pointops2, then the chain's
#                                                   setup: random weights, every model loaded once (about 6 minutes)
#   STEP=run1   carry nothing                       framefleet from a cold cluster (a fresh Redis db, the autoscaler
#                                                   started, enqueue once every family's first worker is up),
#                                                   enqueue -> statistics, NVML sampled at 4 Hz, verified
#   STEP=y2r    carry nothing                       y2r's way: each stage over every video, one process per GPU, loads
#                                                   included (bench/real_chain.py bound), sampled the same way; then
#                                                   the comparison (bench/real_chain.py compare: walls, busy shares,
#                                                   the ratio, per model load / first task / steady time / memory, the
#                                                   autoscaler's decisions over time and decisions.png)
#   STEP=synth  carry nothing                       the synthetic compute-bound model's scaling (bench/gpu_scaling.sh)
# e.g. for s in prep1 prep2 run1 y2r; do STEP=$s bash bench/gpu_full_chain.sh || break; done  (a host with all of it)
# The environment is bench/gpu_lib.sh's gpu_env; bench/gpu_carry.sh makes the .gpu/ folders (REAL_WHEELS,
# DECORD_WHEELS, VIPE_CARRY name others); the sources come from gpu_lib.sh's upstream, the clips from its clip.
# Each step writes $OUT/<step>.txt and $OUT/<step>.tgz; knobs: COUNT (16, prep1), CHAIN_S (the enqueue's limit, 450),
# MAXW (6), CPUW (8), VIDEOS and RUN_S (synth).
source "$(dirname "$0")/gpu_lib.sh"
set -u
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
F=/tmp/ff-full
STEP=${STEP:?STEP=prep1, prep2, run1, y2r or synth}
GPUS=$(seq -s, 0 $((NGPU - 1)))  # every GPU of the machine, for both sides
BUILD_GPU=$((NGPU - 1))  # where the builds and the setup's loads run
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
compare() {  # framefleet against y2r's way, once both have run on this machine
  [ -f /tmp/rc-full/res/A-summary.json ] && [ -f /tmp/rc-full/res/y2r-summary.json ] || return 0
  python3 bench/real_chain.py compare --results /tmp/rc-full/res --plot "$OUT/decisions.png" | tee -a "$OUT/$STEP.txt"
}

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
  for name in dog sheep pstudio; do c=$(clip "$name") && cp "$c" "$F/clips/$name.mp4" || exit 1; done
  python3 bench/real_segments.py "$F/clips" "$F/raw" --count "${COUNT:-16}" | tee -a "$OUT/$STEP.txt"
  touch "$F/prep1.done"
  say "packages and videos ready"
  ;;
prep2)
  later
  for w in $REAL_WHEELS $DECORD_WHEELS; do
    python3 -m pip install -q --no-index --no-deps --target "$F/site" "$w"/*.whl >> "$OUT/wheels.log" 2>&1 \
      || { tail -20 "$OUT/wheels.log"; exit 1; }
  done
  say "building ViPE and pointops2"
  carried=()
  [ -n "$VIPE_CARRY" ] && carried=(WHEELS="$VIPE_CARRY/whl" EXTRA="$VIPE_CARRY/extra" EIGEN="$VIPE_CARRY/eigen.tgz")
  env OUT="$OUT/vipe" WORK=/tmp/ff-vipe "${carried[@]}" FRAMES=0 MAX_JOBS=40 CUDA_VISIBLE_DEVICES=$BUILD_GPU \
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
    VIPE_WORK=/tmp/ff-vipe SITES=$F/site NO_TRACKS2D=1 RAW=$F/raw MAX_FLAT_PCT=100 SETUP=only CUDA_VISIBLE_DEVICES=$BUILD_GPU \
    bash bench/gpu_real_autoscale.sh > "$OUT/setup.log" 2>&1
  say "chain setup: exit $?; $(grep -h '"load_s"\|"error"' /tmp/rc-full/res/check.json 2>/dev/null | tr -s ' \n' ' ')"
  tar czf "$OUT/setup-prepare.tgz" -C /tmp/rc-full --exclude=weights --exclude=envs --exclude=raw --exclude=models \
    --exclude=upstream . 2>/dev/null
  ;;
run1)
  later
  say "framefleet on GPU(s) $GPUS from a cold cluster"
  OUT=$OUT/chain BASE=/tmp/rc-full SETUP=reuse PARALLEL=1 PHASES=A A_GPUS=$GPUS BOUND_GPU=none MAXW=${MAXW:-6} \
    CPUW=${CPUW:-8} RUN_TIMEOUT_S=${CHAIN_S:-450} bash bench/gpu_real_autoscale.sh > "$OUT/chain.log" 2>&1
  say "framefleet: exit $?"
  cat "$OUT/chain/report.txt" 2>/dev/null | tee -a "$OUT/$STEP.txt"
  compare
  ;;
y2r)
  later
  R=/tmp/rc-full/res; rm -rf /tmp/rc-full/out-y2r "$R"/y2r-*; mkdir -p "$R"
  say "y2r's way on GPU(s) $GPUS: each stage over every video, one process per GPU"
  python3 bench/busy_share.py sample "$R/y2r-samples.csv" --period-s 0.25 &
  smp=$!; sleep 1
  python3 bench/real_chain.py bound --config /tmp/rc-full/real.yaml --raw "$F/raw" --out /tmp/rc-full/out-y2r \
    --device cuda:0 $([ "$NGPU" -gt 1 ] && echo --gpus "$GPUS") --summary "$R/y2r-summary.json" \
    > "$R/y2r-bound.json" 2> "$R/y2r-bound.err"
  say "y2r's way: exit $?; $(tail -n 1 "$R/y2r-bound.json")"
  sleep 1; kill $smp; wait $smp
  python3 bench/busy_share.py report "$R/y2r-samples.csv" "$R/y2r-summary.json" --gpus "$GPUS" --json "$R/y2r-busy.json" \
    | tee -a "$OUT/$STEP.txt"
  cp "$R"/y2r-* "$OUT/"
  compare
  ;;
synth)
  later
  say "the synthetic model on 4 GPUs, then on 1"
  OUT=$OUT/scaling VIDEOS=${VIDEOS:-288} KS="4 1" PHASES=c RUN_S=${RUN_S:-420} \
    CPUW=16 bash bench/gpu_scaling.sh > "$OUT/scaling.log" 2>&1
  say "scaling: exit $?"
  cat "$OUT/scaling/scaling.txt" 2>/dev/null | tee -a "$OUT/$STEP.txt"
  ;;
*) echo "STEP=prep1, prep2, run1, y2r or synth" >&2; exit 2 ;;
esac
# Few files come back from the GPU machine: everything in one archive, beside this step's summary.
tar czf "/tmp/ff-$STEP.tgz" -C "$OUT" . 2>/dev/null
find "$OUT" -mindepth 1 ! -name "$STEP.txt" ! -name decisions.png -delete
mv "/tmp/ff-$STEP.tgz" "$OUT/$STEP.tgz"
