"""Test-wide settings: 8 simulated CPU devices (for partition meshes) and hypothesis profiles."""

import atexit
import os
import shutil
import tempfile

# Must happen before jax is imported anywhere in the test session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session, its processes included (the launcher
# keeps a cache already set): a learner started by a later test loads its compiled steps.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="dipsjax-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
# Every program, not only those that took over a second to compile (JAX's default): a
# learner process then starts its first round in about 1.2 s instead of 1.7 s.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

# Ctrl-C as at a terminal: started from a non-interactive shell's background job (``nohup
# ... &``, some CI runners), the suite inherits SIGINT ignored, and so would every launcher
# it starts, which the Ctrl-C tests then cannot stop (tests/test_suite_signals.py). Python's
# own handler back in this process (each xdist worker imports this file) is inherited as
# "handled", that is, as the default, by what it starts.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "dipsjax",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.load_profile("dipsjax")


import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n 2 --dist loadgroup`` (the suite's default, see ``pyproject.toml``),
    the tests that start real processes (marked ``integration``, and the notebook that
    launches a local cluster) run one after another on one worker: each already loads
    both cores, and two at once would stretch the heartbeat and deadline timings they
    assert. The in-process tests (simulator, cores, notebooks) run on the other worker."""
    import pytest

    for item in items:
        if item.get_closest_marker("integration") or "local_cluster" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("processes"))
