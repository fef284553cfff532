"""``dpbert dashboard``: its argument parser and command (no web import until it runs: the web
dependencies are the ``dashboard`` extra)."""
from __future__ import annotations

import argparse
import errno
import os
import socket
from typing import Optional

from dpbert import exit_codes
from dpbert_cli.output import print_error

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def add_dashboard_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``dashboard`` subcommand to ``dpbert``'s subparsers."""
    p = subparsers.add_parser(
        "dashboard", help="serve the read-only dashboard of a run's ML Metadata store",
        description="Serve the runs, DAG, artifacts, privacy ledger and plots of an ML Metadata store "
                    "(read-only; binds 127.0.0.1 unless --host says otherwise).")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--output", help="the run's output directory (default demo_output)")
    where.add_argument("--metadata", help="path of the ML Metadata sqlite store (instead of --output)")
    where.add_argument("--pipeline-root", metavar="URI",
                       help="read the runs from a pipeline root's executor_output.json files (Vertex AI's "
                            "gs://…, a kubeflow.local_v2 rehearsal's folder) instead of an ML Metadata store")
    p.add_argument("--ledger", metavar="URI",
                   help="a dataset's privacy ledger (<ledger folder>/<dataset id>.json, local or gs://) shown at "
                        "/dataset: every run on the dataset and its composed ε against the pinned budget "
                        "(a run's page links to its own dataset's)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help="address to listen on (default 127.0.0.1; anything else exposes the dashboard, "
                        "which has no authentication, to the network)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (default 8080)")
    p.set_defaults(func=cmd_dashboard)
    return p


def _port_refused(host: str, port: int) -> Optional[str]:
    """Why ``host:port`` cannot be listened on (in use, not allowed, unknown host), or None.

    A probe bind with SO_REUSEADDR, as uvicorn binds: a port in TIME_WAIT passes, one with a
    listener does not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        return f"--host {host}: cannot resolve it ({err.strerror})"
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    return f"port {port} on {host} is already in use (pick another with --port)"
                return f"cannot listen on {host}:{port} ({err.strerror})"
    return None


def _source(args):
    """(the store's path, the pipeline root): one of them, checked at start:
    what would make every page fail is refused here (``UserError`` / ``FileNotFoundError``)."""
    from dpbert import metadata
    from dpbert_cli.commands import open_metadata_store

    if args.pipeline_root:
        from dpbert import pipeline_root

        pipeline_root.list_runs(args.pipeline_root)  # FileNotFoundError naming it: no executor output
        return None, args.pipeline_root
    path = metadata.metadata_path_for(args.output, args.metadata)
    open_metadata_store(path, "--metadata" if args.metadata else "--output")  # a readable MLMD store
    return path, None


def _ledger(args) -> Optional[str]:
    """``--ledger``, checked at start: a dataset ledger the page can show (``UserError`` otherwise)."""
    if not getattr(args, "ledger", None):
        return None
    from dashboard import dataset
    from dpbert_cli.commands import UserError

    try:
        dataset.read(args.ledger)
    except dataset.NoLedger as err:
        raise UserError(f"--ledger {args.ledger}: {err}") from None
    return args.ledger


def cmd_dashboard(args) -> int:
    from dpbert_cli.commands import UserError

    if args.output and os.path.exists(args.output) and not os.path.isdir(args.output):
        print_error("dashboard", f"--output {args.output} is a file; give the run's output directory "
                                 f"(or the store with --metadata FILE)")
        return exit_codes.BAD_INPUT
    try:
        path, root = _source(args)
    except (FileNotFoundError, UserError, ValueError) as err:
        print_error("dashboard", f"--pipeline-root {err}" if args.pipeline_root else err)
        return exit_codes.BAD_INPUT
    try:
        ledger = _ledger(args)
    except UserError as err:
        print_error("dashboard", err)
        return exit_codes.BAD_INPUT
    if not 0 < args.port < 65536:
        print_error("dashboard", f"--port {args.port} is not a TCP port")
        return exit_codes.BAD_INPUT
    try:
        from dashboard.app import serve
    except ImportError as err:  # the web dependencies are the `dashboard` extra
        print_error("dashboard", f"{err} (install them with `pip install dpbert[dashboard]`)")
        return exit_codes.BAD_INPUT
    refused = _port_refused(args.host, args.port)
    if refused:
        print_error("dashboard", refused)
        return exit_codes.ENVIRONMENT
    try:
        serve(path, args.host, args.port, pipeline_root=root, ledger=ledger)
    except SystemExit as exit_:
        # uvicorn exits 3 (its STARTUP_FAILURE) when it cannot bind, e.g. a port taken since
        # the probe: 3 is dpbert's over-budget code, so it becomes ENVIRONMENT.
        if exit_.code not in (None, 0):
            print_error("dashboard", f"the server could not start on {args.host}:{args.port} (see above)")
            return exit_codes.ENVIRONMENT
        raise
    except KeyboardInterrupt:
        return exit_codes.OK
    return exit_codes.OK
