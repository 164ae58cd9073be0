"""An S3-protocol server on 127.0.0.1 for tests: moto's standalone server (an emulator of S3, not S3).

``ThreadedMotoServer`` is moto's real HTTP server (werkzeug) run in a thread of the test
process, bound to 127.0.0.1 at a port the kernel picks; s3fs (aiobotocore) talks to it over
HTTP like to any S3 endpoint, and so can a subprocess (``reassemble ...``) given :attr:`S3Bucket.env`.

Fixtures (import them into a test module and list them in its ``__all__``):

* ``s3_endpoint`` (module scope): the server's URL, ``http://127.0.0.1:PORT``; stopped after the module.
* ``s3_store_url`` (function scope): a fresh, empty bucket on that server, as an :class:`S3Bucket`:
  ``url`` (``s3://bucket/payloads``), ``options`` for ``open_store(url, **options)``/``FsspecStore``,
  ``env`` for a subprocess, and ``client()`` for a plain boto3 client to look behind the store.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
_buckets = itertools.count()


class S3Bucket(NamedTuple):
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str
    url: str  # s3://<bucket>/payloads

    @property
    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``open_store``/``FsspecStore``: s3fs pointed at the emulator."""
        return {
            "endpoint_url": self.endpoint,
            "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"region_name": CREDENTIALS["AWS_DEFAULT_REGION"]},
            "skip_instance_cache": True,  # a fresh s3fs instance: no listing cached by another test
        }

    @property
    def env(self) -> dict[str, str]:
        """Environment for a subprocess using botocore's defaults (``AWS_ENDPOINT_URL`` names the server)."""
        return {**os.environ, **CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self) -> Any:
        """A boto3 S3 client on the emulator (to inspect or tamper with objects behind the store)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """One emulator per test module, on 127.0.0.1 at a free port; stopped after the module."""
    server_module = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_store_url(s3_endpoint: str) -> S3Bucket:
    """A new empty bucket on the module's emulator."""
    bucket = S3Bucket(s3_endpoint, f"test-{os.getpid()}-{next(_buckets)}", "")
    bucket.client().create_bucket(Bucket=bucket.bucket)
    return bucket._replace(url=f"s3://{bucket.bucket}/payloads")
