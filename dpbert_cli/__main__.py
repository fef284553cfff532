"""``python -m dpbert_cli ...``: the same as the ``dpbert`` console script."""
import sys

from dpbert_cli.main import main

if __name__ == "__main__":
    sys.exit(main())
