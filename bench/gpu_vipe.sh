#!/usr/bin/env bash
# On a GPU host: builds ViPE's lyra pipeline (y2r's fork: vipe_ext) and its random-weights model cache in WORK,
# for the depth stage of the whole chain (bench/gpu_full_chain.sh's prep2; bench/real_chain.py --vipe-work WORK).
# The run that measured lyra's memory and pace through the depth stage (bench/gpu_vipe.py) is at commit b08a959.
#   bash deploy/envs/build.sh vipe && ACTIVATE=/opt/framefleet/envs/vipe/bin/activate bash bench/gpu_vipe.sh
# The environment: bench/gpu_lib.sh's gpu_python ($ACTIVATE, here deploy/envs/build.sh's vipe env, which holds
# ViPE's packages at deploy/envs/vipe.lock's versions; else .device or .venv). The sources: gpu_lib.sh's upstream
# (hgupt3+vipe and microsoft+MoGe at deploy/envs/pins.sh's commits, from UPSTREAM_ARCHIVES or a clone) into
# WORK/upstream. On a host without network, with bench/gpu_carry.sh's folders:
#   UPSTREAM_ARCHIVES=.gpu/up/upstream WHEELS=.gpu/vipe/whl \
#     EXTRA=.gpu/vipe/extra EIGEN=.gpu/vipe/eigen.tgz OUT=DIR bash bench/gpu_vipe.sh
# WHEELS: wheels the machine lacks, at deploy/envs/vipe.lock's versions (ViPE: hydra-core, omegaconf,
# antlr4-python3-runtime, kornia, kornia-rs, gdown, beautifulsoup4, soupsieve, roma, pyquaternion, openexr,
# rich and its three, ninja for the build; transformers 4.48.3 with tokenizers 0.21.4 and huggingface-hub
# 0.36.2, since ViPE's GroundingDINO calls BertModel.get_head_mask, which transformers 5 removed; requests
# and its four; framefleet: celery, redis, pydantic, ... less PyAV; bench/gpu_carry.sh vipe lists them).
# They go into a site folder of this run's own (WORK/site, first on PYTHONPATH), not the machine's
# shared /tmp/site: other jobs on the host keep the image's transformers 5. EXTRA: package folders
# copied into that site as they are (utils3d at MoGe's pinned commit, which is not on PyPI; pycg's
# Python files, without its 30 MB of render assets).
# EIGEN: a tar.gz of Eigen 3.4's Eigen/ headers (Debian's libeigen3-dev), for building vipe_ext; unset: the
# host's /usr/include/eigen3 where installed (apt install libeigen3-dev), else ViPE's setup.py downloads it.
# VIPE_EXT: a vipe_ext*.so (or .so.xz) built earlier on the same image (skips the ~2 min build; default:
# the first vipe_ext*.so.xz beside EXTRA, else carry/vipe_ext*.so.xz or .so, else one built in WORK on
# this machine before; one that does not import is built again); the build's .so, stripped of debug
# sections and xz-compressed, is copied to $OUT when under 30 MB, for that.
# WORK (/tmp/ff-vipe): the archives unpacked, the site, vipe_ext's build and the model cache (5 GB).
# Progress lines, with the time and the seconds since the start, go to stdout and $OUT/progress.txt.
source "$(dirname "$0")/gpu_lib.sh"; gpu_python || exit 1
set -u
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/ff-vipe}
UP=$WORK/upstream SITE=$WORK/site CACHE=$WORK/cache
mkdir -p "$UP" "$SITE"
say() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$OUT/progress.txt"; }
say "start: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} WORK=$WORK"
for name in hgupt3+vipe microsoft+MoGe; do
  UPSTREAM_DIR=$UP upstream "$name" > /dev/null || exit 1
done
VIPE="$UP/hgupt3+vipe"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" \
    "$WHEELS"/* || exit 1
fi
if [ -n "${EXTRA:-}" ]; then cp -r "$EXTRA"/* "$SITE"/; fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PATH=$PATH:$SITE/bin  # ninja for the build, where the image has none (its own comes first)
say "unpacked and installed into $SITE"
# rerun-sdk is imported by ViPE's SLAM modules but used only with slam.visualize (false here); a
# module that fails on any use stands in when the real one is absent.
if ! python3 -c "import rerun" 2>/dev/null; then
  mkdir -p "$SITE/rerun"
  printf '%s\n' '"""Stand-in for rerun-sdk: importable, fails on any use."""' \
    'def __getattr__(name):' \
    '    raise RuntimeError(f"rerun.{name} used: install rerun-sdk (only slam.visualize needs it)")' \
    > "$SITE/rerun/__init__.py"
fi
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # as framefleet's workers run
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
gpu=${CUDA_VISIBLE_DEVICES:-0}; gpu=${gpu%%,*}  # nvidia-smi ignores CUDA_VISIBLE_DEVICES: name the GPU
{ nvidia-smi -i "$gpu" --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
  python3 -c "import torch, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  nvcc --version | tail -2
  echo "ninja $(ninja --version 2>&1) at $(command -v ninja)"
  cat "$VIPE/.upstream-commit" "$UP/microsoft+MoGe/.upstream-commit" 2>/dev/null
} | tee "$OUT/machine.txt"
# The random-weights cache is written while vipe_ext compiles (it needs only the model classes).
say "writing the random-weights cache in $CACHE"
PYTHONPATH=$VIPE:$UP/microsoft+MoGe:$PYTHONPATH python3 bench/vipe_cache.py --vipe "$VIPE" \
  --moge "$UP/microsoft+MoGe" --cache "$CACHE" > "$WORK/cache.json" 2> "$OUT/vipe_cache.log" &
writer=$!
trap 'kill "$writer" 2>/dev/null' EXIT  # a failed build leaves no writer behind
# A vipe_ext build from an earlier run on the same image, when one is given or carried; built here otherwise.
VIPE_EXT=${VIPE_EXT:-$(ls ${EXTRA:+"${EXTRA%/}"/../vipe_ext*.so.xz} carry/vipe_ext*.so.xz carry/vipe_ext*.so \
  "$WORK"/vipe_ext*.so 2>/dev/null | head -1)}
prebuilt=0
if [ -n "$VIPE_EXT" ] && [ -f "$VIPE_EXT" ]; then
  rm -f "$VIPE"/vipe_ext*.so
  case "$VIPE_EXT" in
    *.xz) xz -dc "$VIPE_EXT" > "$VIPE/$(basename "$VIPE_EXT" .xz)" ;;
    *) cp "$VIPE_EXT" "$VIPE/" ;;
  esac
  # Built for one torch, CUDA and Python: one that does not import here is dropped and built again.
  if (cd "$VIPE" && PYTHONPATH=$VIPE:$PYTHONPATH python3 -c "import torch, vipe_ext") > "$OUT/vipe_ext_prebuilt.log" 2>&1; then
    prebuilt=1
    say "vipe_ext: the prebuilt $VIPE_EXT" | tee -a "$OUT/machine.txt"
  else
    say "vipe_ext: the prebuilt $VIPE_EXT does not import here; building" | tee -a "$OUT/machine.txt"
    rm -f "$VIPE"/vipe_ext*.so
  fi
fi
if [ "$prebuilt" = 0 ]; then
  mkdir -p "$VIPE/csrc/include/eigen3"
  if [ -n "${EIGEN:-}" ]; then
    tar xzf "$EIGEN" -C "$VIPE/csrc/include/eigen3" || exit 1
  elif [ -d /usr/include/eigen3/Eigen ] && [ ! -e "$VIPE/csrc/include/eigen3/Eigen" ]; then
    cp -r /usr/include/eigen3/Eigen "$VIPE/csrc/include/eigen3/"  # deploy/envs/build.sh's way
  fi
  say "building vipe_ext (MAX_JOBS=${MAX_JOBS:-$(nproc)})"
  start=$(date +%s)
  (cd "$VIPE" && TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-$(nproc)} python3 setup.py build_ext --inplace) \
    > "$OUT/vipe_ext_build.log" 2>&1 || { tail -40 "$OUT/vipe_ext_build.log"; exit 1; }
  say "vipe_ext built in $(( $(date +%s) - start )) s" | tee -a "$OUT/machine.txt"
  so=$(ls "$VIPE"/vipe_ext*.so | head -1)
  cp "$so" "$WORK/"  # for a later run on this machine while it is warm
  # Without its debug sections and xz-compressed, the build can come back and travel to a later run.
  strip --strip-debug -o "$WORK/vipe_ext.stripped.so" "$so" && xz -T0 -6 -c "$WORK/vipe_ext.stripped.so" > "$WORK/vipe_ext.so.xz"
  ls -la "$so" "$WORK/vipe_ext.stripped.so" "$WORK/vipe_ext.so.xz" | tee -a "$OUT/machine.txt"
  [ "$(stat -c %s "$WORK/vipe_ext.so.xz")" -lt 31457280 ] && cp "$WORK/vipe_ext.so.xz" "$OUT/$(basename "$so").xz"
fi
(cd "$VIPE" && PYTHONPATH=$VIPE:$PYTHONPATH python3 -c "import torch, vipe_ext; print('vipe_ext', sorted(m for m in dir(vipe_ext) if m.endswith('_ext')))") \
  | tee -a "$OUT/machine.txt" || exit 1
start=$(date +%s)
wait $writer || { tail -30 "$OUT/vipe_cache.log"; exit 1; }
say "cache written; waited $(( $(date +%s) - start )) s for it after vipe_ext" | tee -a "$OUT/machine.txt"
cp "$WORK/cache.json" "$OUT/ff-vipe-cache.json"
say "vipe_ext and the cache are in $WORK"
du -sh "$CACHE" 2>/dev/null | tee -a "$OUT/machine.txt"
