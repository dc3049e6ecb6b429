"""A real S3 server for the tests: moto's standalone server (``moto_server``, the S3 HTTP API) on a free port.

It checks credentials (``INITIAL_NO_AUTH_ACTION_COUNT``: the first requests, which make the tests' IAM user
and its key, are the only ones it takes without), so a wrong key is refused as AWS refuses it; it enforces
``If-None-Match: *`` on PUT. It keeps nothing across a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tasks.redis_client import free_port
from tests.conftest import wait_until

SETUP_REQUESTS = 3  # create_user, create_access_key, put_user_policy: taken without credentials
REGION = "us-east-1"


@dataclass
class S3Server:
    """A running moto server: its endpoint, and the environment that points a process at it with a valid key."""

    endpoint: str
    env: dict[str, str]
    process: subprocess.Popen[bytes]

    def client(self, **overrides: str):  # type: ignore[no-untyped-def]
        import boto3

        keys = {
            "aws_access_key_id": self.env["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": self.env["AWS_SECRET_ACCESS_KEY"],
        }
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, **{**keys, **overrides})

    def bucket(self, name: str) -> str:
        """Make bucket ``name`` (if missing); return ``s3://name``."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def upload_folder(self, folder: Path, url: str) -> None:
        """Copy every file under ``folder`` to the prefix ``url`` (s3://bucket/prefix)."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        client = self.client()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}".lstrip("/"))

    def keys(self, url: str) -> dict[str, int]:
        """The objects under ``url`` (s3://bucket/prefix): key below the prefix -> bytes."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
        return {
            obj["Key"][len(prefix.rstrip("/")) + 1 :]: obj["Size"] for page in pages for obj in page.get("Contents", [])
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def running(logs: Path, cache: Path) -> Iterator[S3Server]:
    """Start moto's server on a free loopback port, make an IAM user with S3 rights and its key; stop it after."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    logs.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_REQUESTS)},
        stdout=open(logs / "moto.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = S3Server(endpoint, {}, process)
    try:
        wait_until(lambda: _answers(endpoint) or process.poll() is not None, 60, "moto's S3 server to answer")
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}: {(logs / 'moto.log').read_text()}")
        import boto3

        iam = boto3.client(
            "iam", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="setup", aws_secret_access_key="setup"
        )
        iam.create_user(UserName="framefleet-tests")
        key = iam.create_access_key(UserName="framefleet-tests")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="framefleet-tests", PolicyName="s3", PolicyDocument=json.dumps(policy))
        server.env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_DEFAULT_REGION": REGION,
            "FRAMEFLEET_OBJECT_CACHE": str(cache),
        }
        yield server
    finally:
        server.stop()
