"""A minimal W3C WebDriver client over ``urllib`` for Debian's ``chromedriver`` + headless Chromium
(no selenium in the lock). Only what the browser test needs."""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any, List, Optional

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C web element identifier
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run",
                  "--disable-dev-shm-usage"]  # containers: a small /dev/shm crashes tabs


class WebDriverError(RuntimeError):
    def __init__(self, error: str, message: str):
        super().__init__(f"{error}: {message}")
        self.error = error


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_chromium() -> Optional[str]:
    """The Chromium binary itself (Debian's /usr/bin/chromium is a wrapper script)."""
    for path in ("/usr/lib/chromium/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if path and os.access(path, os.X_OK):
            return path
    return None


def find_chromedriver() -> Optional[str]:
    for path in (shutil.which("chromedriver"), "/usr/lib/chromium/chromedriver"):
        if path and os.access(path, os.X_OK):
            return path
    return None


def _request(method: str, url: str, body: Any = None, timeout: float = 60) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json; charset=utf-8"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        try:
            value = json.loads(err.read())["value"]
        except (ValueError, KeyError, TypeError):
            raise WebDriverError("http", f"{err.code} {err.reason}") from None
        raise WebDriverError(value.get("error", "unknown"), value.get("message", "")[:500]) from None


class Chrome:
    """chromedriver on a free loopback port and one headless Chromium session."""

    def __init__(self, chromedriver: str, chromium: str, user_data_dir: str, log_path: str,
                 width: int = 1300, height: int = 1000):
        self.port = free_port()
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([chromedriver, f"--port={self.port}"], stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        self.session: Optional[str] = None
        try:
            self._wait_ready()
            caps = {"browserName": "chrome", "pageLoadStrategy": "normal",
                    "goog:chromeOptions": {"binary": chromium, "args": CHROMIUM_FLAGS + [
                        f"--user-data-dir={user_data_dir}", f"--window-size={width},{height}"]}}
            value = _request("POST", self.base + "/session", {"capabilities": {"alwaysMatch": caps}})["value"]
            self.session = value["sessionId"]
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromedriver exited with {self.proc.returncode}")
            try:
                if _request("GET", self.base + "/status", timeout=2)["value"].get("ready"):
                    return
            except (OSError, WebDriverError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("chromedriver did not become ready in time")
            time.sleep(0.1)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        return _request(method, f"{self.base}/session/{self.session}{path}", body)["value"]

    # navigation and page state
    def get(self, url: str):
        self.call("POST", "/url", {"url": url})

    @property
    def url(self) -> str:
        return self.call("GET", "/url")

    @property
    def title(self) -> str:
        return self.call("GET", "/title")

    @property
    def source(self) -> str:
        return self.call("GET", "/source")

    def execute(self, script: str, *args) -> Any:
        return self.call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def alert_text(self) -> Optional[str]:
        try:
            return self.call("GET", "/alert/text")
        except WebDriverError as err:
            if err.error == "no such alert":
                return None
            raise

    # elements
    def find_all(self, css: str) -> List[str]:
        return [e[ELEMENT] for e in self.call("POST", "/elements", {"using": "css selector", "value": css})]

    def find(self, css: str) -> str:
        return self.call("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def text(self, element: str) -> str:
        return self.call("GET", f"/element/{element}/text")

    def prop(self, element: str, name: str) -> Any:
        return self.call("GET", f"/element/{element}/property/{name}")

    def click(self, element: str):
        self.call("POST", f"/element/{element}/click", {})

    # screenshots
    def screenshot(self, path: str, width: int = 1300, max_height: int = 6000) -> str:
        """A PNG of the whole page (the window is grown to the document's height first)."""
        height = int(self.execute("return document.documentElement.scrollHeight") or 1000)
        self.call("POST", "/window/rect", {"width": width, "height": min(max_height, height + 120)})
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.call("GET", "/screenshot")))
        return path

    def close(self):
        if self.session is not None:
            try:
                _request("DELETE", f"{self.base}/session/{self.session}", timeout=20)
            except (OSError, WebDriverError):
                pass
            self.session = None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
