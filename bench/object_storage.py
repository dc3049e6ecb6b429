"""What object storage costs a run: the same videos local to local, then s3:// to s3:// through moto's server on
this host (wall time, bytes in the bucket, S3 requests per video by method).

    python bench/object_storage.py [--videos 8] [--seconds 1.6]

Each run is `framefleet run` with one CPU and one gpu0 worker (synthetic backends); its wall time is the run's
own (run_summary.json's wall_s: enqueue to statistics). The requests are counted from the server's log (one line
a request). moto keeps objects in memory on loopback: this measures framefleet's requests, not a network.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "FRAMEFLEET_DEFAULT_BACKENDS": "synthetic"}
REQUEST = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) ')


def framefleet(*args: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "tasks.cli.main", *args], cwd=ROOT, env=env, check=True, capture_output=True)


def run(raw: str, out: str, summary: Path, env: dict[str, str]) -> float:
    framefleet("run", raw, "--out", out, "--cpu-workers", "1", "--gpu-workers", "1", env=env)
    return float(json.loads(summary.read_text())["wall_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.6, help="length of each sample video")
    args = parser.parse_args()
    import boto3

    from tasks.outputs import remote
    from tasks.redis_client import free_port

    work = Path(tempfile.mkdtemp(prefix="ff-objects-"))
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(work / "moto.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=log, stderr=log)
    env = {**ENV, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    env |= {"AWS_DEFAULT_REGION": "us-east-1", remote.CACHE_ENV: str(work / "objects")}
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        seconds = f"{args.seconds}-{args.seconds}"
        framefleet("sample", str(work / "raw"), "--videos", str(args.videos), "--seconds", seconds, env=env)
        raw_bytes = sum(p.stat().st_size for p in (work / "raw").iterdir())
        local_s = run(str(work / "raw"), str(work / "out"), work / "out" / "run_summary.json", env)
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                          aws_secret_access_key="bench")  # fmt: skip
        s3.create_bucket(Bucket="bench")
        for video in sorted((work / "raw").iterdir()):
            s3.upload_file(str(video), "bench", f"raw/{video.name}")
        before = Counter(REQUEST.findall((work / "moto.log").read_text(errors="replace")))
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_") or k == remote.CACHE_ENV})
        mirror = remote.mirror_of("s3://bench/out")
        s3_s = run("s3://bench/raw", "s3://bench/out", mirror / "run_summary.json", env)
        requests = Counter(REQUEST.findall((work / "moto.log").read_text(errors="replace"))) - before
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix="out/")
        out_bytes = sum(o["Size"] for page in pages for o in page.get("Contents", []))
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    n = args.videos
    print(f"{n} videos of {args.seconds} s; raw {raw_bytes / 1e6:.1f} MB")
    print(f"wall (enqueue to statistics): local {local_s:.1f} s, s3 {s3_s:.1f} s ({s3_s / local_s:.2f}x)")
    print(f"bytes: {raw_bytes / n / 1e3:.0f} KB fetched and {out_bytes / n / 1e3:.0f} KB published per video")
    per = ", ".join(f"{method} {count / n:.1f}" for method, count in sorted(requests.items()))
    print(f"requests per video: {sum(requests.values()) / n:.1f} ({per})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
