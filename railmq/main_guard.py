"""One line, not a page of tracebacks, for a script that starts a cluster without a main guard.

railmq starts its actors with multiprocessing's forkserver, which runs the user's main script
again in every new process before the actor takes over. A script that starts a `LocalCluster`
at import time (no `if __name__ == "__main__":`) then tries to start processes from inside that
bootstrap; multiprocessing refuses with a long RuntimeError in every child, and the parent sees
an actor exit during start. `install_main_guard_hook` runs when railmq is imported in the forkserver (its children
inherit the hook) or in a bootstrapping child, and replaces that one error's traceback with one line saying what to change;
every other exception goes to the previous hook untouched.

The child then exits with `EXIT_MAIN_GUARD`; the supervisor in the user's process turns that
exit into `MainGuardMissing` (transport/supervisor.py), and a hook installed in the user's process
prints that one line instead of a traceback when the script does not catch it. Nothing else is
changed in either process.
"""

from __future__ import annotations

import multiprocessing.process
import os
import sys
from types import TracebackType

from transport.supervisor import EXIT_MAIN_GUARD, MainGuardMissing

ERROR_NAME = "MAIN_GUARD_MISSING"
# The sentence multiprocessing's spawn._check_not_importing_main raises with.
_BOOTSTRAP_ERROR_WORDS = "has finished its bootstrapping phase"


def explanation(script: str) -> str:
    return (f"error: {ERROR_NAME}: {script} starts railmq processes when it is imported; railmq's actor "
            "processes import the main script again, so put that code under "
            "`if __name__ == \"__main__\":`")


def is_main_guard_error(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and _BOOTSTRAP_ERROR_WORDS in str(error)


def in_process_starter() -> bool:
    """True in multiprocessing's forkserver (whose forked children re-run the main script) and in
    a spawned child that is re-running it now; False in the user's own process."""
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        return True
    return sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules


def install_main_guard_hook() -> None:
    previous = sys.excepthook
    if not in_process_starter():
        def parent_hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
            if isinstance(error, MainGuardMissing):
                sys.stderr.write(explanation(_script()) + "\n")
                return
            previous(kind, error, trace)

        sys.excepthook = parent_hook
        return

    def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if is_main_guard_error(error):
            sys.stderr.flush()
            os._exit(EXIT_MAIN_GUARD)  # the parent explains it, once
        previous(kind, error, trace)

    sys.excepthook = hook


def _script() -> str:
    return sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else "the main script"
