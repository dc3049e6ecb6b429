#!/usr/bin/env bash
# One call on a 4-GPU machine, three benches side by side, each under its own timeout, all ended by
# ROUND_S (520) seconds after the start; a part that fails does not stop the others. -> $OUT
#   source .device/activate.sh; bash bench/gpu_round.sh          (from the repository root)
#   GPUs 0,1  autoscale/  bench/gpu_real_autoscale.sh (NVML indices 0 and 1 only: the autoscaler's --gpus
#             0 and 0,1, the bound on CUDA_VISIBLE_DEVICES=1, the pool's --gpu 0, check on cuda:0)
#   GPU 2     detector/   bench/detector_chunks.py --device cuda:0 --scale x (WiLoR's YOLOv8x in chunks), then
#             sam3/       MODELS=sam3 FRAMES=40 PACK= bench/gpu_models.sh (SAM 3's conformance run)
#   GPU 3     conformance/ bench/gpu_conformance.sh, TAPIP3D and WiLoR with CHAIN=1 (the chain needs both
#             models' weights); PART3=none leaves GPU 3 free, PART3=wilor runs WiLoR alone, PART3_CMD runs
#             that command there instead as part gpu3/ (OUT, CUDA_VISIBLE_DEVICES=3 and TIME_LIMIT_S set)
# Each part gets $OUT/<part>/ (its OUT), log.txt (stdout and stderr), exit.txt; /tmp of its own
# (UPSTREAM_DIR, SITE_DIR, RUN_DIR, BASE), so that none unpacks or installs over another. At the end
# $OUT/round.txt: each part's exit status, wall time and key numbers (124: stopped by its timeout).
# Knobs: WHEELS (.gpu/real/whl), GL_DEBS (.gpu/real/gl-debs), UPSTREAM_ARCHIVES (../shared/upstream),
# FRAMEFLEET_REAL_DATA (../shared/data/real), ROUND_S (520), DETECTOR_S (150: the detector's share of GPU 2's
# time), VIDEOS (6), PHASES (ABC), RUN_TIMEOUT_S (90), POOL_TIMEOUT_S (75) for the autoscaler part.
# DRY=1: this script's plumbing on a CPU machine: the autoscaler part on the stand-ins (REAL= VIDEOS=2
# PHASES=AC) against a private redis-server, the detector with a YOLOv8n on 4 frames where ultralytics
# imports; SAM 3 and the conformance run (CUDA only: SAM 3's predictor, pointops2's nvcc) are skipped.
set -u
start=$(date +%s)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
DRY=${DRY:-0}
ROUND_S=${ROUND_S:-520}
T=${ROUND_TMP:-/tmp/ff-round}; rm -rf "$T"; mkdir -p "$T"
export UPSTREAM_ARCHIVES=${UPSTREAM_ARCHIVES:-../shared/upstream}
export FRAMEFLEET_REAL_DATA=${FRAMEFLEET_REAL_DATA:-../shared/data/real}
WHEELS=${WHEELS:-.gpu/real/whl}
GL_DEBS=${GL_DEBS:-.gpu/real/gl-debs}
export YOLO_OFFLINE=1  # ultralytics: no download, no update check
export PYTHONUNBUFFERED=1

left() { echo $(( ROUND_S - ($(date +%s) - start) - ${1:-0} )); }

part() {  # NAME SECONDS COMMAND...: COMMAND in a session of its own under `timeout`, OUT=$OUT/NAME
  local name=$1 secs=$2 t rc sid
  shift 2
  mkdir -p "$OUT/$name"
  t=$(date +%s)
  if [ "$secs" -lt 30 ]; then
    echo "skipped: $secs s left" > "$OUT/$name/log.txt"; rc=125
  else
    OUT=$OUT/$name setsid timeout -k 10 "$secs" "$@" > "$OUT/$name/log.txt" 2>&1 &
    sid=$!
    wait $sid
    rc=$?
    # timeout signals its process group; what it does not reach (an inner timeout's group, a worker
    # still shutting down) gets PART_GRACE_S to end, then is killed: nothing of a part outlives it.
    for _ in $(seq "${PART_GRACE_S:-20}"); do pgrep -s "$sid" > /dev/null || break; sleep 1; done
    pkill -KILL -s "$sid" 2>/dev/null
  fi
  echo "$name exit $rc wall $(( $(date +%s) - t )) s (limit $secs s)" > "$OUT/$name/exit.txt"
  return 0
}

skip() {  # NAME REASON
  mkdir -p "$OUT/$1"; echo "$2" > "$OUT/$1/log.txt"; echo "$1 skipped: $2" > "$OUT/$1/exit.txt"
}

if [ "$DRY" = 1 ]; then
  port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no > "$T/redis.log" 2>&1 &
  redis_pid=$!
  trap 'kill $redis_pid 2>/dev/null' EXIT
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
  export REDIS_PORT=$port
fi
{ date -u; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nproc; du -sh "$WHEELS" "$UPSTREAM_ARCHIVES" "$FRAMEFLEET_REAL_DATA" 2>&1
  # what the carried wheels need from the machine's own packages
  python3 - <<'PYEOF'
import importlib.util
mods = "cv2 huggingface_hub imageio matplotlib networkx numpy pandas PIL cpuinfo requests safetensors scipy seaborn six " \
    "torchvision tqdm transformers yaml wcwidth einops timm redis celery pynvml".split()
print("missing here:", [m for m in mods if importlib.util.find_spec(m) is None] or "none")
PYEOF
} > "$OUT/machine.txt" 2>&1

# GPUs 0 and 1: the autoscaler with the real models (its own Redis dbs 4 and 5 on $REDIS_PORT).
autoscale() {
  if [ "$DRY" = 1 ]; then
    part autoscale "$(left 25)" env REAL= VIDEOS=2 PHASES=AC BASE="$T/rc" RUN_TIMEOUT_S=150 POOL_TIMEOUT_S=90 \
      MAX_ROUNDS=2 HOST_FLOOR_MIB=1024 bash bench/gpu_real_autoscale.sh
  else
    part autoscale "$(left 35)" env BASE="$T/rc" WHEELS="$WHEELS" VIDEOS="${VIDEOS:-6}" CLIP_S=2-2 \
      PHASES="${PHASES:-ABC}" RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-90}" POOL_TIMEOUT_S="${POOL_TIMEOUT_S:-75}" \
      bash bench/gpu_real_autoscale.sh
  fi
}

# GPU 2: WiLoR's detector in chunks (a site of its own with ultralytics; at most DETECTOR_S), then SAM 3
# with the rest of the round.
gpu2() {
  if [ "$DRY" = 1 ]; then
    if python3 -c "import ultralytics" 2>/dev/null; then
      # shellcheck disable=SC2016  # $OUT is the part's, expanded in its shell
      part detector "$(left 25)" bash -c 'python3 bench/detector_chunks.py --device cpu --scale n --frames 4 \
        --chunks 0,2,1 --nms-s-per-image 60 > "$OUT/detector.json"'
    else
      skip detector "DRY: ultralytics does not import here"
    fi
    skip sam3 "DRY: SAM 3's video predictor runs on CUDA only"
    return
  fi
  mkdir -p "$T/detector-site"
  python3 -m pip install -q --no-index --no-deps --target "$T/detector-site" "$WHEELS"/*.whl > "$T/detector-pip.log" 2>&1
  # shellcheck disable=SC2016  # $OUT is the part's, expanded in its shell
  part detector "$(( $(left 35) < ${DETECTOR_S:-150} ? $(left 35) : ${DETECTOR_S:-150} ))" env CUDA_VISIBLE_DEVICES=2 \
    PYTHONPATH="$T/detector-site:${PYTHONPATH:-}" \
    bash -c 'python3 bench/detector_chunks.py --device cuda:0 --scale x > "$OUT/detector.json"'
  # SAM 3's model builder imports decord (sam3/train/data/sam3_image_dataset.py:20), 13.6 MB: carried
  # apart (DECORD_WHEELS, default .gpu/real2/whl) or installed into /tmp/site by an earlier call.
  if ! python3 -c "import decord" 2>/dev/null; then
    local decord=("${DECORD_WHEELS:-.gpu/real2/whl}"/decord*.whl)
    if [ -f "${decord[0]}" ]; then
      python3 -m pip install -q --no-index --no-deps --target "$T/detector-site" "${decord[@]}" >> "$T/detector-pip.log" 2>&1
    else
      skip sam3 "decord does not import and no wheel at DECORD_WHEELS (${DECORD_WHEELS:-.gpu/real2/whl}): SAM 3's builder imports it"
      return
    fi
  fi
  part sam3 "$(left 35)" env CUDA_VISIBLE_DEVICES=2 MODELS=sam3 FRAMES=40 PACK= WHEELS="$WHEELS" \
    UPSTREAM_DIR="$T/sam3-upstream" SITE_DIR="$T/sam3-site" RUN_DIR="$T/sam3-runs" \
    PYTHONPATH="$T/detector-site:${PYTHONPATH:-}" CLIP="$FRAMEFLEET_REAL_DATA/sheep.mp4" bash bench/gpu_models.sh
}

# GPU 3: TAPIP3D and WiLoR through their upstream code, then the chain (its own Redis db 7).
gpu3() {
  if [ -n "${PART3_CMD:-}" ]; then  # another job on GPU 3 instead, e.g. PART3_CMD='bash bench/gpu_vipe.sh'
    part gpu3 "$(left 35)" env CUDA_VISIBLE_DEVICES=3 TIME_LIMIT_S="$(left 40)" bash -c "$PART3_CMD"
    return
  fi
  case "${PART3:-both}" in
    none) skip conformance "PART3=none: GPU 3 left free"; return ;;
    wilor) models=wilor chain=0 ;;
    *) models=tapip3d,wilor chain=1 ;;
  esac
  if [ "$DRY" = 1 ]; then
    skip conformance "DRY: pointops2 needs nvcc, the models CUDA"
    return
  fi
  part conformance "$(left 35)" env CUDA_VISIBLE_DEVICES=3 MODELS=$models CHAIN=$chain CHAIN_BY_S="$(left 45)" \
    MAX_JOBS=16 WHEELS="$WHEELS" GL_DEBS="$GL_DEBS" REDIS_URL="redis://127.0.0.1:${REDIS_PORT:-6379}/7" \
    UPSTREAM_DIR="$T/conf-upstream" SITE_DIR="$T/conf-site" RUN_DIR="$T/conf-runs" bash bench/gpu_conformance.sh
}

autoscale & a=$!
gpu2 & b=$!
gpu3 & c=$!
wait $a $b $c

# The summary: what each part said, then its key numbers.
{
  echo "round: $(( $(date +%s) - start )) s of $ROUND_S (DRY=$DRY)"
  for name in autoscale detector sam3 conformance gpu3; do cat "$OUT/$name/exit.txt" 2>/dev/null; done
  echo; echo "== autoscale: report (or its progress when cut short)"
  cat "$OUT/autoscale/report.txt" 2>/dev/null || { cat "$OUT/autoscale/progress.txt"; tail -n 15 "$OUT/autoscale/log.txt"; }
  echo; echo "== sam3: table"
  cat "$OUT/sam3/table.md" 2>/dev/null || tail -n 15 "$OUT/sam3/log.txt"
  echo; echo "== detector: chunks against one call"
  python3 - "$OUT/detector/detector.json" <<'PYEOF' 2>/dev/null || tail -n 15 "$OUT/detector/log.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({k: v for k, v in r.items() if not isinstance(v, (list, dict))}))
for k, v in r.items():
    if isinstance(v, (list, dict)):
        print(k, json.dumps(v)[:1500])
PYEOF
  echo; echo "== conformance: table and chain"
  cat "$OUT/conformance/table.md" 2>/dev/null || tail -n 15 "$OUT/conformance/log.txt"
  grep -h "pointops2 built\|total\|chain skipped" "$OUT/conformance/machine.txt" 2>/dev/null
  [ -d "$OUT/gpu3" ] && { echo; echo "== gpu3: PART3_CMD's last lines"; tail -n 15 "$OUT/gpu3/log.txt"; }
} > "$OUT/round.txt" 2>&1
cat "$OUT/round.txt"
# The small results in one archive too: every part's logs, JSON and CSV, without the parts' own archives.
tar czf "$T/round.tgz" -C "$OUT" --exclude="*.tgz" . 2>/dev/null && mv "$T/round.tgz" "$OUT/round.tgz"
du -sh "$OUT"
