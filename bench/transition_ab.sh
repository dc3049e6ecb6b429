#!/usr/bin/env bash
# Before/after of a stage transition in one sitting: bench/compare.py's ff-1by1 and raw-chain modes,
# alternating a checkout of the base commit (BASE_TREE, with this tree's bench/ copied in) and this tree.
#
#   bench/transition_ab.sh BASE_TREE RAW_DIR [PAIRS=2] [VIDEOS=10]
#
# Each run measures the raw chain too, so every ratio has its own floor. Results: $WORK/*.txt, *.json.
set -euo pipefail
base=$(realpath "$1"); raw=$(realpath "$2"); pairs=${3:-2}; videos=${4:-10}
here=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d /tmp/ff-transition-ab.XXXX)}
python=${PYTHON:-/work/main/.venv/bin/python}
export FRAMEFLEET_TORCH_THREADS=1
for i in $(seq 1 "$pairs"); do
  for side in before after; do
    tree=$here; [ "$side" = before ] && tree=$base
    echo "== $side $i: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$work/log.txt"
    (cd "$tree" && PYTHONPATH=$tree "$python" bench/compare.py "$raw" --work "$work/$side$i" \
      --modes ff-1by1,raw-chain --one-by-one "$videos" --rounds 1 --json "$work/$side$i.json") \
      > "$work/$side$i.txt" 2>&1
    grep -E "^(ff-1by1|raw-chain) " "$work/$side$i.txt" | tee -a "$work/log.txt"
  done
done
echo "results in $work"
