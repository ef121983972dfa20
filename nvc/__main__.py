"""``python -m nvc`` and the ``nvc-py`` console script."""

import sys

from nvc.cli import main


def run() -> None:
    """Exit with the CLI's status (console-script entry point)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
