# What the GPU benches share: the Python environment, the upstream sources at their pins, the clips.
#   source bench/gpu_lib.sh; gpu_env || exit 1; src=$(upstream zbw001+TAPIP3D) || exit 1; c=$(clip dog) || exit 1
# Each works from the repository alone on a GPU host with network access, and from what a host without it
# was given (bench/gpu_carry.sh's .gpu/ folders, a .device folder, the shared reference folder):
# gpu_python   the interpreter's environment: $ACTIVATE if set, else .device/activate.sh in the checkout or beside
#              it (../.device), else .venv (make install).
# gpu_env      gpu_python, then celery, redis-py and a redis-server checked, and a Redis on 127.0.0.1:6379
#              started unless one answers there (the benches flush its databases 0-5: one holding data is
#              refused unless a bench claimed it, empty, before (the key ff-bench:claimed in db 15), or
#              GPU_BENCH_REDIS_OK=1).
# upstream NAME  (<owner>+<repo>, e.g. facebookresearch+co-tracker) prints the folder holding that source at
#              deploy/envs/pins.sh's commit, $UPSTREAM_DIR/NAME (default /tmp/ff-upstream): unpacked from
#              NAME.tar.gz of $UPSTREAM_ARCHIVES (or $FRAMEFLEET_UPSTREAM_SRC, or shared/upstream beside the
#              repository where it has NAME), else cloned from $UPSTREAM_GIT_BASE (default https://github.com) and
#              checked out.
# clip NAME    prints a clip: $CLIP if set, else $FRAMEFLEET_REAL_DATA/NAME.mp4, else shared/data/real/NAME.mp4
#              beside the repository, else a synthetic one (drawn shapes, CLIP_S seconds, default 12) encoded by
#              `framefleet sample` into $CLIP_DIR (default /tmp/ff-clips), said on stderr.
# Every failure is one line on stderr naming the fix, and status 1.

FF_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$FF_ROOT/deploy/envs/pins.sh"

gpu_fail() { echo "$*" >&2; return 1; }

shared_dir() {  # PART (e.g. upstream, data/real): shared/PART beside the repository or a folder above it
  local parent
  for parent in "$FF_ROOT/.." "$FF_ROOT/../.." "$FF_ROOT/../../.."; do
    if [ -d "$parent/shared/$1" ]; then (cd "$parent/shared/$1" && pwd); return 0; fi
  done
  return 1
}

gpu_python() {
  if [ -n "${ACTIVATE:-}" ]; then
    [ -f "$ACTIVATE" ] || { gpu_fail "gpu_env: ACTIVATE=$ACTIVATE does not exist: point it at an activate script"; return; }
    source "$ACTIVATE"
  elif [ -f "$FF_ROOT/.device/activate.sh" ]; then
    source "$FF_ROOT/.device/activate.sh"
  elif [ -f "$FF_ROOT/../.device/activate.sh" ]; then
    source "$FF_ROOT/../.device/activate.sh"
  elif [ -f "$FF_ROOT/.venv/bin/activate" ]; then
    source "$FF_ROOT/.venv/bin/activate"
  fi
  return 0
}

redis_answers() {  # PORT: something accepts connections on 127.0.0.1:PORT
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

gpu_env() {
  gpu_python || return
  local py
  py=$(command -v python3) || { gpu_fail "gpu_env: no python3 on PATH: run \`make install\` in $FF_ROOT"; return; }
  "$py" -c "import celery, redis" 2>/dev/null ||
    { gpu_fail "gpu_env: celery or redis-py is not importable by $py: run \`make install\` in $FF_ROOT (or set ACTIVATE to a script that provides them)"; return; }
  command -v redis-server > /dev/null ||
    { gpu_fail "gpu_env: no redis-server on PATH: install it (sudo apt-get install -y redis-server) or set ACTIVATE to a script that provides one"; return; }
  # The benches flush databases 0-5 there: a Redis that holds anyone's keys is not theirs to use, unless a bench
  # found it empty (or started it) and claimed it, so that one bench's data does not block the next.
  local claim="import redis, sys; c = redis.Redis(port=6379, db=15); ours = c.exists('ff-bench:claimed')
if not ours and any(redis.Redis(port=6379, db=d).dbsize() for d in range(16)): sys.exit(1)
c.set('ff-bench:claimed', 1)"
  if ! redis_answers 6379; then
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no --logfile /tmp/redis.log > /dev/null
    local _
    for _ in $(seq 50); do redis_answers 6379 && break; sleep 0.1; done
  fi
  if redis_answers 6379; then
    [ -n "${GPU_BENCH_REDIS_OK:-}" ] || "$py" -c "$claim" 2>/dev/null ||
      { gpu_fail "gpu_env: a Redis with data no bench claimed answers on 127.0.0.1:6379 and the GPU benches flush its databases 0-5: stop it or run on a host without one (GPU_BENCH_REDIS_OK=1 to use it anyway)"; return; }
    return 0
  fi
  gpu_fail "gpu_env: the redis-server started on 127.0.0.1:6379 does not answer: see /tmp/redis.log"
}

archives_dir() {  # the folder of <owner>+<repo>.tar.gz snapshots, if any
  if [ -n "${UPSTREAM_ARCHIVES:-}" ]; then echo "$UPSTREAM_ARCHIVES"
  elif [ -n "${FRAMEFLEET_UPSTREAM_SRC:-}" ]; then echo "$FRAMEFLEET_UPSTREAM_SRC"
  else shared_dir upstream
  fi
}

upstream() {
  local name=$1 dir=${UPSTREAM_DIR:-/tmp/ff-upstream} pinned url want archives got tmp
  pinned=$(pin "$name") || { gpu_fail "upstream: $name has no pin in deploy/envs/pins.sh: name one of ${UPSTREAM_SOURCES[*]}"; return; }
  read -r url want <<< "$pinned"
  mkdir -p "$dir" || { gpu_fail "upstream: cannot make UPSTREAM_DIR=$dir: point UPSTREAM_DIR at a writable folder"; return; }
  archives=$(archives_dir)
  # archives named by a variable must hold NAME; the shared folder's, found by default, may lack it (then a clone)
  if [ -n "$archives" ] && { [ -f "$archives/$name.tar.gz" ] || [ -n "${UPSTREAM_ARCHIVES:-}${FRAMEFLEET_UPSTREAM_SRC:-}" ]; }; then
    [ -f "$archives/$name.tar.gz" ] ||
      { gpu_fail "upstream: $archives has no $name.tar.gz: add it (bash bench/gpu_carry.sh up), or unset UPSTREAM_ARCHIVES to clone it"; return; }
    tar xzf "$archives/$name.tar.gz" -C "$dir" ||
      { gpu_fail "upstream: $archives/$name.tar.gz does not unpack into $dir: replace the archive"; return; }
    [ -d "$dir/$name" ] || { gpu_fail "upstream: $archives/$name.tar.gz holds no folder $name: make it again (bash bench/gpu_carry.sh up)"; return; }
    got=$(cat "$dir/$name/.upstream-commit" 2>/dev/null)
    [ "$got" = "$want" ] ||
      echo "upstream: $archives/$name.tar.gz is at ${got:-an unnamed commit (no .upstream-commit)}, not deploy/envs/pins.sh's $want" >&2
  elif [ "$(git -C "$dir/$name" rev-parse HEAD 2>/dev/null)" != "$want" ]; then
    tmp="$dir/.$name.clone.$$"
    rm -rf "$tmp"
    if ! git clone --quiet "$url" "$tmp" 2>/dev/null || ! git -C "$tmp" checkout --quiet "$want" 2>/dev/null; then
      rm -rf "$tmp"
      gpu_fail "upstream: no archive of $name (UPSTREAM_ARCHIVES unset, none in a shared/upstream beside the repository) and git clone $url at $want failed: give this host access to $UPSTREAM_GIT_BASE, or set UPSTREAM_ARCHIVES to a folder of <owner>+<repo>.tar.gz snapshots (bash bench/gpu_carry.sh up)"
      return
    fi
    echo "$want" > "$tmp/.upstream-commit"
    rm -rf "${dir:?}/$name" && mv "$tmp" "$dir/$name"
  fi
  echo "$dir/$name"
}

clip() {
  local name=$1 found
  if [ -n "${CLIP:-}" ]; then
    [ -f "$CLIP" ] || { gpu_fail "clip: CLIP=$CLIP is not a file: point it at a video, or unset it"; return; }
    echo "$CLIP"; return 0
  fi
  for found in "${FRAMEFLEET_REAL_DATA:-}" "$(shared_dir data/real)"; do
    [ -n "$found" ] && [ -f "$found/$name.mp4" ] && { echo "$found/$name.mp4"; return 0; }
  done
  local dir=${CLIP_DIR:-/tmp/ff-clips} seconds=${CLIP_S:-12} tmp
  if [ ! -f "$dir/$name.mp4" ]; then
    tmp=$(mktemp -d) || return
    python3 "$FF_ROOT/scripts/make_sample_dataset.py" "$tmp" --videos 1 --seconds "$seconds-$seconds" --jobs 1 \
      --seed "$(printf %s "$name" | cksum | cut -d' ' -f1)" > /dev/null &&
      mkdir -p "$dir" && mv "$tmp/video_000.mp4" "$dir/$name.mp4"
    local status=$?
    rm -rf "$tmp"
    [ $status = 0 ] ||
      { gpu_fail "clip: no $name.mp4 (CLIP, FRAMEFLEET_REAL_DATA unset; no shared/data/real) and \`framefleet sample\` failed: set FRAMEFLEET_REAL_DATA to a folder with $name.mp4, or run gpu_env first (PyAV)"; return; }
  fi
  echo "clip: $name is synthetic ($dir/$name.mp4: drawn shapes, not footage; set FRAMEFLEET_REAL_DATA to real clips)" >&2
  echo "$dir/$name.mp4"
}
