"""The suite's Ctrl-C tests (``tests/launch/test_local.py``, ``tests/runtime/test_local_run.py``,
``tests/runtime/test_resume.py``) send SIGINT to a launcher they start, so its processes must
take SIGINT whatever the suite was started from. A non-interactive shell starts a background
job (``nohup ... &``, a CI runner's step) with SIGINT ignored, every child inherits that, and
Python keeps it ignored: the launcher never saw the Ctrl-C, ran to its budget and exited 0
(three tests failed so in a rehearsal). ``tests/conftest.py`` restores Python's handler."""

import signal
import subprocess
import sys


def test_a_process_the_suite_starts_takes_ctrl_c():
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    out = subprocess.run(
        [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "default_int_handler" in out, out
