"""A root a user names by URL: its bucket checked before anything is sent, then opened as its mirror folder.

The checks name the bucket, what went wrong and the fix: a bucket that does not exist, credentials it refuses,
an endpoint that does not answer (tasks.outputs.remote says how the folder stands for the bucket).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tasks.outputs.remote import BucketUnreachable, filesystem, is_url, mirror_of, pull, split_url


def check_reachable(url: str) -> None:
    """Raise BucketUnreachable, naming the bucket and the fix, unless ``url``'s bucket answers to these credentials."""
    scheme, bucket, _ = split_url(url)
    endpoint = os.environ.get("AWS_ENDPOINT_URL") if scheme == "s3" else None
    where = f" at {endpoint}" if endpoint else ""
    try:
        filesystem(url).ls(bucket, refresh=True)
    except FileNotFoundError as exc:
        raise BucketUnreachable(
            f"bucket {bucket!r}{where} does not exist ({url}); create it (aws s3 mb {scheme}://{bucket}) or "
            "correct the URL"
        ) from exc
    except PermissionError as exc:
        raise BucketUnreachable(
            f"bucket {bucket!r}{where} refuses these credentials ({_reason(exc)}); set the store's credentials "
            "(for S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) to ones allowed to list, read "
            "and write it"
        ) from exc
    except BucketUnreachable:
        raise
    except Exception as exc:
        raise BucketUnreachable(
            f"bucket {bucket!r}{where} does not answer ({_reason(exc)}); check the network, or AWS_ENDPOINT_URL "
            "for MinIO or another S3-compatible store"
        ) from exc


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def open_root(text: str, data: bool = False) -> Path:
    """The folder to work in for a root given by a user: itself when local; for a URL, its mirror, checked
    reachable and pulled (``data``: with the dataset files)."""
    if not is_url(text):
        return Path(text)
    check_reachable(text)
    folder = mirror_of(text)
    folder.mkdir(parents=True, exist_ok=True)
    pull(folder, data=data)
    return folder


def root_arg(text: str) -> Path:
    """argparse type of a folder argument that may be an object-store URL (module doc)."""
    try:
        return open_root(text)
    except BucketUnreachable as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def data_root_arg(text: str) -> Path:
    """As root_arg, with the dataset files fetched (for commands that read every one)."""
    try:
        return open_root(text, data=True)
    except BucketUnreachable as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
