"""dpbert's read-only dashboard: the runs of an ML Metadata store as pages, plots and JSON.

Served by ``dpbert dashboard [--output DIR | --metadata PATH] [--host 127.0.0.1] [--port 8080]``
(``dpbert_cli/dashboard.py``).
Starlette (ASGI) + Jinja2 templates (autoescape on) + matplotlib (server-side SVG). The store is
opened READONLY, only GET/HEAD is routed, it binds 127.0.0.1 unless told otherwise, and it reads
custom properties only: it never opens an artifact's files, and of a private artifact (``private``
= 1: raw text, canary secrets) it shows only the type, the URI and the counts of units.

Public entry points (imported lazily so that ``dpbert --help`` needs no web dependency):
``create_app(metadata_path)``, ``serve(metadata_path, host, port)``.
"""
from __future__ import annotations

__all__ = ["create_app", "serve"]


def __getattr__(name):
    if name in ("create_app", "serve"):
        from dashboard import app

        return getattr(app, name)
    raise AttributeError(f"module 'dashboard' has no attribute {name!r}")
