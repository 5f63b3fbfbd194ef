"""`radixgen` command line (also `python -m radixgen`)."""

import contextlib
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Run one command and return its exit status; an interrupted command leaves without finalizing.

    Ctrl-C or SIGTERM may arrive while a thread is inside native code that cannot be stopped (loading weights on
    the engine's build thread); finalizing the interpreter around such a thread can abort in native code
    ("terminate called without an active exception"), so after the command's one-line report the process exits
    at once. Every other exit finalizes normally (engines shut down and join their threads first).
    """
    from radixgen.cli import EXIT_INTERRUPTED, EXIT_TERMINATED
    from radixgen.cli import main as cli_main

    code = cli_main(argv)
    if code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe
                stream.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
