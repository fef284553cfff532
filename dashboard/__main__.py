"""``python -m dashboard [--output DIR | --metadata PATH] [--host H] [--port P]``: the same as
``dpbert dashboard``."""
import argparse
import sys

from dashboard.cli import add_dashboard_parser


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboard")
    sub = parser.add_subparsers(dest="command")
    add_dashboard_parser(sub)
    args = parser.parse_args(["dashboard", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
