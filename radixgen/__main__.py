"""`radixgen` command line (also `python -m radixgen`)."""

import sys


def main(argv: list[str] | None = None) -> int:
    from radixgen.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
