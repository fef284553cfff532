"""``dpbert dashboard``: its argument parser and command (no web import until it runs: the web
dependencies are the ``dashboard`` extra)."""
from __future__ import annotations

import argparse

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
    p.add_argument("--host", default=DEFAULT_HOST,
                   help="address to listen on (default 127.0.0.1; anything else exposes the dashboard, "
                        "which has no authentication, to the network)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (default 8080)")
    p.set_defaults(func=cmd_dashboard)
    return p


def cmd_dashboard(args) -> int:
    from dpbert import metadata

    try:
        path = metadata.metadata_path_for(args.output, args.metadata)
    except FileNotFoundError as err:
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
    serve(path, args.host, args.port)
    return exit_codes.OK
