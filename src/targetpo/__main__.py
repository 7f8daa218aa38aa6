"""`python -m targetpo` and the `targetpo` script: the CLI, with a Ctrl-C during its start (~3 s of imports: torch
and every experiment module for `--help`) ending as one line and exit code 130, like a Ctrl-C later on."""

import sys


def script() -> int:
    try:
        from targetpo.cli import main

        return main()
    except KeyboardInterrupt:  # before main's own handler is in place (once it is, main returns 130 itself)
        print("\ntargetpo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(script())
