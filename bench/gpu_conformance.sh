#!/usr/bin/env bash
# On a GPU host: TAPIP3D and WiLoR through their real upstream code and framefleet's backends,
# random weights in the upstream checkpoint formats, a clip, no model downloads (bench/gpu_conformance.py).
#   make install-upstream && bash bench/gpu_conformance.sh   -> $OUT
# The environment: bench/gpu_lib.sh's gpu_python (.venv from `make install`, .device, or $ACTIVATE; gpu_env with
# CHAIN=1, whose workers need celery and a redis-server). The sources: gpu_lib.sh's upstream (zbw001+TAPIP3D and
# rolpotamias+WiLoR at deploy/envs/pins.sh's commits: UPSTREAM_ARCHIVES, else shared/upstream, else a clone). The
# clips: gpu_lib.sh's `clip dog` (tracks) and `clip pstudio` (hands): CLIP for both, else FRAMEFLEET_REAL_DATA or
# shared/data/real, else synthetic ones (said so; WiLoR then finds no hands). On a host without network:
#   UPSTREAM_ARCHIVES=.gpu/up/upstream FRAMEFLEET_REAL_DATA=.gpu/up/data WHEELS=.gpu/real/whl GL_DEBS=.gpu/real/gl-debs \
#     bash bench/gpu_conformance.sh
# WHEELS, if set: wheels/sdists the machine lacks, installed into /tmp/site (TAPIP3D: omegaconf,
# hydra-core, antlr4-python3-runtime, python-box; WiLoR: yacs, smplx, trimesh, ultralytics, thop,
# pyrender, PyOpenGL, pyglet, freetype-py; the versions of deploy/envs/*.lock). GL_DEBS, if set:
# Debian's libegl1, libglvnd0, libopengl0, libgl1, libglx0, unpacked into / (pyrender's EGL).
# pointops2 (TAPIP3D's CUDA extension) is compiled here for TORCH_CUDA_ARCH_LIST (default 9.0).
# MODELS (default tapip3d,wilor); DETECTOR (default x): the random YOLOv8's scale; CHAIN=1 also runs a
# dataset through real workers, stopped CHAIN_BY_S (default 320) seconds after the start (skipped with
# less than a minute left). UPSTREAM_DIR, SITE_DIR, RUN_DIR (defaults /tmp/ff-upstream, /tmp/site,
# /tmp/ff-conformance): where the checkouts, the wheels with pointops2, and the steps go.
source "$(dirname "$0")/gpu_lib.sh"
if [ "${CHAIN:-0}" = 1 ]; then gpu_env || exit 1; else gpu_python || exit 1; fi
set -u
start=$(date +%s)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
export UPSTREAM_DIR=${UPSTREAM_DIR:-/tmp/ff-upstream}; UP=$UPSTREAM_DIR
SITE=${SITE_DIR:-/tmp/site}
for name in zbw001+TAPIP3D rolpotamias+WiLoR; do
  upstream "$name" > /dev/null || exit 1
done
tracks_clip=$(clip dog) && hands_clip=$(clip pstudio) || exit 1
if [ -n "${GL_DEBS:-}" ]; then for f in "$GL_DEBS"/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl >"$OUT/wheels.log" 2>&1 \
    || { tail -20 "$OUT/wheels.log"; exit 1; }
  for sdist in "$WHEELS"/*.tar.gz "$WHEELS"/*.zip; do  # one at a time: a failure is reported, not fatal
    [ -e "$sdist" ] || continue
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" "$sdist" \
      >>"$OUT/wheels.log" 2>&1 || echo "could not install $sdist (see wheels.log)"
  done
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # as framefleet's workers run
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nvcc --version | tail -2
  python3 -c "import sys, torch, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"
} | tee "$OUT/machine.txt"
t=$(date +%s)
# deploy/envs/build.sh's way: pip, without build isolation, against this torch.
(cd "$UP/zbw001+TAPIP3D/third_party/pointops2" && TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} \
  python3 -m pip install -v --no-index --no-deps --no-build-isolation --target "$SITE" . >"$OUT/pointops2-build.log" 2>&1) \
  || { tail -40 "$OUT/pointops2-build.log"; exit 1; }
echo "pointops2 built in $(( $(date +%s) - t )) s" | tee -a "$OUT/machine.txt"
# pyrender's EGL context (WiLoR builds one at load) through NVIDIA's EGL vendor library, where the driver has one.
vendor=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$vendor" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-$vendor}
RUN=${RUN_DIR:-/tmp/ff-conformance}; rm -rf "$RUN"; mkdir -p "$RUN"  # each step's JSON and log land there as it ends
collect() {  # few files come back from some machines: the summaries, and every step's output in one archive
  cp "$RUN"/table.md "$RUN"/*-run.json "$RUN"/chain.json "$OUT"/ 2>/dev/null
  tar czf "$OUT/steps.tgz" -C "$RUN" . 2>/dev/null
}
PYTHONUNBUFFERED=1 python3 bench/gpu_conformance.py --upstream "$UP" --out "$RUN" \
  --tracks-clip "$tracks_clip" --hands-clip "$hands_clip" --models "${MODELS:-tapip3d,wilor}" \
  --detector "${DETECTOR:-x}"
status=$?
collect
left=$(( ${CHAIN_BY_S:-320} - ($(date +%s) - start) ))
if [ "${CHAIN:-0}" = 1 ] && [ "$left" -gt 60 ]; then
  PYTHONUNBUFFERED=1 timeout "$left" python3 bench/gpu_conformance.py --upstream "$UP" --out "$RUN" \
    --tracks-clip "$tracks_clip" --hands-clip "$hands_clip" --step chain \
    >"$RUN/chain-step.log" 2>&1 || status=1
  collect
elif [ "${CHAIN:-0}" = 1 ]; then
  echo "chain skipped: $left s left of CHAIN_BY_S" | tee -a "$OUT/machine.txt"
fi
echo "total $(( $(date +%s) - start )) s" | tee -a "$OUT/machine.txt"
exit $status
