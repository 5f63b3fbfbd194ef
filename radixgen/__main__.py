"""`radixgen` command line (also `python -m radixgen`): the runtime's subcommands plus the language's `run`."""

import sys


def main(argv: list[str] | None = None) -> int:
    from radixgen.runtime.cli import COMMAND_TABLE
    from radixgen.runtime.cli import main as cli_main

    # `run` belongs to the language (lang depends on runtime, never the reverse), so the front door adds it.
    return cli_main(argv, {**COMMAND_TABLE, "run": "radixgen.lang.program_command:RUN"})


if __name__ == "__main__":
    sys.exit(main())
