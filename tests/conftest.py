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
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "dipsjax",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.load_profile("dipsjax")
