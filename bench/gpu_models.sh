#!/usr/bin/env bash
# On a GPU host: the real models' profile (bench/gpu_models.py) with random weights, at y2r's settings,
# from the upstream sources at deploy/envs/pins.sh's commits and a clip, without model downloads. -> $OUT
#   make install-upstream && bash bench/gpu_models.sh
# The environment: bench/gpu_lib.sh's gpu_python (.venv from `make install`, .device, or $ACTIVATE); `make
# install-upstream` adds what SAM 2 and WiLoR import (hydra-core, iopath, yacs, pyrender, ...). The sources:
# gpu_lib.sh's upstream (UPSTREAM_ARCHIVES, e.g. .gpu/up/upstream on a host without network, else a clone), into
# UPSTREAM_DIR (default /tmp/ff-upstream). The clip: CLIP, else gpu_lib.sh's `clip sheep` (a real clip when
# FRAMEFLEET_REAL_DATA or shared/data/real has one, else a synthetic one, said so).
#   UPSTREAM_ARCHIVES=.gpu/up/upstream CLIP=.gpu/up/data/sheep.mp4 WHEELS=.gpu/real/whl bash bench/gpu_models.sh
# (a host without network, with bench/gpu_carry.sh's folders). WHEELS, if set, holds wheels/sdists the machine
# lacks (SAM 2 needs hydra-core, omegaconf, antlr4-python3-runtime, iopath; SAM 3 also ftfy, portalocker,
# pycocotools, decord, einops, timm and setuptools<81 for its pkg_resources), installed into SITE_DIR.
# MODELS (default cotracker,grounded_sam; or sam3, wilor); PACK (default 2,4; empty: none): also run that many
# processes of each model at once on the GPU. SITE_DIR, RUN_DIR (defaults /tmp/site, /tmp/ff-gpu-models): where
# the wheels and the runs go (another bench running beside this one on the same machine gets its own).
source "$(dirname "$0")/gpu_lib.sh"; gpu_python || exit 1
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
export UPSTREAM_DIR=${UPSTREAM_DIR:-/tmp/ff-upstream}
SITE=${SITE_DIR:-/tmp/site}
MODELS=${MODELS:-cotracker,grounded_sam}
declare -A SOURCE=([cotracker]=facebookresearch+co-tracker [grounded_sam]=facebookresearch+sam2
  [sam3]=facebookresearch+sam3 [wilor]=rolpotamias+WiLoR)
for m in ${MODELS//,/ }; do
  [ -n "${SOURCE[$m]:-}" ] || { echo "MODELS: $m is not one of ${!SOURCE[*]}" >&2; exit 2; }
  upstream "${SOURCE[$m]}" > /dev/null || exit 1
done
clip=$(clip sheep) || exit 1
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" "$WHEELS"/* || exit 1
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # as framefleet's workers run
RUN=${RUN_DIR:-/tmp/ff-gpu-models}; mkdir -p "$RUN"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} | tee "$OUT/machine.txt"
PYTHONUNBUFFERED=1 python3 bench/gpu_models.py --upstream "$UPSTREAM_DIR" --clip "$clip" \
  --out "$RUN" --models "$MODELS" --frames "${FRAMES:-120}" --windows "${WINDOWS:-20}" \
  --pack "${PACK-2,4}"
cp "$RUN"/*.json "$RUN"/table.md "$OUT"/ 2>/dev/null
tar czf "$OUT/runs.tgz" -C "$RUN" .  # every process's JSON and log
