#!/usr/bin/env bash
# Headless Chromium + chromedriver from Debian, for the dashboard's browser test
# (tests/dashboard/test_browser.py, marker `browser`). Idempotent and quick when both are there.
# Never fails the CI run: without them the two browser tests skip and say why (the only skips
# tests/skip_allowlist.txt allows: Chromium is a Debian package, outside the lock).
set -uo pipefail

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

if have; then
  echo "install-chromium: already installed: $(chromium --version 2>/dev/null | head -n1)"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "install-chromium: WARNING: not root and no sudo; the browser test will skip" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: WARNING: no apt-get (not Debian); the browser test will skip" >&2
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
APT=("${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=300 -y -q)
# Try with the package lists already on the machine first; refresh them only if that fails.
if ! "${APT[@]}" install chromium chromium-driver >/tmp/install-chromium.log 2>&1; then
  "${APT[@]}" update >>/tmp/install-chromium.log 2>&1 \
    && "${APT[@]}" install chromium chromium-driver >>/tmp/install-chromium.log 2>&1
fi
if have; then
  echo "install-chromium: installed: $(chromium --version 2>/dev/null | head -n1)"
else
  echo "install-chromium: WARNING: could not install chromium/chromium-driver; the browser test will skip" >&2
  tail -n 20 /tmp/install-chromium.log >&2 || true
fi
exit 0
