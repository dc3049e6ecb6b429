#!/usr/bin/env python3
"""Our record formats against the standard ones, side by side in one sitting, on a million-video case each.

    python bench/formats.py [--videos 1000000] [--redis-videos 100000] [--work DIR] [--json OUT.json]

Claim it backs (docs/performance.md, "Our formats against the standard ones"): each format of ours is kept
only where the standard one misses a goal, by the amount shown here. For each format, the operation it serves,
timed once on files just written (in the page cache), and its size:

1. A run's outcomes (tasks.records.outcome_files): N lines in 16 segments with their index, as the
   finishing tasks leave them, in this version's form (JSON Lines, ``{"video_id": …, "status": …}`` first)
   and the earlier one (``id<TAB>{json}``): appended a line at a time (µs per video, on 20,000), the run's
   end read (every id and status), the report's (the fields of the low_quality videos and of 400 wanted
   ones), ``--continue``'s (each video's fields by id), a user's "which videos failed", by our readers,
   pyarrow.json and DuckDB; an Arrow IPC stream with a batch per video (what appending one video at a time
   makes of it) and Parquet (one file written from the lines by the run's end: the one writer there is).
   SQLite and Parquet-per-video are ruled out: many processes on many hosts append over a shared OUT.
2. The manifest (tasks.records.manifest): N entries as an enqueue writes them, against JSON Lines, Parquet
   and SQLite (one writer, the enqueuer): the write, the read in order (``--continue``'s merge), every id
   (the report's table), the failed ones (a user's query).
3. OUT/markers/partials.bin (tasks.statistics.partials): N entries of the real row width, against an
   Arrow IPC file and Parquet: the full pass's write, the read into entries by video id (the statistics'
   and ``--continue``'s read), size.
4. A run's pending jobs in Redis (tasks.run.pending): N videos in zlib chunks of 256 against plain JSON
   chunks and Arrow IPC chunks (zstd): Redis memory per held video, the encode, one chunk's decode.
5. Outcomes in Redis (tasks.records.outcomes): ``--redis-videos`` outcomes deflated against the run's
   preset dictionary against compact JSON, zlib and zstd without a dictionary: Redis memory per outcome
   (a hash field each: the figure per outcome does not depend on their number), encode and decode.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.modes_queue import private_redis  # noqa: E402
from bench.simulated import earlier_line, sharded_path  # noqa: E402

SEGMENTS = 16  # worker processes whose segments hold the run's lines (bench/scale.py's)
APPENDS = 20_000  # lines appended one at a time for the per-video cost
RUN = "20261128T000000-bench"
SIZE = struct.Struct("<I")  # a zstd value's inflated size, which pyarrow's codec asks for
ROWS: list[dict[str, Any]] = []


def record(
    fmt: str, variant: str, operation: str, seconds: float | None, size: int | None = None, note: str = ""
) -> None:
    row = {"format": fmt, "variant": variant, "operation": operation, "s": seconds, "bytes": size, "note": note}
    ROWS.append(row)
    took = "" if seconds is None else f"{seconds:.3f} s"
    print(f"{fmt:<9} {variant:<26} {operation:<34} {took:>10} {'' if size is None else size:>12} {note}", flush=True)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn`` took, and what it gave; the case already built is left out of the collector's passes
    (a million videos' objects would otherwise be walked by each pass the timed code triggers)."""
    gc.freeze()
    start = time.perf_counter()
    found = fn()
    return time.perf_counter() - start, found


def status_of(i: int) -> str:
    """94 % done, 3 % low_quality, 3 % failed, spread through the run."""
    k = (i * 7919) % 100
    return "failed" if k < 3 else "low_quality" if k < 6 else "done"


def found_of(i: int, vid: str) -> dict[str, Any]:
    """What a finishing task hands tasks.records.outcome_files.fields_of: quality per stage, provenance."""
    r = ((i * 104729) % 1000) / 1000
    quality = {
        "hands": {"left_frame_fraction": round(0.5 + r / 3, 4), "left_confidence": round(0.7 + r / 5, 4),
                  "right_frame_fraction": round(0.6 + r / 4, 4), "right_confidence": round(0.75 + r / 6, 4),
                  "any_frame_fraction": round(0.8 + r / 7, 4), "confidence": round(0.72 + r / 5, 4)},
        "depth": {"valid_fraction": round(0.9 + r / 20, 4), "median_m": round(1 + r, 3)},
        "tracks": {"points": 1024, "visible_fraction": round(0.6 + r / 3, 4), "windows": 12},
        "masks": {"frames": 150, "object_fraction": round(0.3 + r / 4, 4)},
    }  # fmt: skip
    return {
        "quality": quality,
        "shortfalls": [{"field": "hands.confidence", "value": 0.41, "minimum": 0.5}],
        "provenance": {
            "backends": {"masks": "sam3", "depth": "vipe", "tracks": "tapip3d", "hands": "wilor", "h5": "y2r"},
            "settings_sha256": "5f1c" * 16,
            "framefleet": {"version": "0.9.0+g" + "af7f92b"},
            "source": {"sha256": f"{i:064x}"[::-1], "bytes": 100_000 + i, "path": vid + ".mp4"},
            "run_id": RUN,
        },
    }


def ids(n: int) -> list[str]:
    from tasks.run.dataset import video_id_of

    return [video_id_of(sharded_path(i)) for i in range(n)]


# 1. A run's outcomes.

NOW, BEFORE = "JSON Lines (now)", "id TAB json (before)"


def outcome_case(n: int, work: Path, vids: list[str]) -> tuple[Path, Path]:
    """OUT with an enqueued manifest of ``n`` videos and the run's ended outcomes (this version's lines), and a
    folder of the same outcomes in the earlier form; each segment with its index."""
    from tasks.records import lineage, manifest, outcome_files, outcome_index

    out, before = work / "out", work / "before"
    shutil.rmtree(work, ignore_errors=True)
    (out / manifest.PARTS).mkdir(parents=True)
    entries = [{"video_id": v, "path": sharded_path(i), "bytes": 0, "text": "", "noun": ""} for i, v in enumerate(vids)]
    entries.sort(key=manifest.sort_key)
    lineage.write(out, {"dataset_root": "/raw", "last_run": RUN, "order": manifest.ORDER, "roots": ["/raw"]}, entries)
    del entries
    now = manifest.outcomes_path(out, RUN)
    for folder, line_of in ((now, outcome_files.line_of), (before, earlier_line)):
        folder.mkdir(parents=True)
        for k in range(SEGMENTS):
            texts = [line_of(vids[i], status_of(i), found_of(i, vids[i])) for i in range(k, n, SEGMENTS)]
            name = f"bench-{k}-0000{k:04x}"
            (folder / (name + manifest.SEGMENT)).write_text("".join(texts))
            (folder / (name + outcome_index.INDEX)).write_text(outcome_index.index_of(texts))
    return out, before


def size_of(folder: Path, suffix: str) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.endswith(suffix))


def appends(work: Path, vids: list[str]) -> None:
    """A line at a time, as the finishing tasks write them (tasks.records.outcome_files.append: the line, then its
    index row): this version's lines and the earlier form; and a batch of an Arrow IPC stream per video."""
    import pyarrow as pa

    from tasks.records import outcome_files

    count = min(APPENDS, len(vids))

    def lines(run: str) -> None:
        for i, v in enumerate(vids[:count]):
            outcome_files.append(work, run, v, status_of(i), found_of(i, v))

    took, _ = timed(lambda: lines("now"))
    record("outcomes", NOW + " + index", "append a video (µs)", took / count * 1e6)
    line_of = outcome_files.line_of
    outcome_files.line_of = earlier_line  # type: ignore[assignment]
    try:
        took, _ = timed(lambda: lines("before"))
    finally:
        outcome_files.line_of = line_of  # type: ignore[assignment]
    record("outcomes", BEFORE + " + index", "append a video (µs)", took / count * 1e6)
    schema = pa.schema([("video_id", pa.string()), ("status", pa.string()), ("fields", pa.string())])
    path = work / "p.arrows"

    def arrow() -> None:
        for i, v in enumerate(vids[:count]):
            status = status_of(i)
            fields = json.dumps(outcome_files.fields_of(status, found_of(i, v)))
            batch = pa.record_batch([[v], [status], [fields]], schema=schema)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
            try:
                head = schema.serialize().to_pybytes() if os.fstat(fd).st_size == 0 else b""
                os.write(fd, head + batch.serialize().to_pybytes())
            finally:
                os.close(fd)

    took, _ = timed(arrow)
    record("outcomes", "Arrow IPC stream, batch/video", "append a video (µs)", took / count * 1e6)
    with pa.ipc.open_stream(pa.OSFile(str(path))) as reader:
        assert reader.read_all().num_rows == count


def outcome_reads(out: Path, before: Path, work: Path, vids: list[str]) -> None:
    import duckdb
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    from tasks.records import manifest, outcome_files, outcome_index
    from tasks.report import quality_table

    n = len(vids)
    now = manifest.outcomes_path(out, RUN)
    record("outcomes", NOW, "size: lines", None, size_of(now, manifest.SEGMENT))
    record("outcomes", BEFORE, "size: lines", None, size_of(before, manifest.SEGMENT))
    record("outcomes", "index (either)", "size: index", None, size_of(now, outcome_index.INDEX))

    took, lines = timed(lambda: outcome_files.read(now))
    assert len(lines.status) == n
    record("outcomes", NOW + ": index", "run's end: ids, statuses", took)
    took, found = timed(lambda: outcome_files.read(before))
    assert found.status == lines.status
    record("outcomes", BEFORE + ": index", "run's end: ids, statuses", took)

    def scan(folder: Path) -> dict[str, str]:
        pairs: list[tuple[str, str]] = []
        for path in manifest.segments(folder):
            pairs += outcome_index.pairs(path.read_text())
        return dict(pairs)

    for name, folder in ((NOW, now), (BEFORE, before)):
        took, found = timed(lambda: scan(folder))  # noqa: B023
        assert found == lines.status
        record("outcomes", name + ": lines, no index", "run's end: ids, statuses", took)
    options = pj.ParseOptions(
        explicit_schema=pa.schema([("video_id", pa.string()), ("status", pa.string())]),
        unexpected_field_behavior="ignore",
    )

    def arrow_read() -> pa.Table:
        return pa.concat_tables(pj.read_json(p, parse_options=options) for p in manifest.segments(now))

    took, table = timed(arrow_read)
    assert table.num_rows == n
    record("outcomes", NOW + ": pyarrow.json", "run's end: ids, statuses", took)
    del table
    glob = str(now / "*.jsonl")
    con = duckdb.connect()
    took, count = timed(
        lambda: con.execute(
            f"SELECT count(DISTINCT video_id) FROM read_json('{glob}', "
            "columns={video_id: 'VARCHAR', status: 'VARCHAR'})"
        ).fetchall()[0]
    )
    record("outcomes", NOW + ": DuckDB", "run's end: ids, statuses", took, note=f"{count[0]} ids")

    wanted = quality_table.wanted(out, 200)
    took, kept = timed(lambda: outcome_files.read(now, wanted))
    assert kept.fields is not None
    record("outcomes", NOW + ": index", "report: fields kept", took, note=f"{len(kept.fields)} videos")
    took, kept = timed(lambda: outcome_files.read(before, wanted))
    assert kept.fields is not None
    record("outcomes", BEFORE + ": index", "report: fields kept", took, note=f"{len(kept.fields)} videos")
    picked = ",".join(f"'{v}'" for v in sorted(wanted))
    took, rows = timed(
        lambda: con.execute(
            f"SELECT video_id, quality FROM read_json('{glob}') WHERE status = 'low_quality' OR video_id IN ({picked})"
        ).fetchall()
    )
    record("outcomes", NOW + ": DuckDB", "report: fields kept", took, note=f"{len(rows)} videos")

    def recorded(folder: Path) -> int:
        found = manifest.Recorded(manifest.segments(folder))
        return sum(found.get(v) is not None for v in vids)

    for name, folder in ((NOW, now), (BEFORE, before)):
        took, count = timed(lambda: recorded(folder))  # noqa: B023
        assert count == n
        record("outcomes", name + ": manifest.Recorded", "--continue: each video's fields", took)

    command = [sys.executable, "-c", "import sys; from tasks.cli.main import main; sys.exit(main())"]
    command += ["videos", str(out), "--status", "failed"]
    took, done = timed(lambda: subprocess.run(command, capture_output=True, text=True, cwd=ROOT))
    failed = sum(1 for i in range(n) if status_of(i) == "failed")
    assert done.returncode == 0 and done.stdout.count("\n") == failed, done.stderr[-500:]
    record("outcomes", NOW + ": framefleet videos", "user: which failed", took, note=f"{failed} videos")
    # The loop `framefleet videos --status` ran before: every merged line parsed for its status.
    every = "import json, pathlib, sys; from tasks.records import manifest; out = pathlib.Path(sys.argv[1]); "
    every += "sys.stdout.writelines(line + '\\n' for line in manifest.lines(out) "
    every += "if json.loads(line).get('status') == 'failed')"
    took, done = timed(
        lambda: subprocess.run([sys.executable, "-c", every, str(out)], capture_output=True, text=True, cwd=ROOT)
    )
    assert done.returncode == 0 and done.stdout.count("\n") == failed, done.stderr[-500:]
    record("outcomes", NOW + ": every line parsed", "user: which failed", took, note="framefleet videos before")
    took, rows = timed(lambda: con.execute(f"SELECT video_id FROM '{glob}' WHERE status = 'failed'").fetchall())
    assert len(rows) == failed
    record("outcomes", NOW + ": DuckDB", "user: which failed", took)
    tabbed = str(before / "*.jsonl")
    took, rows = timed(
        lambda: con.execute(
            f"SELECT video_id FROM read_csv('{tabbed}', delim='\t', quote='', escape='', header=false, "
            "columns={video_id: 'VARCHAR', fields: 'VARCHAR'}) WHERE fields->>'status' = 'failed'"
        ).fetchall()
    )
    assert len(rows) == failed
    record("outcomes", BEFORE + ": DuckDB read_csv TAB", "user: which failed", took)

    parquet = work / "outcomes.parquet"

    def to_parquet() -> None:
        tables = [pj.read_json(p) for p in manifest.segments(now)]
        pq.write_table(pa.concat_tables(tables, promote_options="default"), parquet)

    took, _ = timed(to_parquet)
    record("outcomes", "Parquet (by the run's end)", "run's end: lines → Parquet", took, parquet.stat().st_size)
    took, table = timed(lambda: pq.read_table(parquet, columns=["video_id", "status"]))
    record("outcomes", "Parquet", "run's end: ids, statuses", took)
    took, rows = timed(lambda: con.execute(f"SELECT video_id FROM '{parquet}' WHERE status = 'failed'").fetchall())
    record("outcomes", "Parquet: DuckDB", "user: which failed", took)
    arrows = work / "outcomes.arrows"
    tab = pa.table({"video_id": list(lines.status), "status": list(lines.status.values())})
    tab = tab.append_column("fields", pa.array([json.dumps({"status": s}) for s in lines.status.values()]))
    with pa.ipc.new_stream(str(arrows), tab.schema) as writer:
        writer.write_table(tab, max_chunksize=1)  # a batch per video, as appending one at a time makes it
    per_batch = arrows.stat().st_size / n - sum(len(v) for v in lines.status) / n
    took, table = timed(lambda: pa.ipc.open_stream(pa.OSFile(str(arrows))).read_all())
    assert table.num_rows == n
    record("outcomes", "Arrow IPC stream, batch/video", "run's end: ids, statuses", took,
           note=f"{per_batch:.0f} B a video beyond its id and status fields")  # fmt: skip
    arrows.unlink()


# 2. The manifest.


def manifest_formats(out: Path, work: Path, vids: list[str]) -> None:
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.records import manifest

    n = len(vids)
    entries = list(manifest._own_lines(out))
    record("manifest", "ours: head + a line each", "size", None, (out / manifest.MANIFEST).stat().st_size)

    def ours_write() -> None:
        writer = manifest.Writer(work / "m-ours", {"dataset_root": "/raw", "roots": ["/raw"]})
        for line in entries:
            writer.add(json.loads(line))
        writer.commit()

    (work / "m-ours").mkdir()
    took, _ = timed(ours_write)
    record("manifest", "ours: head + a line each", "enqueue: write", took)
    took, count = timed(lambda: sum(1 for _ in manifest._own_lines(out)))
    record("manifest", "ours: head + a line each", "--continue: read in order", took)
    pattern = re.compile(r'\n\{"video_id": "([^"\\\n]*)"')
    took, found = timed(lambda: pattern.findall((out / manifest.MANIFEST).read_text()))
    assert len(found) == n
    record("manifest", "ours: head + a line each", "report: every id", took)

    jsonl = work / "manifest.jsonl"
    took, _ = timed(lambda: jsonl.write_text("".join(json.dumps(json.loads(line)) + "\n" for line in entries)))
    record("manifest", "JSON Lines", "enqueue: write", took, jsonl.stat().st_size)
    con = duckdb.connect()
    took, count = timed(lambda: con.execute(f"SELECT count(video_id) FROM '{jsonl}'").fetchall()[0])
    record("manifest", "JSON Lines: DuckDB", "report: every id", took)

    parquet = work / "manifest.parquet"

    def parquet_write() -> None:
        with pq.ParquetWriter(parquet, pa.Table.from_pylist([json.loads(entries[0])]).schema) as writer:
            for at in range(0, n, 65536):
                writer.write_table(pa.Table.from_pylist([json.loads(line) for line in entries[at : at + 65536]]))

    took, _ = timed(parquet_write)
    record("manifest", "Parquet", "enqueue: write", took, parquet.stat().st_size)

    def parquet_rows() -> int:
        return sum(len(batch.to_pylist()) for batch in pq.ParquetFile(parquet).iter_batches(65536))

    took, count = timed(parquet_rows)
    record("manifest", "Parquet", "--continue: read in order", took, note="rows as dicts")
    took, table = timed(lambda: pq.read_table(parquet, columns=["video_id"]))
    record("manifest", "Parquet", "report: every id", took)

    db = work / "manifest.sqlite"

    def sqlite_write() -> None:
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE videos (video_id TEXT PRIMARY KEY, path TEXT, entry TEXT)")
        rows = ((json.loads(line)["video_id"], json.loads(line)["path"], line) for line in entries)
        con.executemany("INSERT INTO videos VALUES (?, ?, ?)", rows)
        con.commit()
        con.close()

    took, _ = timed(sqlite_write)
    record("manifest", "SQLite", "enqueue: write", took, db.stat().st_size)
    lite = sqlite3.connect(db)
    took, count = timed(lambda: sum(1 for _ in lite.execute("SELECT entry FROM videos ORDER BY rowid")))
    record("manifest", "SQLite", "--continue: read in order", took)
    took, count = timed(lambda: len(lite.execute("SELECT video_id FROM videos").fetchall()))
    record("manifest", "SQLite", "report: every id", took)
    lite.close()
    user = "SELECT v.video_id FROM (SELECT unnest(videos) AS v FROM "
    user += f"read_json('{out / manifest.MANIFEST}', maximum_object_size=4000000000))"
    took, rows = timed(lambda: con.execute(user).fetchall())
    assert len(rows) == n
    record("manifest", "ours: DuckDB read_json whole", "user: every id", took)
    for path in (jsonl, parquet, db):
        path.unlink()
    shutil.rmtree(work / "m-ours")


# 3. OUT/markers/partials.bin.


def partials_formats(work: Path, vids: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    from tasks.statistics import partials

    width = partials.row_width("3d")
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((len(vids), width))
    entries = {
        v: partials.HEADER.pack(10_000_000 + i, 1_700_000_000_000_000_000 + i, b"3d") + rows[i].tobytes()
        for i, v in enumerate(vids)
    }
    out = work / "partials"
    took, _ = timed(lambda: partials.save(out, entries))
    record("partials", "ours: partials.bin", "full pass: write", took, partials.file_path(out).stat().st_size)
    took, found = timed(lambda: partials.read_file(out))
    assert found == entries
    record("partials", "ours: partials.bin", "statistics, --continue: read", took)
    head = struct.Struct("<qq2s")
    keys = sorted(entries)

    def table() -> pa.Table:
        sizes, mtimes, kinds, flat = [], [], [], []
        for v in keys:
            size, mtime, kind = head.unpack_from(entries[v])
            sizes.append(size)
            mtimes.append(mtime)
            kinds.append(kind.decode())
            flat.append(entries[v][head.size :])
        values = pa.array(np.frombuffer(b"".join(flat), dtype="<f8"))
        return pa.table({"video_id": keys, "bytes": sizes, "mtime_ns": mtimes, "kind": kinds,
                         "row": pa.FixedSizeListArray.from_arrays(values, width)})  # fmt: skip

    def back(t: pa.Table) -> dict[str, bytes]:
        block = t.column("row").combine_chunks().values.to_numpy().reshape(-1, width)
        sizes, mtimes, kinds = (t.column(c).to_pylist() for c in ("bytes", "mtime_ns", "kind"))
        return {
            v: head.pack(sizes[i], mtimes[i], kinds[i].encode()) + block[i].tobytes()
            for i, v in enumerate(t.column("video_id").to_pylist())
        }

    def measure(name: str, write: Callable[[pa.Table, Path], Any], read: Callable[[Path], pa.Table]) -> None:
        path = work / f"partials.{name.split()[0].lower()}"
        took, _ = timed(lambda: write(table(), path))
        record("partials", name, "full pass: write", took, path.stat().st_size)
        took, _ = timed(lambda: read(path))
        record("partials", name, "read: columns only", took)
        took, found = timed(lambda: back(read(path)))
        assert found == entries
        record("partials", name, "statistics, --continue: read", took, note="into entries by id")
        path.unlink()

    measure(
        "Arrow IPC file",
        lambda t, p: feather.write_feather(t, p, compression="uncompressed"),
        lambda p: feather.read_table(p, memory_map=True),
    )
    measure("Parquet", pq.write_table, pq.read_table)
    shutil.rmtree(out)


# 4. and 5. Redis-side.


def memory(r: Any) -> int:
    return int(r.info("memory")["used_memory"])


def pending_formats(url: str, vids: list[str]) -> None:
    import pyarrow as pa
    import redis

    from tasks.run import pending

    r = redis.Redis.from_url(url)
    parts = [[v, "/raw/" + sharded_path(i)] for i, v in enumerate(vids)]
    chunks = [parts[at : at + pending.CHUNK] for at in range(0, len(parts), pending.CHUNK)]
    ipc = pa.ipc.IpcWriteOptions(compression="zstd")

    def arrow_encode(chunk: list[list[str]]) -> bytes:
        batch = pa.record_batch([[p[0] for p in chunk], [p[1] for p in chunk]], names=["video_id", "video"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema, options=ipc) as writer:
            writer.write_batch(batch)
        return bytes(sink.getvalue().to_pybytes())

    def arrow_decode(value: bytes) -> list[list[str]]:
        t = pa.ipc.open_stream(value).read_all()
        return [list(row) for row in zip(*(t.column(c).to_pylist() for c in ("video_id", "video")), strict=True)]

    plain = (lambda c: json.dumps(c, separators=(",", ":")), lambda v: json.loads(v))
    for name, (encode, decode) in (
        ("ours: zlib JSON base64", (pending.encode, pending.decode)),
        ("plain JSON", plain),
        ("Arrow IPC, zstd", (arrow_encode, arrow_decode)),
    ):
        r.flushdb()
        before = memory(r)
        took, values = timed(lambda: [encode(c) for c in chunks])  # noqa: B023
        for at in range(0, len(values), 256):
            r.hset("pending", mapping={f"c{k}": values[k] for k in range(at, min(at + 256, len(values)))})
        used = memory(r) - before
        record("pending", name, "encode every chunk", took, used, note=f"{used / len(vids):.1f} B of Redis a video")
        sample = values[:: max(1, len(values) // 500)]
        took, _ = timed(lambda: [decode(v) for v in sample])  # noqa: B023
        assert decode(values[0]) == chunks[0]
        record("pending", name, "take: decode a chunk (µs)", took / len(sample) * 1e6)
    r.flushdb()


def outcome_redis_formats(url: str, vids: list[str]) -> None:
    import pyarrow as pa
    import redis

    from bench.simulated import realistic_outcome
    from tasks.records import outcomes

    r = redis.Redis.from_url(url)
    marker = {"report": {"quality": found_of(0, vids[0])["quality"], "provenance": found_of(0, vids[0])["provenance"]}}
    summary = {"started": 1_800_000_000.0, "stages": ["masks", "depth", "tracks", "hands", "h5"]}
    found = [realistic_outcome(marker, summary, v, i) for i, v in enumerate(vids)]
    zdict = outcomes.compact({k: v for k, v in found[0].items() if k != "video_id"})
    zstd = pa.Codec("zstd", compression_level=3)

    def deflated(value: bytes) -> bytes:
        packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict)
        return packer.compress(value) + packer.flush()

    def inflated(value: bytes) -> bytes:
        unpacker = zlib.decompressobj(-15, zdict)
        return unpacker.decompress(value) + unpacker.flush()

    variants: list[tuple[str, Callable[[bytes], bytes], Callable[[bytes], bytes]]] = [
        ("ours: zlib, preset dict", deflated, inflated),
        ("compact JSON", lambda v: v, lambda v: v),
        ("zlib, no dict", lambda v: zlib.compress(v, 9), zlib.decompress),
        ("zstd, no dict", lambda v: SIZE.pack(len(v)) + zstd.compress(v, asbytes=True),
         lambda v: zstd.decompress(v[4:], decompressed_size=SIZE.unpack_from(v)[0], asbytes=True)),
    ]  # fmt: skip
    for name, pack, unpack in variants:
        r.flushdb()
        before = memory(r)
        plain = [outcomes.compact({k: v for k, v in o.items() if k != "video_id"}) for o in found]
        took, values = timed(lambda: [pack(v) for v in plain])  # noqa: B023
        pipe = r.pipeline(transaction=False)
        for k, v in enumerate(vids):
            pipe.hset("finished", v, values[k])
            if k % 2000 == 1999:
                pipe.execute()
        pipe.execute()
        used = memory(r) - before
        record(
            "outcomes@r",
            name,
            "encode (µs a video)",
            took / len(vids) * 1e6,
            used,
            note=f"{used / len(vids):.0f} B of Redis a video",
        )
        took, back = timed(lambda: [json.loads(unpack(v)) for v in values])  # noqa: B023
        assert back[1] == json.loads(plain[1])
        record("outcomes@r", name, "decode (µs a video)", took / len(vids) * 1e6)
    r.flushdb()


def table_of(rows: list[dict[str, Any]]) -> Iterator[str]:
    yield "| format | variant | operation | seconds | bytes | note |"
    yield "|---|---|---|---|---|---|"
    for row in rows:
        s = "" if row["s"] is None else f"{row['s']:.3f}"
        size = "" if row["bytes"] is None else f"{row['bytes']:,}"
        yield f"| {row['format']} | {row['variant']} | {row['operation']} | {s} | {size} | {row['note']} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=1_000_000, help="videos of each file-side case")
    parser.add_argument("--redis-videos", type=int, default=100_000, help="outcomes kept in Redis (per-video figures)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ff-formats"))
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--skip", default="", help="sections to leave out: outcomes,manifest,partials,pending,redis")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    load = [os.getloadavg()]
    vids = ids(args.videos)
    work = args.work
    out, before = (
        outcome_case(args.videos, work, vids)
        if skip & {"outcomes", "manifest"} != {"outcomes", "manifest"}
        else (work, work)
    )
    if "outcomes" not in skip:
        appends(work, vids)
        outcome_reads(out, before, work, vids)
    if "manifest" not in skip:
        manifest_formats(out, work, vids)
    shutil.rmtree(work, ignore_errors=True)
    if "partials" not in skip:
        partials_formats(work, vids)
    load.append(os.getloadavg())
    with private_redis() as url:
        if "pending" not in skip:
            pending_formats(url, vids)
        if "redis" not in skip:
            outcome_redis_formats(url, vids[: args.redis_videos])
    load.append(os.getloadavg())
    shutil.rmtree(work, ignore_errors=True)
    print("\n".join(table_of(ROWS)))
    print(f"load average (1, 5, 15 min) at the start, after the files, at the end: {load}")
    if args.json:
        args.json.write_text(
            json.dumps({"videos": args.videos, "redis_videos": args.redis_videos, "load": load, "rows": ROWS}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
