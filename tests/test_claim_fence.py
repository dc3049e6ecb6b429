"""The fence before publishing: a run whose claim another run took over writes nothing (real Redis, real files)."""

from __future__ import annotations

import pytest
import redis

from tasks.delivery import claims
from tasks.errors import ClaimLost, ClaimUnconfirmed
from tasks.outputs.storage import read_marker, save_npz, write_marker

KEY = claims.claim_key("/data/out", "clip_00", "depth")


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    claims.HELD.clear()
    yield redis.Redis.from_url(redis_url, decode_responses=True)
    claims.HELD.clear()


def test_a_run_that_still_holds_its_claim_publishes(r, tmp_path):
    assert claims.acquire(r, KEY, "gpu0@hostB task-1", ttl_s=30) is None
    out = tmp_path / "depth.npz"
    digest = save_npz(out, {"x": [1, 2, 3]}, fence=lambda: claims.confirm(r, KEY, 30))
    write_marker(out, digest, fence=lambda: claims.confirm(r, KEY, 30))
    assert read_marker(out) is not None


def test_a_lapsed_claim_nobody_took_is_taken_back(r):
    assert claims.acquire(r, KEY, "gpu0@hostB task-1", ttl_s=30) is None
    r.delete(KEY)  # expired while the host was away, and no other run claimed the stage
    claims.confirm(r, KEY, 30)
    assert r.get(KEY) == "gpu0@hostB task-1" and 0 < r.pttl(KEY) <= 30_000


def test_a_run_whose_claim_another_run_took_publishes_nothing(r, tmp_path):
    out = tmp_path / "depth.npz"
    first = save_npz(out, {"x": [1, 2, 3]})  # what the other host published
    write_marker(out, first)
    assert claims.acquire(r, KEY, "gpu0@hostB task-1", ttl_s=30) is None
    r.set(KEY, "gpu0@hostA task-1")  # hostB's claim lapsed while it was cut off; hostA took the stage over
    with pytest.raises(ClaimLost, match="gpu0@hostA"):
        save_npz(out, {"x": [9, 9, 9]}, fence=lambda: claims.confirm(r, KEY, 30))
    assert read_marker(out)["sha256"] == first  # hostA's output and marker untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["depth.npz", "depth.npz.done.json"]  # no temporary left
    assert r.get(KEY) == "gpu0@hostA task-1"


def test_a_run_that_cannot_reach_redis_publishes_nothing_and_retries(r, tmp_path):
    assert claims.acquire(r, KEY, "gpu0@hostB task-1", ttl_s=30) is None
    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    out = tmp_path / "depth.npz"
    with pytest.raises(ClaimUnconfirmed):
        save_npz(out, {"x": [1]}, fence=lambda: claims.confirm(unreachable, KEY, 30))
    assert list(tmp_path.iterdir()) == []


def test_temporaries_of_a_writer_that_died_are_cleared_and_nothing_else(tmp_path):
    from tasks.outputs.storage import clear_temporaries

    out = tmp_path / "depth.npz"
    (tmp_path / ".depth.npz.1a2b3c4d.tmp").write_bytes(b"torn")  # a host killed mid-write
    (tmp_path / ".tracks.npz.1a2b3c4d.tmp").write_bytes(b"another stage's")
    save_npz(out, {"x": [1]})
    assert clear_temporaries(out) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tracks.npz.1a2b3c4d.tmp", "depth.npz"]
