# On a GPU machine: the real models' profile (bench/gpu_models.py) with random weights, at y2r's
# settings, from upstream sources and a real clip, without network access. -> $OUT
#   UPSTREAM_ARCHIVES=../shared/upstream CLIP=../shared/data/real/sheep.mp4 WHEELS=DIR bash bench/gpu_models.sh
# UPSTREAM_ARCHIVES holds the <owner>+<repo>.tar.gz snapshots (../shared/upstream/README.md);
# WHEELS, if set, holds wheels/sdists the machine lacks (SAM 2 needs hydra-core, omegaconf,
# antlr4-python3-runtime, iopath; SAM 3 also ftfy, portalocker, pycocotools, decord, einops, timm and
# setuptools<81 for its pkg_resources), installed into /tmp/site. MODELS (default cotracker,grounded_sam; or sam3, wilor);
# PACK (default 2,4; empty: none): also run that many processes of each model at once on the GPU.
# UPSTREAM_DIR, SITE_DIR, RUN_DIR (defaults /tmp/ff-upstream, /tmp/site, /tmp/ff-gpu-models): where the checkouts,
# the wheels and the runs go (another bench running beside this one on the same machine gets its own).
set -u
export FRAMEFLEET_DEFAULT_BACKENDS=synthetic  # the synthetic compute-bound model, named (the default is the real backends)
OUT=${OUT:-/tmp/ffout}; mkdir -p "$OUT"
UP=${UPSTREAM_DIR:-/tmp/ff-upstream}; mkdir -p "$UP"
SITE=${SITE_DIR:-/tmp/site}
for f in "${UPSTREAM_ARCHIVES:-../shared/upstream}"/*.tar.gz; do tar xzf "$f" -C "$UP"; done
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" "$WHEELS"/* || exit 1
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # as framefleet's workers run
RUN=${RUN_DIR:-/tmp/ff-gpu-models}; mkdir -p "$RUN"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} | tee "$OUT/machine.txt"
PYTHONUNBUFFERED=1 python3 bench/gpu_models.py --upstream "$UP" --clip "${CLIP:-../shared/data/real/sheep.mp4}" \
  --out "$RUN" --models "${MODELS:-cotracker,grounded_sam}" --frames "${FRAMES:-120}" --windows "${WINDOWS:-20}" \
  --pack "${PACK-2,4}"
cp "$RUN"/*.json "$RUN"/table.md "$OUT"/ 2>/dev/null
tar czf "$OUT/runs.tgz" -C "$RUN" .  # every process's JSON and log
