#!/usr/bin/env bash
# Build one Python environment per upstream model and install framefleet into each.
#
#   bash deploy/envs/build.sh [vipe|tapip3d|cotracker|wilor|grounded_sam|all]
#
# ENVS_DIR (default /opt/framefleet/envs): where the venvs go (<model>/bin/python).
# MODELS_DIR (default /opt/framefleet/models): where the checkouts go (configs/real-gpu.yaml's layout).
# PYTHON (default python3.11): the interpreter the venvs are made from (framefleet needs >= 3.11).
# Needs git, a CUDA toolkit with nvcc on PATH (ViPE and TAPIP3D compile extensions) and network access.
# Weights are not downloaded here: see "Using the real models" in the README.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
PROJECT="$(cd "$HERE/../.." && pwd)"
ENVS_DIR="${ENVS_DIR:-/opt/framefleet/envs}"
MODELS_DIR="${MODELS_DIR:-/opt/framefleet/models}"
PYTHON="${PYTHON:-python3.11}"

# The upstream commits these adapters were written against.
VIPE_COMMIT=1249a0cf2b147d1cf6e17cff019e9e0b2a51fb09      # hgupt3/vipe
TAPIP3D_COMMIT=9359ae236f16a58a103dc1c55ad1919360dc6f8b   # zbw001/TAPIP3D
COTRACKER_COMMIT=82e02e8029753ad4ef13cf06be7f4fc5facdda4d # facebookresearch/co-tracker
WILOR_COMMIT=819369a764905a26a4e80aae04bbfa9c7e4f6512     # rolpotamias/WiLoR (y2r's submodule commit)
SAM2_COMMIT=2b90b9f5ceec907a1c18123530e92e794ad901a4      # facebookresearch/sam2

checkout() { # url commit folder
  if [ ! -d "$3/.git" ]; then git clone "$1" "$3"; fi
  git -C "$3" fetch --quiet origin && git -C "$3" checkout --quiet "$2"
}

venv() { # model -> prints the env's python
  "$PYTHON" -m venv "$ENVS_DIR/$1"
  "$ENVS_DIR/$1/bin/python" -m pip install -q --upgrade pip wheel setuptools
  "$ENVS_DIR/$1/bin/python" -m pip install -q -r "$HERE/$1.txt"
}

project() { # model: framefleet itself, editable, without touching the pinned torch
  "$ENVS_DIR/$1/bin/python" -m pip install -q -e "$PROJECT"
  "$ENVS_DIR/$1/bin/python" -c "import tasks.backends as b; print('$1 env ready:', b.__file__)"
}

build_vipe() {
  checkout https://github.com/hgupt3/vipe "$VIPE_COMMIT" "$MODELS_DIR/vipe"
  venv vipe
  "$ENVS_DIR/vipe/bin/python" -m pip install -q -r "$MODELS_DIR/vipe/envs/requirements.txt" \
      --extra-index-url https://download.pytorch.org/whl/cu128
  (cd "$MODELS_DIR/vipe" && USE_SYSTEM_EIGEN=1 "$ENVS_DIR/vipe/bin/python" -m pip install -q --no-build-isolation -e .)
  project vipe
}

build_tapip3d() {
  checkout https://github.com/zbw001/TAPIP3D "$TAPIP3D_COMMIT" "$MODELS_DIR/TAPIP3D"
  venv tapip3d
  "$ENVS_DIR/tapip3d/bin/python" -m pip install -q -r "$MODELS_DIR/TAPIP3D/requirements.txt"
  (cd "$MODELS_DIR/TAPIP3D/third_party/pointops2" && "$ENVS_DIR/tapip3d/bin/python" setup.py install)
  project tapip3d
}

build_cotracker() {
  venv cotracker
  "$ENVS_DIR/cotracker/bin/python" -m pip install -q \
      "git+https://github.com/facebookresearch/co-tracker@$COTRACKER_COMMIT"
  project cotracker
}

build_wilor() {
  checkout https://github.com/rolpotamias/WiLoR "$WILOR_COMMIT" "$MODELS_DIR/WiLoR"
  venv wilor
  "$ENVS_DIR/wilor/bin/python" -m pip install -q -r "$MODELS_DIR/WiLoR/requirements.txt"
  project wilor
}

build_grounded_sam() {
  venv grounded_sam
  "$ENVS_DIR/grounded_sam/bin/python" -m pip install -q "git+https://github.com/facebookresearch/sam2@$SAM2_COMMIT"
  project grounded_sam
}

mkdir -p "$ENVS_DIR" "$MODELS_DIR"
case "${1:-all}" in
  vipe|tapip3d|cotracker|wilor|grounded_sam) "build_$1" ;;
  all) for m in vipe tapip3d cotracker wilor grounded_sam; do "build_$m"; done ;;
  *) echo "usage: $0 [vipe|tapip3d|cotracker|wilor|grounded_sam|all]" >&2; exit 2 ;;
esac
