"""`python -m targetpo` and the `targetpo` script: the CLI, with a Ctrl-C during its start (~3 s of imports: torch
and every experiment module for `--help`) ending as one line and exit code 130, like a Ctrl-C later on."""

import signal
import sys


def script() -> int:
    # A Ctrl-C during the imports is held until they are done, then answered. Raised inside them it could land in
    # torch's C++ initialisation and abort the process ("terminate called after throwing an instance of
    # 'pybind11::error_already_set'"), or in code an extension runs through PyRun_String, which CPython then
    # marks "unhandled" even once caught and ends the process by SIGINT after it returned 130.
    held: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:  # not where Ctrl-C is ignored (a background job) or handled
        signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        from targetpo.cli import build_parser, main

        parser = build_parser()  # imports every experiment module (and the LLM extra, where installed) for --help
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        if held:
            raise KeyboardInterrupt
        return main(parser=parser)
    except KeyboardInterrupt:  # before main's own handler is in place (once it is, main returns 130 itself)
        print("\ntargetpo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(script())
