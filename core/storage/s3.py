"""Objects in an S3 bucket (AWS or any S3-compatible server) under an optional key prefix.

Credentials come from boto3's default chain (environment, profile, instance role).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, NoReturn
from urllib.parse import urlsplit

import boto3
import boto3.exceptions
import boto3.s3.transfer
import botocore.config
import botocore.exceptions
import pyarrow.fs

from core.storage.base import NotFound, ObjectInfo, StorageError, validate_key, validate_prefix

# An endpoint that hangs (a blackhole: nothing answers, nothing closes) holds a call for at
# most MAX_ATTEMPTS x (connect or read timeout): ~14 s, so a flush stalls that long before
# it retries and a search over Parquet answers 503 within it. The read timeout is the
# longest silence inside one response, not the transfer's length.
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0
MAX_ATTEMPTS = 2

_CLIENT_CONFIG = botocore.config.Config(
    # Path style works with every S3-compatible server and needs no wildcard DNS.
    s3={"addressing_style": "path"},
    connect_timeout=CONNECT_TIMEOUT_S,
    read_timeout=READ_TIMEOUT_S,
    retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
)
# Parquet files stay well under the multipart threshold; larger ones go up in parallel parts.
_TRANSFER_CONFIG = boto3.s3.transfer.TransferConfig(max_concurrency=4)
_MISSING_KEY = ("NoSuchKey", "404", "NotFound")
_MISSING_BUCKET = ("NoSuchBucket", "404", "NotFound")


class S3Storage:
    def __init__(self, endpoint: str, bucket: str, prefix: str, region: str) -> None:
        url = urlsplit(endpoint)
        if endpoint and (url.scheme not in ("http", "https") or not url.netloc):
            raise ValueError(f"S3 endpoint must be an http(s) URL, got {endpoint!r}")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        self.bucket = bucket
        self._prefix = prefix + "/" if prefix else ""
        self._endpoint = url
        self._region = region
        self._session = boto3.session.Session(region_name=region or None)
        self._client: Any = self._session.client(
            "s3", endpoint_url=endpoint or None, config=_CLIENT_CONFIG
        )
        self._arrow_lock = threading.Lock()
        self._arrow: tuple[tuple[str, str, str | None], pyarrow.fs.S3FileSystem] | None = None

    def _key(self, key: str) -> str:
        return self._prefix + validate_key(key)

    def put(self, key: str, data: bytes) -> None:
        full = self._key(key)
        try:
            self._client.put_object(Bucket=self.bucket, Key=full, Body=data)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            self._fail("put", full, exc)

    def put_file(self, key: str, path: str) -> None:
        full = self._key(key)
        try:
            self._client.upload_file(path, self.bucket, full, Config=_TRANSFER_CONFIG)
        except (
            botocore.exceptions.BotoCoreError,
            botocore.exceptions.ClientError,
            boto3.exceptions.S3UploadFailedError,
            OSError,
        ) as exc:
            self._fail(f"upload {path} to", full, exc)

    def get(self, key: str) -> bytes:
        full = self._key(key)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=full)
            body = response["Body"]
            try:
                data: bytes = body.read()
            finally:
                body.close()
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in ("NoSuchKey",):
                raise NotFound(key) from None
            self._fail("get", full, exc)
        except botocore.exceptions.BotoCoreError as exc:
            self._fail("get", full, exc)
        return data

    def head(self, key: str) -> ObjectInfo | None:
        full = self._key(key)
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=full)
        except botocore.exceptions.ClientError as exc:
            # HEAD answers carry no body, so a missing bucket also reads as a bare 404.
            if _code(exc) in _MISSING_KEY:
                return None
            self._fail("head", full, exc)
        except botocore.exceptions.BotoCoreError as exc:
            self._fail("head", full, exc)
        return ObjectInfo(key=key, size=int(response["ContentLength"]))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        full = self._prefix + validate_prefix(prefix)
        found: dict[str, int] = {}
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    found[obj["Key"][len(self._prefix) :]] = int(obj["Size"])
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            self._fail("list", full, exc)
        # Sorted here: S3 promises UTF-8 byte order, but SeaweedFS lists depth-first
        # ("a/b" before "a-b"), and Python's str order equals UTF-8 byte order.
        return iter([ObjectInfo(key=key, size=found[key]) for key in sorted(found)])

    def delete(self, key: str) -> None:
        full = self._key(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=full)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            self._fail("delete", full, exc)

    def check(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _MISSING_BUCKET:
                raise StorageError(f"S3 bucket {self.bucket!r} does not exist") from exc
            self._fail("reach bucket", "", exc)
        except botocore.exceptions.BotoCoreError as exc:
            self._fail("reach bucket", "", exc)

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing; HEAD first so a read-only role works too."""
        try:
            self.check()
            return
        except StorageError as exc:
            if not isinstance(exc.__cause__, botocore.exceptions.ClientError):
                raise
            if _code(exc.__cause__) not in _MISSING_BUCKET:
                raise
        args: dict[str, object] = {"Bucket": self.bucket}
        if self._region and self._region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": self._region}
        try:
            self._client.create_bucket(**args)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) != "BucketAlreadyOwnedByYou":
                self._fail("create bucket", "", exc)
        except botocore.exceptions.BotoCoreError as exc:
            self._fail("create bucket", "", exc)

    def arrow_filesystem(self) -> pyarrow.fs.FileSystem:
        credentials = self._session.get_credentials()
        if credentials is None:
            raise StorageError("no AWS credentials found (environment, profile or role)")
        frozen = credentials.get_frozen_credentials()
        identity = (frozen.access_key, frozen.secret_key, frozen.token)
        with self._arrow_lock:
            # Rebuilt only when boto3 has refreshed temporary credentials.
            if self._arrow is None or self._arrow[0] != identity:
                filesystem = pyarrow.fs.S3FileSystem(
                    access_key=frozen.access_key,
                    secret_key=frozen.secret_key,
                    session_token=frozen.token,
                    region=self._region or None,
                    scheme=self._endpoint.scheme or "https",
                    endpoint_override=self._endpoint.netloc or None,
                    connect_timeout=CONNECT_TIMEOUT_S,
                    request_timeout=READ_TIMEOUT_S,
                    retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(MAX_ATTEMPTS),
                )
                self._arrow = (identity, filesystem)
            return self._arrow[1]

    def arrow_path(self, key: str) -> str:
        return f"{self.bucket}/{self._key(key)}"

    def local_path(self, key: str) -> str | None:
        validate_key(key)
        return None

    def recover(self) -> None:
        # PutObject is atomic: S3 leaves no partial objects to clean up.
        pass

    def close(self) -> None:
        self._client.close()

    def _fail(self, action: str, full_key: str, exc: Exception) -> NoReturn:
        where = f"s3://{self.bucket}/{full_key}" if full_key else f"s3://{self.bucket}"
        if isinstance(exc, botocore.exceptions.ClientError):
            message = exc.response.get("Error", {}).get("Message", "")
            detail = f"{_code(exc)} {message}".strip()
        else:
            detail = str(exc)
        raise StorageError(f"cannot {action} {where}: {detail}") from exc


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
