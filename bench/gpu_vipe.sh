# On a GPU machine: ViPE's lyra pipeline (y2r's fork) through framefleet's depth stage, with random
# weights, on a real clip, without network access (bench/gpu_vipe.py). -> $OUT
#   UPSTREAM_ARCHIVES=../shared/upstream CLIP=../shared/data/real/sheep.mp4 WHEELS=DIR EXTRA=DIR \
#     EIGEN=eigen.tgz bash bench/gpu_vipe.sh
# UPSTREAM_ARCHIVES holds hgupt3+vipe.tar.gz and microsoft+MoGe.tar.gz (../shared/upstream/README.md).
# WHEELS: wheels/sdists the machine lacks, at deploy/envs/vipe.lock's versions (ViPE: hydra-core, omegaconf,
# antlr4-python3-runtime, kornia, kornia-rs, gdown, beautifulsoup4, soupsieve, roma, pyquaternion, openexr,
# rich and its three; transformers 4.48.3 with tokenizers 0.21.4 and huggingface-hub 0.36.2, since ViPE's
# GroundingDINO calls BertModel.get_head_mask, which transformers 5 removed; framefleet: celery, redis,
# pydantic, ... as ../shared/device/prepare.sh lists them, less PyAV), installed into /tmp/site. EXTRA: package folders copied into /tmp/site as they are (utils3d at MoGe's
# pinned commit, which is not on PyPI; pycg's Python files, without its 30 MB of render assets).
# EIGEN: a tar.gz of Eigen 3.4's Eigen/ headers (Debian's libeigen3-dev), for building vipe_ext.
# VIPE_EXT: a vipe_ext*.so (or .so.xz) built earlier on the same image (skips the ~2 min build; default: the
# first carry/vipe_ext*.so.xz or .so; one that does not import is built again); the build's .so, stripped
# of debug sections and xz-compressed, is copied to $OUT when under 30 MB, for that. FRAMES (120) and
# WARMUP (20): frames per run;
# RUN_TIMEOUT_S (900) caps the load and the runs.
set -u
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
UP=/tmp/ff-upstream; mkdir -p "$UP"
for name in hgupt3+vipe microsoft+MoGe; do
  tar xzf "${UPSTREAM_ARCHIVES:-../shared/upstream}/$name.tar.gz" -C "$UP" || exit 1
done
VIPE="$UP/hgupt3+vipe"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site "$WHEELS"/* || exit 1
fi
if [ -n "${EXTRA:-}" ]; then mkdir -p /tmp/site && cp -r "$EXTRA"/* /tmp/site/; fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# rerun-sdk is imported by ViPE's SLAM modules but used only with slam.visualize (false here); a
# module that fails on any use stands in when the real one is absent.
if ! python3 -c "import rerun" 2>/dev/null; then
  mkdir -p /tmp/site/rerun
  printf '%s\n' '"""Stand-in for rerun-sdk: importable, fails on any use."""' \
    'def __getattr__(name):' \
    '    raise RuntimeError(f"rerun.{name} used: install rerun-sdk (only slam.visualize needs it)")' \
    > /tmp/site/rerun/__init__.py
fi
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # as framefleet's workers run
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  nvcc --version | tail -2
  cat "$VIPE/.upstream-commit" "$UP/microsoft+MoGe/.upstream-commit" 2>/dev/null
} | tee "$OUT/machine.txt"
# The random-weights cache is written while vipe_ext compiles (it needs only the model classes).
PYTHONPATH=$VIPE:$UP/microsoft+MoGe:$PYTHONPATH python3 bench/vipe_cache.py --vipe "$VIPE" \
  --moge "$UP/microsoft+MoGe" --cache /tmp/ff-vipe-cache > /tmp/ff-vipe-cache.json 2> "$OUT/vipe_cache.log" &
writer=$!
# A vipe_ext build from an earlier run on the same image, when one is given or carried; built here otherwise.
VIPE_EXT=${VIPE_EXT:-$(ls carry/vipe_ext*.so.xz carry/vipe_ext*.so 2>/dev/null | head -1)}
prebuilt=0
if [ -n "$VIPE_EXT" ] && [ -f "$VIPE_EXT" ]; then
  case "$VIPE_EXT" in
    *.xz) xz -dc "$VIPE_EXT" > "$VIPE/$(basename "$VIPE_EXT" .xz)" ;;
    *) cp "$VIPE_EXT" "$VIPE/" ;;
  esac
  # Built for one torch, CUDA and Python: one that does not import here is dropped and built again.
  if (cd "$VIPE" && PYTHONPATH=$VIPE:$PYTHONPATH python3 -c "import torch, vipe_ext") > "$OUT/vipe_ext_prebuilt.log" 2>&1; then
    prebuilt=1
    echo "vipe_ext: the prebuilt $(basename "$VIPE_EXT")" | tee -a "$OUT/machine.txt"
  else
    echo "vipe_ext: the prebuilt $(basename "$VIPE_EXT") does not import here; building" | tee -a "$OUT/machine.txt"
    rm -f "$VIPE"/vipe_ext*.so
  fi
fi
if [ "$prebuilt" = 0 ]; then
  mkdir -p "$VIPE/csrc/include/eigen3"
  tar xzf "${EIGEN:?EIGEN: a tar.gz of Eigen 3.4 headers}" -C "$VIPE/csrc/include/eigen3" || exit 1
  start=$(date +%s)
  (cd "$VIPE" && TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-$(nproc)} python3 setup.py build_ext --inplace) \
    > "$OUT/vipe_ext_build.log" 2>&1 || { tail -40 "$OUT/vipe_ext_build.log"; exit 1; }
  echo "vipe_ext built in $(( $(date +%s) - start )) s" | tee -a "$OUT/machine.txt"
  so=$(ls "$VIPE"/vipe_ext*.so | head -1)
  # Without its debug sections and xz-compressed, the build can come back and travel to a later run.
  strip --strip-debug -o /tmp/vipe_ext.so "$so" && xz -T0 -6 -c /tmp/vipe_ext.so > /tmp/vipe_ext.so.xz
  ls -la "$so" /tmp/vipe_ext.so /tmp/vipe_ext.so.xz | tee -a "$OUT/machine.txt"
  [ "$(stat -c %s /tmp/vipe_ext.so.xz)" -lt 31457280 ] && cp /tmp/vipe_ext.so.xz "$OUT/$(basename "$so").xz"
fi
(cd "$VIPE" && PYTHONPATH=$VIPE:$PYTHONPATH python3 -c "import torch, vipe_ext; print('vipe_ext', sorted(m for m in dir(vipe_ext) if m.endswith('_ext')))") \
  | tee -a "$OUT/machine.txt" || exit 1
start=$(date +%s)
wait $writer || { tail -30 "$OUT/vipe_cache.log"; exit 1; }
echo "cache written; waited $(( $(date +%s) - start )) s for it after the build" | tee -a "$OUT/machine.txt"
cp /tmp/ff-vipe-cache.json "$OUT/"
PYTHONUNBUFFERED=1 timeout "${RUN_TIMEOUT_S:-900}" python3 bench/gpu_vipe.py --vipe "$VIPE" --moge "$UP/microsoft+MoGe" \
  --clip "${CLIP:-../shared/data/real/sheep.mp4}" --out "$OUT" --frames "${FRAMES:-120}" --warmup "${WARMUP:-20}" \
  --cache-written /tmp/ff-vipe-cache.json
status=$?
du -sh /tmp/ff-vipe-cache 2>/dev/null | tee -a "$OUT/machine.txt"
exit $status
