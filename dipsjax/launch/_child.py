"""``python -m dipsjax.launch._child PARENT MODULE ARGS...``: runs ``MODULE`` as
``__main__`` in a process that ends with its launcher.

The local executor starts every job through this: it asks the kernel for SIGTERM when its
parent dies (``PR_SET_PDEATHSIG``), then checks that the parent (pid ``PARENT``) is still
there, as it may have died before the request. So a launcher killed with SIGKILL, which
runs no clean-up of its own, still leaves no process behind. (Done here rather than in a
``preexec_fn``: the launcher has JAX's threads, and forking a threaded process to run
Python code before ``exec`` can deadlock.)
"""

import ctypes
import os
import runpy
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    parent, module = int(sys.argv[1]), sys.argv[2]
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        sys.exit(f"{module}: the launcher (pid {parent}) is gone; not starting")
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
