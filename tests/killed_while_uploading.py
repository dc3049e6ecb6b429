"""A fault point: the worker dies by SIGKILL while it publishes a dataset file to an object store.

Loaded into a worker with ``celery -A tasks worker -I tests.killed_while_uploading``. FRAMEFLEET_TEST_KILL_AT
says where, the first time it comes in the process: ``upload``, with the file's parts sent and its multipart
upload not completed (the file is sent in parts, as a large one is); ``marker``, after the file is published
and before its completion marker is.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from s3fs.core import S3FileSystem

KILL_AT = os.environ.get("FRAMEFLEET_TEST_KILL_AT", "upload")
_put_file, _call_s3 = S3FileSystem._put_file, S3FileSystem._call_s3


def _die(where: str) -> None:
    print(f"fault point: killed {where}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


async def _put_file_in_parts(self: S3FileSystem, lpath: str, rpath: str, *args: Any, **kwargs: Any) -> Any:
    if KILL_AT == "upload" and rpath.endswith(".hdf5"):
        kwargs["chunksize"] = max(os.path.getsize(lpath) // 3, 1)
    return await _put_file(self, lpath, rpath, *args, **kwargs)


async def _call_s3_or_die(self: S3FileSystem, method: str, *args: Any, **kwargs: Any) -> Any:
    key = str(kwargs.get("Key", ""))
    if KILL_AT == "upload" and method == "complete_multipart_upload":
        _die(f"with the parts of {key} sent, before completing its upload")
    if KILL_AT == "marker" and method == "put_object" and key.endswith(".hdf5.done.json"):
        _die(f"after publishing the dataset file, before its marker {key}")
    return await _call_s3(self, method, *args, **kwargs)


S3FileSystem._put_file = _put_file_in_parts  # type: ignore[method-assign]
S3FileSystem._call_s3 = _call_s3_or_die  # type: ignore[method-assign]
