#!/usr/bin/env bash
# The folders the GPU benches carry (git-ignored under .gpu/), made again on a machine with PyPI and
# Debian's mirror: the GPU machine has no network, no ../shared beside the tree, and its image's
# Python 3.12 with torch, transformers 5, OpenCV, h5py, numpy, scipy, timm and nvcc. -> .gpu/
#   bash bench/gpu_carry.sh [vipe] [real] [up]        (default: all three)
# vipe  .gpu/vipe (~34 MB): bench/gpu_vipe.sh's WHEELS (whl/, deploy/envs/vipe.lock's versions, plus
#       framefleet's own as ../shared/device/prepare.sh lists them, less PyAV), EXTRA (extra/utils3d at MoGe's
#       pin, extra/pycg's .py files) and EIGEN (eigen.tgz, Debian's libeigen3-dev). utils3d is not on PyPI (the
#       "utils3d" there is another package): UTILS3D_SRC names a git directory or checkout of EasternJournalist/utils3d
#       holding deploy/envs/pins.sh's UTILS3D_COMMIT (a bare mirror will do), or a folder with utils3d/ at that commit;
#       without it, bench/gpu_lib.sh's upstream clones it from GitHub, and where that fails the call stops, said so.
# real  .gpu/real (~12 MB): the WHEELS and GL_DEBS of the real-model benches (the real-model autoscaler, SAM 3, the
#       TAPIP3D and WiLoR conformance run); .gpu/real2 (~14 MB): decord, which SAM 3's builder imports
#       (sam3/train/data/sam3_image_dataset.py:20), carried apart for the 64 MiB limit (DECORD_WHEELS).
# up    .gpu/up: the upstream sources' archives at deploy/envs/pins.sh's commits (.gpu/up/upstream: copied from
#       UPSTREAM_ARCHIVES, default the shared folder's upstream/ where it is beside the repository, else made from
#       bench/gpu_lib.sh's upstream clones) and the clips dog, sheep, pstudio (.gpu/up/data: gpu_lib.sh's clip, from
#       FRAMEFLEET_REAL_DATA, default the shared folder's data/real where present, else synthetic ones, said so).
#       A GPU bench then takes UPSTREAM_ARCHIVES=.gpu/up/upstream and CLIP or FRAMEFLEET_REAL_DATA=.gpu/up/data;
#       carry only the archives a call needs (docs/archive/notebook.md).
# What one call can carry, with the tree (3.3 MiB): 64 MiB. .device (../shared/device/prepare.sh) is 44 MiB, 34 of
# them PyAV; .gpu/real 12, .gpu/real2 13, .gpu/up 6.5, .gpu/vipe 31: .device + .gpu/up travel in one call (54 MiB),
# .gpu/vipe + .gpu/real + .gpu/real2 in the next (59 MiB); .device + .gpu/real + .gpu/up (66 MiB) do not fit.
# A warm machine keeps /tmp between calls, not the carried paths.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_lib.sh  # deploy/envs/pins.sh's commits, upstream, clip
PY=${PY:-python3}
DL=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux2010_x86_64
  --platform manylinux_2_12_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)

wheels() {  # DEST PACKAGE==VERSION...: binary wheels for CPython 3.12; sdist-only ones built into pure wheels
  local dest=$1; shift
  mkdir -p "$dest"
  local pkg
  for pkg in "$@"; do
    "$PY" -m pip download -q "${DL[@]}" -d "$dest" "$pkg" 2>/dev/null ||
      "$PY" -m pip wheel -q --no-deps -w "$dest" "$pkg"  # antlr4-python3-runtime, iopath, PyOpenGL: sdists only
  done
}

debs() {  # DEST PACKAGE...: Debian packages, downloaded as they are
  mkdir -p "$1"
  (cd "$1" && apt-get download "${@:2}" > /dev/null)
}

vipe() {
  local d=.gpu/vipe
  rm -rf "$d"; mkdir -p "$d/extra"
  # ViPE's own (deploy/envs/vipe.lock), transformers 4 since ViPE's GroundingDINO calls BertModel.get_head_mask
  wheels "$d/whl" hydra-core==1.3.2 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 kornia==0.8.0 kornia-rs==0.2.0 \
    gdown==5.2.0 beautifulsoup4==4.15.0 soupsieve==2.10 roma==1.8.0 pyquaternion==0.9.9 openexr==3.2.4 \
    rich==14.3.4 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 transformers==4.48.3 tokenizers==0.21.4 \
    huggingface-hub==0.36.2 requests==2.34.2 urllib3==2.8.0 idna==3.20 certifi==2026.10.19.post1 \
    charset-normalizer==3.5.2 PySocks==1.7.1 typing-extensions==4.16.0 click==8.5.1 humanize==4.17.0 \
    ninja==1.11.1.4
  # framefleet's own, as ../shared/device/prepare.sh lists them, less PyAV
  wheels "$d/whl" celery==5.7.0 kombu==5.7.0 amqp==5.4.2 vine==5.1.0 billiard==4.3.2 click-didyoumean==0.3.1 \
    click-plugins==1.1.1.2 click-repl==0.4.1 prompt-toolkit==3.0.53 wcwidth==0.9.4 tzlocal==5.4.5 pytz==2026.6 \
    redis==8.1.0 flower==2.2.0 tornado==6.6.1 pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 \
    python-dotenv==1.2.4 annotated-types==0.8.0 typing-inspection==0.4.5
  # pycg's Python files, without its 30 MB of render assets
  local tmp; tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps -d "$tmp" python-pycg==0.10.1
  "$PY" - "$tmp" "$d/extra" <<'PYEOF'
import sys, zipfile
from pathlib import Path
src, dest = Path(sys.argv[1]), Path(sys.argv[2])
with zipfile.ZipFile(next(src.glob("*.whl"))) as z:
    for name in z.namelist():
        if name.startswith("pycg/") and name.endswith(".py"):
            z.extract(name, dest)
PYEOF
  rm -rf "$tmp"
  local utils3d=${UTILS3D_SRC:-}
  [ -n "$utils3d" ] || utils3d=$(UPSTREAM_ARCHIVES= FRAMEFLEET_UPSTREAM_SRC= upstream EasternJournalist+utils3d) ||
    { echo "no utils3d (MoGe's inference imports it): set UTILS3D_SRC to a git directory of EasternJournalist/utils3d holding $UTILS3D_COMMIT, or a folder with utils3d/ at it" >&2; exit 1; }
  if [ -d "$utils3d/utils3d" ] && ! git -C "$utils3d" rev-parse --git-dir > /dev/null 2>&1; then
    cp -r "$utils3d/utils3d" "$d/extra/"
  else
    git -C "$utils3d" archive "$UTILS3D_COMMIT" utils3d | tar -x -C "$d/extra"
  fi
  # Eigen 3.4's headers as Eigen/..., which gpu_vipe.sh extracts into csrc/include/eigen3
  tmp=$(mktemp -d)
  debs "$tmp" libeigen3-dev
  dpkg-deb -x "$tmp"/libeigen3-dev_*.deb "$tmp/x"
  tar -czf "$d/eigen.tgz" -C "$tmp/x/usr/include/eigen3" Eigen
  rm -rf "$tmp"
  du -sh "$d"
}

real() {
  rm -rf .gpu/real .gpu/real2
  # the real-model autoscaler, SAM 3 and the conformance run (deploy/envs/*.lock's versions)
  wheels .gpu/real/whl hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 iopath==0.1.10 \
    portalocker==4.4.2 yacs==0.1.8 smplx==0.1.28 trimesh==5.2.0 ultralytics==8.1.34 thop==0.1.1.post2209072238 \
    pyrender==0.1.45 PyOpenGL==3.1.0 pyglet==2.1.19 freetype-py==2.5.1 python-box==7.4.1 ftfy==6.1.1 \
    setuptools==80.10.2 pycocotools==2.0.11 einops==0.8.2 timm==1.0.31 psutil==7.2.2
  # python-box's pure wheel, not its 4.5 MB compiled one
  rm -f .gpu/real/whl/python_box-*cp312*.whl
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py --abi none \
    --platform any -d .gpu/real/whl python-box==7.4.1
  debs .gpu/real/gl-debs libegl1 libglvnd0 libopengl0 libgl1 libglx0
  wheels .gpu/real2/whl decord==0.6.0
  du -sh .gpu/real .gpu/real2
}

up() {
  rm -rf .gpu/up; mkdir -p .gpu/up/upstream .gpu/up/data
  local archives name src c
  archives=$(archives_dir) || archives=
  for name in "${UPSTREAM_SOURCES[@]}"; do
    if [ -n "$archives" ]; then
      cp "$archives/$name.tar.gz" .gpu/up/upstream/
    else  # an archive as the shared folder's are: NAME/ with .upstream-commit, without git's history
      src=$(upstream "$name")
      tar -czf ".gpu/up/upstream/$name.tar.gz" -C "$(dirname "$src")" --exclude=.git "$name"
    fi
  done
  for name in dog sheep pstudio; do
    c=$(clip "$name")
    cp "$c" ".gpu/up/data/$name.mp4"
  done
  du -sh .gpu/up
}

for part in "${@:-vipe real up}"; do
  for p in $part; do "$p"; done
done
