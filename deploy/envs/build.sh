#!/usr/bin/env bash
# Build one Python environment per upstream model from its lock, check it, and record what it holds.
#
#   bash deploy/envs/build.sh [vipe|tapip3d|cotracker|wilor|grounded_sam|sam3|all]
#
# Per model: a venv from PYTHON; every package of deploy/envs/<model>.lock, exactly (--no-deps: the
# lock is the whole set, framefleet's needs included); the upstream sources at deploy/envs/pins.sh's commits,
# --no-deps (those with CUDA code without build isolation, so they compile against the env's torch);
# framefleet itself, --no-deps, so it cannot move a pinned package. Then `pip check`, an import of
# the model and of framefleet's backend, and <env>/framefleet-env.json: the lock's hash, the commits
# and every installed version.
#
# ENVS_DIR (default /opt/framefleet/envs): where the venvs go (<model>/bin/python).
# MODELS_DIR (default /opt/framefleet/models): where the checkouts go (configs/real-gpu.yaml's layout).
# PYTHON (default python3.11): the locks are for CPython 3.11 on Linux x86_64 (deploy/envs/lock.sh).
# UPSTREAM_GIT_BASE (default https://github.com): where the pinned repositories are cloned from (pins.sh).
# Needs git, network access (PyPI, GitHub), and for vipe, tapip3d and grounded_sam a CUDA toolkit
# whose nvcc matches the lock's torch (12.x); vipe also Eigen 3.4 (apt install libeigen3-dev, or
# setup.py downloads it), wilor libEGL and libOpenGL (apt install libegl1 libopengl0: pyrender,
# imported by WiLoR, loads them; NVIDIA's driver provides the EGL vendor library, no display).
# Weights are not downloaded here: see "Using the real models" in the README.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
PROJECT="$(cd "$HERE/../.." && pwd)"
ENVS_DIR="${ENVS_DIR:-/opt/framefleet/envs}"
MODELS_DIR="${MODELS_DIR:-/opt/framefleet/models}"
PYTHON="${PYTHON:-python3.11}"

# The upstream repositories and the commits the adapters were written against (VIPE_REPO, VIPE_COMMIT, ...).
source "$HERE/pins.sh"

fail() { echo "build.sh: $*" >&2; exit 1; }

checkout() { # url commit folder
  if [ ! -d "$3/.git" ]; then git clone --quiet "$1" "$3"; fi
  git -C "$3" fetch --quiet origin && git -C "$3" checkout --quiet "$2"
}

venv() { # model: a fresh venv holding exactly the lock
  local py="$ENVS_DIR/$1/bin/python"
  "$PYTHON" -m venv --clear "$ENVS_DIR/$1"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q --no-deps -r "$HERE/$1.lock"
}

pip_in() { # model, pip arguments...
  local m=$1; shift
  "$ENVS_DIR/$m/bin/python" -m pip install -q --no-deps "$@"
}

finish() { # model, python import check, then name=commit pairs
  local m=$1 check=$2; shift 2
  pip_in "$m" -e "$PROJECT"
  "$ENVS_DIR/$m/bin/python" -m pip check || fail "pip check failed in $ENVS_DIR/$m (above: what conflicts)"
  "$ENVS_DIR/$m/bin/python" -c "$check" || fail "$m: the model or framefleet's backend does not import in $ENVS_DIR/$m"
  "$ENVS_DIR/$m/bin/python" - "$m" "$HERE/$m.lock" "$@" > "$ENVS_DIR/$m/framefleet-env.json" <<'PY'
import hashlib, importlib.metadata as md, json, platform, sys, time
model, lock, *commits = sys.argv[1:]
print(json.dumps({
    "model": model,
    "python": platform.python_version(),
    "lock": lock,
    "lock_sha256": hashlib.sha256(open(lock, "rb").read()).hexdigest(),
    "commits": dict(c.split("=", 1) for c in commits),
    "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "packages": dict(sorted((d.metadata["Name"].lower(), d.version) for d in md.distributions())),
}, indent=1))
PY
  echo "$m env ready: $ENVS_DIR/$m (versions in framefleet-env.json)"
}

build_vipe() {
  local src="$MODELS_DIR/vipe" moge="$MODELS_DIR/MoGe"
  checkout "$UPSTREAM_GIT_BASE/$VIPE_REPO" "$VIPE_COMMIT" "$src"
  checkout "$UPSTREAM_GIT_BASE/$MOGE_REPO" "$MOGE_COMMIT" "$moge"
  venv vipe
  # setup.py downloads Eigen into csrc/include/eigen3 unless it is there: take the system's when installed.
  if [ -d /usr/include/eigen3/Eigen ] && [ ! -e "$src/csrc/include/eigen3/Eigen" ]; then
    mkdir -p "$src/csrc/include/eigen3" && cp -r /usr/include/eigen3/Eigen "$src/csrc/include/eigen3/"
  fi
  (cd "$src" && pip_in vipe --no-build-isolation -e .)
  pip_in vipe "git+$UPSTREAM_GIT_BASE/$UTILS3D_REPO.git@$UTILS3D_COMMIT" \
    "git+$UPSTREAM_GIT_BASE/$PIPELINE_REPO.git@$PIPELINE_COMMIT" -e "$moge"
  finish vipe "import torch, vipe_ext, vipe; from moge.model.v1 import MoGeModel; import tasks.backends.vipe" \
    "vipe=$VIPE_COMMIT" "moge=$MOGE_COMMIT" "utils3d=$UTILS3D_COMMIT" "pipeline=$PIPELINE_COMMIT"
}

build_tapip3d() {
  local src="$MODELS_DIR/TAPIP3D"
  checkout "$UPSTREAM_GIT_BASE/$TAPIP3D_REPO" "$TAPIP3D_COMMIT" "$src"
  venv tapip3d
  pip_in tapip3d --no-build-isolation "$src/third_party/pointops2"
  # TAPIP3D runs from its checkout (the backend imports utils/inference_utils.py by path).
  finish tapip3d "import sys; sys.path.insert(0, '$src'); import torch, pointops2_cuda, models; import tasks.backends.tapip3d" \
    "tapip3d=$TAPIP3D_COMMIT"
}

build_cotracker() {
  local src="$MODELS_DIR/co-tracker"
  checkout "$UPSTREAM_GIT_BASE/$COTRACKER_REPO" "$COTRACKER_COMMIT" "$src"
  venv cotracker
  pip_in cotracker "$src"
  finish cotracker "import cotracker.predictor; import tasks.backends.cotracker" "co-tracker=$COTRACKER_COMMIT"
}

build_wilor() {
  local src="$MODELS_DIR/WiLoR"
  for lib in libEGL.so.1 libOpenGL.so.0; do
    ldconfig -p | grep -q "$lib" ||
      fail "$lib is missing: WiLoR imports pyrender, whose PyOpenGL loads it (headless EGL, no display). Install it: sudo apt-get install -y libegl1 libopengl0"
  done
  checkout "$UPSTREAM_GIT_BASE/$WILOR_REPO" "$WILOR_COMMIT" "$src"
  venv wilor
  # WiLoR runs from its checkout (the backend puts it on sys.path); it sets PYOPENGL_PLATFORM=egl itself.
  finish wilor "import sys; sys.path.insert(0, '$src'); import chumpy, ultralytics, wilor.models; import tasks.backends.wilor" \
    "wilor=$WILOR_COMMIT"
}

build_grounded_sam() {
  local src="$MODELS_DIR/sam2"
  checkout "$UPSTREAM_GIT_BASE/$SAM2_REPO" "$SAM2_COMMIT" "$src"
  venv grounded_sam
  # SAM 2's _C extension compiles against the env's torch (build isolation would fetch the newest torch).
  (cd "$src" && SAM2_BUILD_CUDA=1 pip_in grounded_sam --no-build-isolation -e .)
  finish grounded_sam "import transformers, sam2.build_sam; import tasks.backends.grounded_sam" "sam2=$SAM2_COMMIT"
}

build_sam3() {
  local src="$MODELS_DIR/sam3"
  checkout "$UPSTREAM_GIT_BASE/$SAM3_REPO" "$SAM3_COMMIT" "$src"
  venv sam3
  # A regular install: the tokenizer's vocabulary (sam3/assets/*.txt.gz) is package data.
  pip_in sam3 "$src"
  finish sam3 "import sam3.model_builder; import tasks.backends.sam3" "sam3=$SAM3_COMMIT"
}

"$PYTHON" -c 'import sys; assert sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11)' 2>/dev/null ||
  fail "PYTHON=$PYTHON is not CPython 3.11, which the locks (deploy/envs/*.lock) are resolved for; set PYTHON=/path/to/python3.11"
mkdir -p "$ENVS_DIR" "$MODELS_DIR"
ENVS_DIR="$(cd "$ENVS_DIR" && pwd)" MODELS_DIR="$(cd "$MODELS_DIR" && pwd)"  # the steps change folders
case "${1:-all}" in
  vipe|tapip3d|cotracker|wilor|grounded_sam|sam3) "build_$1" ;;
  all) for m in vipe tapip3d cotracker wilor grounded_sam sam3; do "build_$m"; done ;;
  *) echo "usage: $0 [vipe|tapip3d|cotracker|wilor|grounded_sam|sam3|all]" >&2; exit 2 ;;
esac
