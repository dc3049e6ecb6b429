"""Exactly-once outputs on real files: content hashes, atomic writes behind a fence, markers that notice an edit,
npz without pickles, paths confined to their root."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from tasks.errors import ClaimLost, PathOutsideRoot
from tasks.outputs.storage import (
    IF_TOUCHED,
    confine,
    load_npz,
    marker_path,
    read_marker,
    save_npz,
    sha256_file,
    write_marker,
    write_text_atomic,
)


def test_a_file_s_hash_covers_every_block_of_it(tmp_path):
    path = tmp_path / "big.bin"
    data = np.random.default_rng(0).bytes(3 * (1 << 20) + 17)  # more than one read block, and a partial one
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


@pytest.mark.timeout(30)
def test_arrays_round_trip_and_pickles_are_refused(tmp_path):
    out = tmp_path / "depth.npz"
    arrays = {"depths": np.arange(12, dtype=np.float16).reshape(3, 4), "fps": np.float64(10.0)}
    digest = save_npz(out, arrays)
    assert digest == sha256_file(out)
    loaded = load_npz(out)
    assert sorted(loaded) == ["depths", "fps"] and loaded["depths"].dtype == np.float16
    np.testing.assert_array_equal(loaded["depths"], arrays["depths"])
    evil = tmp_path / "evil.npz"
    np.savez(evil, x=np.array([{"a": 1}], dtype=object))  # an object array is stored as a pickle
    with pytest.raises(ValueError, match="allow_pickle"):
        load_npz(evil)


def test_a_fence_that_refuses_leaves_neither_file_nor_marker(tmp_path):
    def lost() -> None:
        raise ClaimLost("another run holds the claim")

    out = tmp_path / "tracks.npz"
    with pytest.raises(ClaimLost):
        write_text_atomic(tmp_path / "note.txt", "x", fence=lost)
    digest = save_npz(out, {"x": np.zeros(3)})
    with pytest.raises(ClaimLost):
        write_marker(out, digest, fence=lost)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tracks.npz"]


def test_a_marker_names_its_file_with_sorted_keys_so_every_writer_writes_the_same_text(tmp_path):
    out = tmp_path / "tracks.npz"
    digest = save_npz(out, {"x": np.zeros(3)})
    write_marker(out, digest, report={"b": 1, "a": 2})
    text = marker_path(out).read_text()
    record = json.loads(text)
    assert record["file"] == "tracks.npz" and record["sha256"] == digest and record["bytes"] == out.stat().st_size
    assert text == json.dumps(record, sort_keys=True)


def test_a_marker_notices_an_edit_that_keeps_the_size_in_each_checking_mode(tmp_path):
    out = tmp_path / "hands.npz"
    write_marker(out, save_npz(out, {"x": np.zeros(8)}))
    for mode in (True, False, IF_TOUCHED):
        assert read_marker(out, check_hash=mode) is not None
    st = out.stat()
    edited = bytearray(out.read_bytes())
    edited[-30] ^= 0xFF  # inside the archive: same size
    out.write_bytes(bytes(edited))
    assert read_marker(out, check_hash=True) is None
    assert read_marker(out, check_hash=IF_TOUCHED) is None  # its mtime changed: hashed
    assert read_marker(out, check_hash=False) is not None  # trusts the size, by contract
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))  # the edit hid its mtime
    assert read_marker(out, check_hash=IF_TOUCHED) is not None  # not hashed: the cheap check it promises
    assert read_marker(out, check_hash=True) is None
    out.write_bytes(bytes(edited[:-1]))  # truncated: every mode sees the size
    assert all(read_marker(out, check_hash=mode) is None for mode in (True, False, IF_TOUCHED))


def test_a_path_that_leaves_its_root_is_refused(tmp_path):
    (tmp_path / "root" / "a").mkdir(parents=True)
    (tmp_path / "root" / "out").symlink_to(tmp_path)
    assert confine(tmp_path / "root", "a/b.mp4") == (tmp_path / "root" / "a" / "b.mp4").resolve()
    for bad in ("../x.mp4", "a/../../x.mp4", "out/x.mp4", str(tmp_path / "root" / "a")):
        with pytest.raises(PathOutsideRoot, match="absolute|leaves the root"):
            confine(tmp_path / "root", bad)
