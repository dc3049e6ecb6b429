"""Statistics are values that add: any order and grouping equals one float64 NumPy pass."""

from __future__ import annotations

import json
import os
from functools import reduce

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.statistics.stats import Moments, VideoStats, normalization_stats, pool_rows, to_row, write_stats_yaml

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@st.composite
def parts(draw: st.DrawFn, dim: int = 3) -> list[np.ndarray]:
    """Some sample arrays (n_i, dim), empty ones included."""
    sizes = draw(st.lists(st.integers(0, 6), min_size=1, max_size=6))
    row = st.lists(finite, min_size=dim, max_size=dim)
    return [np.array(draw(st.lists(row, min_size=n, max_size=n))).reshape(n, dim) for n in sizes]


def assert_matches_numpy(m: Moments, chunks: list[np.ndarray]) -> None:
    x = np.concatenate(chunks).astype(np.float64)
    assert m.count == len(x)
    if len(x) == 0:
        assert m.mean.tolist() == [0.0] * m.dim and m.std.tolist() == [0.0] * m.dim
        return
    # Rounding in both computations is about eps * max|x|; 1e-12 * scale leaves a wide margin.
    scale = 1.0 + float(np.abs(x).max())
    np.testing.assert_allclose(m.mean, np.mean(x, axis=0), rtol=1e-9, atol=1e-12 * scale)
    np.testing.assert_allclose(m.std, np.std(x, axis=0), rtol=1e-9, atol=1e-12 * scale)


@settings(max_examples=150, deadline=None)
@given(parts(), st.randoms(use_true_random=False))
def test_merge_is_order_and_grouping_independent(chunks: list[np.ndarray], rnd) -> None:
    moments = [Moments.from_samples(c) for c in chunks]
    left_fold = sum(moments, start=Moments.empty(3))
    right_fold = reduce(lambda acc, m: m + acc, reversed(moments), Moments.empty(3))
    shuffled = moments[:]
    rnd.shuffle(shuffled)
    cut = rnd.randint(0, len(shuffled))
    grouped = sum(shuffled[:cut], start=Moments.empty(3)) + sum(shuffled[cut:], start=Moments.empty(3))
    for m in (left_fold, right_fold, grouped):
        assert_matches_numpy(m, chunks)


@settings(max_examples=50, deadline=None)
@given(st.lists(finite, min_size=0, max_size=20))
def test_one_feature_samples_as_a_flat_array(values: list[float]) -> None:
    x = np.array(values, dtype=np.float64)
    m = Moments.from_samples(x)
    assert m.dim == 1
    assert_matches_numpy(m, [x.reshape(-1, 1)])


def test_empty_moments_are_the_identity_of_addition() -> None:
    m = Moments.from_samples(np.array([[1.0, 2.0], [3.0, 5.0]]))
    for total in (m + Moments.empty(2), Moments.empty(2) + m):
        assert total.count == 2 and total.mean.tolist() == [2.0, 3.5] and total.std.tolist() == [1.0, 1.5]
    assert (Moments.empty(2) + Moments.empty(2)).count == 0
    with pytest.raises(ValueError, match="2 and 3 features"):
        _ = m + Moments.empty(3)


def test_dict_round_trip_is_json_safe_and_exact() -> None:
    rng = np.random.default_rng(1)
    stats = VideoStats(
        "3d",
        Moments.from_samples(rng.normal(size=(50, 3))),
        Moments.from_samples(rng.uniform(0.1, 2.5, 100)),
        Moments.from_samples(rng.normal(size=(20, 9))),
        Moments.from_samples(rng.normal(size=(10, 3))),
        Moments.from_samples(rng.normal(size=(10, 6))),
    )
    back = VideoStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    for name in ("displacement", "depth", "pose", "hand_uvd", "hand_rot"):
        a, b = getattr(stats, name), getattr(back, name)
        assert a.count == b.count and a.mean.tolist() == b.mean.tolist() and a.m2.tolist() == b.m2.tolist()


def test_video_stats_sum_with_start() -> None:
    parts_ = [VideoStats("3d", Moments.from_samples(np.full((2, 3), float(i)))) for i in range(3)]
    total = sum(parts_, start=VideoStats.empty("3d"))
    assert total.displacement.count == 6 and total.displacement.mean.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="3d and 2d"):
        _ = total + VideoStats.empty("2d")


@settings(max_examples=100, deadline=None)
@given(parts())
def test_pooling_many_videos_at_once_equals_one_numpy_pass(chunks: list[np.ndarray]) -> None:
    videos = [VideoStats("3d", Moments.from_samples(c), pose=Moments.from_samples(np.tile(c, 3))) for c in chunks]
    pooled = VideoStats.pool([json.loads(json.dumps(v.to_dict())) for v in videos], "3d")
    assert_matches_numpy(pooled.displacement, chunks)
    assert_matches_numpy(pooled.pose, [np.tile(c, 3) for c in chunks])
    assert pooled.hand_uvd.count == 0 and pooled.depth.count == 0


@settings(max_examples=100, deadline=None)
@given(parts())
def test_pooling_rows_gives_the_bits_of_pooling_the_partials(chunks: list[np.ndarray]) -> None:
    # The statistics callback pools rows (from Redis or markers); they must not move a single bit.
    videos = [VideoStats("3d", Moments.from_samples(c), pose=Moments.from_samples(np.tile(c, 3))) for c in chunks]
    dicts = [json.loads(json.dumps(v.to_dict())) for v in videos]
    rows = np.stack([to_row(d, "3d") for d in dicts]) if dicts else np.zeros((0, 49))
    by_rows, by_dicts = pool_rows(rows, "3d").to_dict(), VideoStats.pool(dicts, "3d").to_dict()
    assert json.dumps(by_rows) == json.dumps(by_dicts)
    assert_matches_numpy(pool_rows(rows, "3d").displacement, chunks)


def test_pooling_no_videos_and_refusing_another_track_type() -> None:
    assert pool_rows(np.zeros((0, 47)), "2d").displacement.dim == 2
    with pytest.raises(ValueError, match="3d and 2d"):
        to_row(VideoStats.empty("2d").to_dict(), "3d")
    assert VideoStats.pool([], "2d").displacement.dim == 2
    with pytest.raises(ValueError, match="3d and 2d"):
        VideoStats.pool([VideoStats.empty("2d").to_dict()], "3d")


def test_normalization_stats_keys_and_no_sample_defaults() -> None:
    empty3 = normalization_stats(VideoStats.empty("3d"))
    assert set(empty3) == {
        "imagenet_mean",
        "imagenet_std",
        "track_type",
        "track_dim",
        "displacement_mean",
        "displacement_std",
        "displacement_num_samples",
        "depth_mean",
        "depth_std",
        "depth_num_samples",
        "pose_mean",
        "pose_std",
        "pose_num_samples",
    }
    assert empty3["displacement_mean"] == [0.0] * 3 and empty3["displacement_std"] == [1.0] * 3
    assert empty3["depth_mean"] == 0.0 and empty3["depth_std"] == 1.0 and empty3["pose_std"] == [1.0] * 9
    assert empty3["imagenet_mean"] == [0.485, 0.456, 0.406] and empty3["imagenet_std"] == [0.229, 0.224, 0.225]
    empty2 = normalization_stats(VideoStats.empty("2d"))
    assert empty2["track_dim"] == 2 and "depth_mean" not in empty2 and "pose_mean" not in empty2
    with_hands = VideoStats.empty("3d") + VideoStats(
        "3d",
        Moments.empty(3),
        hand_uvd=Moments.from_samples(np.zeros((10, 3))),
        hand_rot=Moments.from_samples(np.tile([1.0, 0, 0, 0, 1, 0], (10, 1))),
    )
    out = normalization_stats(with_hands)
    assert out["hand_pose_num_samples"] == 10 and out["hand_rot_disp_mean"] == [1.0, 0, 0, 0, 1, 0]
    assert out["hand_uvd_disp_std"] == [0.0] * 3
    assert all(type(v) is float for v in out["hand_rot_disp_std"])


def test_write_stats_yaml_is_sorted_block_style_and_atomic(tmp_path) -> None:
    path = tmp_path / "normalization_stats.yaml"
    path.write_text("old")
    stats = normalization_stats(VideoStats("3d", Moments.from_samples(np.arange(9.0).reshape(3, 3))))
    write_stats_yaml(path, stats)
    text = path.read_text()
    assert "track_type: '3d'\n" in text and "displacement_mean:\n- 3.0\n- 4.0\n- 5.0\n" in text
    keys = [line.split(":")[0] for line in text.splitlines() if not line.startswith("-")]
    assert keys == sorted(keys)
    assert yaml.safe_load(text) == stats
    assert os.listdir(tmp_path) == ["normalization_stats.yaml"]  # no temporary file left behind


def test_write_stats_yaml_gives_the_mode_of_a_plain_write(tmp_path) -> None:
    stats = normalization_stats(VideoStats.empty("3d"))
    for umask in (0o022, 0o077, 0o002):
        old = os.umask(umask)
        try:
            write_stats_yaml(tmp_path / "normalization_stats.yaml", stats)
            (tmp_path / "plain.txt").unlink(missing_ok=True)
            with open(tmp_path / "plain.txt", "w") as f:
                f.write("x")
        finally:
            os.umask(old)
        mode = (tmp_path / "normalization_stats.yaml").stat().st_mode & 0o777
        assert mode == (tmp_path / "plain.txt").stat().st_mode & 0o777 == 0o666 & ~umask


def test_float32_samples_are_pooled_in_float64() -> None:
    """The h5 stage hands over float32 windows; their moments are float64 (docs/contracts.md), not float32 sums."""
    x = np.random.default_rng(4).normal(3.0, 2.0, size=(5000, 3)).astype(np.float32)
    m, m64 = Moments.from_samples(x), Moments.from_samples(x.astype(np.float64))
    assert m.mean.dtype == m.m2.dtype == np.float64
    np.testing.assert_array_equal(m.mean, m64.mean)
    np.testing.assert_array_equal(m.m2, m64.m2)


def test_bad_partials_and_samples_are_refused_naming_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"\(n, d\) or \(n,\), got shape \(2, 2, 2\)"):
        Moments.from_samples(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match=r"one of \['2d', '3d'\], got '4d'"):
        VideoStats.empty("4d")
    part = VideoStats.empty("3d").to_dict()
    part["displacement"] = {"count": 1, "mean": [0.0, 0.0], "m2": [0.0, 0.0]}
    with pytest.raises(ValueError, match="displacement of a 3d partial must have 3 features, got 2"):
        to_row(part, "3d")
    part["displacement"] = {"count": 1, "mean": [0.0, 0.0, 0.0], "m2": [0.0, 0.0]}  # M2 one short
    with pytest.raises(ValueError, match="displacement of a 3d partial must have 3 features"):
        to_row(part, "3d")
    # 3d, y2r's default track type, where none is named
    assert VideoStats.empty().track_type == VideoStats.pool([]).track_type == "3d"


def test_a_2d_partial_round_trips_as_2d() -> None:
    stats = VideoStats("2d", Moments.from_samples(np.arange(6.0).reshape(3, 2)))
    back = VideoStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert back.track_type == "2d" and normalization_stats(back)["track_dim"] == 2
    _ = back + VideoStats.empty("2d")  # adds to its own kind


def y2r_pools(rng: np.random.Generator, hand_rows: list[int]) -> list[dict[str, list[np.ndarray]]]:
    """Per video, what y2r's writer pools (tests/y2r_oracle.py): displacement windows, depths, poses, hands."""
    return [
        {
            "disp": [rng.normal(0.0, 0.05, (10, 7, 3)) for _ in range(2)],
            "depth": [rng.uniform(0.1, 2.5, 40)],
            "pose": [rng.normal(size=(10, 9)) for _ in range(2)],
            "hand_uvd": [rng.normal(size=(n, 3))],
            "hand_rot": [rng.normal(size=(n, 6))],
        }
        for n in hand_rows
    ]


def partial_of(pools: dict[str, list[np.ndarray]]) -> dict:
    dims = {"disp": 3, "depth": 1, "pose": 9, "hand_uvd": 3, "hand_rot": 6}
    m = {k: Moments.from_samples(np.concatenate([p.reshape(-1, dims[k]) for p in v])) for k, v in pools.items()}
    return VideoStats("3d", m["disp"], m["depth"], m["pose"], m["hand_uvd"], m["hand_rot"]).to_dict()


@pytest.mark.parametrize("hand_rows", [[10, 10, 10, 10], [1, 0, 0, 0]], ids=["hands", "one hand sample"])
def test_normalization_stats_of_pooled_videos_equal_y2rs_over_all_their_samples(hand_rows: list[int]) -> None:
    from tests import y2r_oracle

    videos = y2r_pools(np.random.default_rng(sum(hand_rows)), hand_rows)
    ours = normalization_stats(pool_rows(np.stack([to_row(partial_of(v), "3d") for v in videos]), "3d"))
    theirs = y2r_oracle.float64_stats({k: [a for v in videos for a in v[k]] for k in videos[0]}, "3d")
    assert set(ours) == set(theirs) | {"imagenet_mean", "imagenet_std"}
    for key, want in theirs.items():
        if isinstance(want, str | int):
            assert ours[key] == want, key
        else:
            np.testing.assert_allclose(ours[key], want, rtol=1e-12, atol=1e-15, err_msg=key)


def test_write_stats_yaml_writes_each_header_line_as_a_comment(tmp_path) -> None:
    path = tmp_path / "normalization_stats.yaml"
    stats = normalization_stats(VideoStats.empty("2d"))
    write_stats_yaml(path, stats, ["run r1 of 3 videos", "framefleet 1.0"])
    text = path.read_text()
    assert text.startswith("# run r1 of 3 videos\n# framefleet 1.0\ndisplacement_mean:\n")
    assert yaml.safe_load(text) == stats
