"""Object-store emulators the tests start on 127.0.0.1: a GCS emulator (gcp-storage-emulator,
in this process) and Azurite (npm, installed by scripts/setup.sh into .tools/), each behind
a small client that puts, lists and deletes objects."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.readback import files_under
from tests.helpers.servers import free_port, moto_server

__all__ = ["AZURITE_KEY", "Store", "azurite", "gcs_emulator", "moto_store", "object_store"]

REPO = Path(__file__).resolve().parents[2]
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass
class Store:
    """One emulated bucket: its scheme, name, the environment that points clients at it."""

    scheme: str
    bucket: str
    env: dict[str, str]
    client: Any

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        if self.scheme == "s3":
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        elif self.scheme == "gs":
            self.client.bucket(self.bucket).blob(key).upload_from_string(data)
        else:
            self.client.get_container_client(self.bucket).upload_blob(key, data, overwrite=True)

    def names(self) -> list[str]:
        if self.scheme == "s3":
            out = self.client.list_objects_v2(Bucket=self.bucket).get("Contents", [])
            return sorted(o["Key"] for o in out)
        if self.scheme == "gs":
            return sorted(b.name for b in self.client.list_blobs(self.bucket))
        return sorted(b.name for b in self.client.get_container_client(self.bucket).list_blobs())

    def get(self, key: str) -> bytes:
        if self.scheme == "s3":
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        if self.scheme == "gs":
            return bytes(self.client.bucket(self.bucket).blob(key).download_as_bytes())
        cc = self.client.get_container_client(self.bucket)
        return bytes(cc.download_blob(key).readall())

    def upload_dir(self, folder: Path, prefix: str) -> None:
        for path, rel in files_under(folder):  # the sample indexes in .index/ too
            self.put(f"{prefix}/{rel}", path.read_bytes())

    def clear(self) -> None:
        for key in self.names():
            if self.scheme == "s3":
                self.client.delete_object(Bucket=self.bucket, Key=key)
            elif self.scheme == "gs":
                self.client.bucket(self.bucket).blob(key).delete()
            else:
                self.client.get_container_client(self.bucket).delete_blob(key)


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within 60 s")


@contextlib.contextmanager
def gcs_emulator(bucket: str = "shardkit-test") -> Iterator[Store]:
    """gcp-storage-emulator in a thread; yields a :class:`Store` on one bucket."""
    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
    try:
        with _env(env):
            _wait_port(port, None, "the GCS emulator")
            client = storage.Client(project="shardkit", credentials=AnonymousCredentials())
            yield Store("gs", bucket, env, client)
    finally:
        server.stop()


def azurite_binary() -> str:
    """The azurite-blob that scripts/setup.sh installed (or one on PATH)."""
    local = REPO / ".tools" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    found = shutil.which("azurite-blob")
    if found is None:
        raise RuntimeError("azurite-blob not found: run scripts/setup.sh (it installs it with npm)")
    return found


@contextlib.contextmanager
def azurite(container: str = "shardkit-test") -> Iterator[Store]:
    """Azurite's blob service in a process of its own; yields a :class:`Store`."""
    from azure.storage.blob import BlobServiceClient

    port = free_port()
    work = tempfile.mkdtemp(prefix="azurite-")
    cmd = [azurite_binary(), "--blobHost", "127.0.0.1", "--blobPort", str(port)]
    cmd += ["--location", work, "--silent", "--skipApiVersionCheck", "--disableTelemetry"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    conn = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )
    env = {"AZURE_STORAGE_CONNECTION_STRING": conn}
    try:
        with _env(env):
            _wait_port(port, proc, "azurite")
            client = BlobServiceClient.from_connection_string(conn)
            client.create_container(container)
            yield Store("az", container, env, client)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _env(env: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def moto_store(bucket: str = "shardkit-test") -> Iterator[Store]:
    """moto's S3 server; the environment points boto3 at it (``AWS_ENDPOINT_URL``)."""
    import boto3

    with moto_server() as endpoint:
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        with _env(env):
            client = boto3.client("s3", endpoint_url=endpoint)
            client.create_bucket(Bucket=bucket)
            yield Store("s3", bucket, env, client)


def object_store(scheme: str) -> contextlib.AbstractContextManager[Store]:
    """The emulated store of ``scheme`` (``s3``, ``gs``, ``az``)."""
    return {"s3": moto_store, "gs": gcs_emulator, "az": azurite}[scheme]()
