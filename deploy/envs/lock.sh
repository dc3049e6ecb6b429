#!/usr/bin/env bash
# Resolve the lock of each model environment: deploy/envs/<model>.lock from <model>.in plus
# framefleet's own dependencies (pyproject.toml), so that framefleet's needs are resolved
# with the model's pins and installing framefleet (--no-deps) cannot move one.
#
#   bash deploy/envs/lock.sh [cotracker|grounded_sam|sam3|tapip3d|vipe|wilor|all]
#
# Needs uv (pip install uv==0.13.8) and PyPI. The target is fixed here: CPython 3.11 on Linux
# x86_64 with glibc >= 2.31, and PyPI as it was at EXCLUDE_NEWER, so a re-run gives the same lock
# until an input changes (tests/test_env_locks.py checks that). To move to newer packages, raise
# EXCLUDE_NEWER, re-run and commit the locks.
# PyPI's torch wheels carry one CUDA build per version (2.7.0: CUDA 12.6; 2.5.1: 12.4; 2.4.1: 12.1;
# 2.0.0: 11.7). For another, e.g. CUDA 12.8 on an RTX 50xx, run with TORCH_BACKEND=cu128 (uv's
# --torch-backend, PyTorch's index) into another LOCK_DIR and build from there.
# LOCK_DIR (default: this folder) is where the locks go.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
PROJECT="$(cd "$HERE/../.." && pwd)"
LOCK_DIR="${LOCK_DIR:-$HERE}"
UV="${UV:-uv}"
MODELS=(cotracker grounded_sam sam3 tapip3d vipe wilor)
PYTHON_VERSION=3.11
PLATFORM=x86_64-manylinux_2_31
EXCLUDE_NEWER=2026-11-20T00:00:00Z
INDEX_URL=https://pypi.org/simple

lock() { # model
  local extra=()
  if [ -n "${TORCH_BACKEND:-}" ]; then extra=(--torch-backend "$TORCH_BACKEND"); fi
  mkdir -p "$LOCK_DIR"
  (cd "$PROJECT" && "$UV" pip compile --quiet --no-config --index-url "$INDEX_URL" \
      --python-version "$PYTHON_VERSION" --python-platform "$PLATFORM" --exclude-newer "$EXCLUDE_NEWER" \
      --custom-compile-command "bash deploy/envs/lock.sh $1" "${extra[@]}" \
      "deploy/envs/$1.in" pyproject.toml -o "$LOCK_DIR/$1.lock")
}

case "${1:-all}" in
  all) for m in "${MODELS[@]}"; do lock "$m"; done ;;
  cotracker|grounded_sam|sam3|tapip3d|vipe|wilor) lock "$1" ;;
  *) echo "usage: $0 [${MODELS[*]}|all]" >&2; exit 2 ;;
esac
