"""Multi-process JAX on CPU inside one SLURM job step: a smoke test.

Run as N tasks of one step, e.g. (in a batch script or allocation)
    srun --het-group=K -n2 .venv/bin/python scripts/slurm_jax_check.py
    srun -n2 --overlap .venv/bin/python scripts/slurm_jax_check.py
Each process gets DEVICES (default 2) CPU devices and calls the distributed
initialize WITHOUT arguments, so JAX's SLURM detection supplies the coordinator
(first node of SLURM_STEP_NODELIST, port 61440 + SLURM_JOB_ID % 4096 unless
JAX_COORDINATOR_PORT is set), SLURM_NTASKS and SLURM_PROCID. Then a global
array over all devices is summed by a jitted function (a cross-process
reduction) and checked on every process. Prints one "OK ..." line per process.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# All before the backend starts (i.e. before initialize / the first jax.devices()).
if not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", "cpu")  # never probe for accelerators
DEVICES = int(os.environ.get("DEVICES", "2"))
jax.config.update("jax_num_cpu_devices", DEVICES)
if os.environ.get("CPU_COLLECTIVES"):  # jax 0.12 default is already "gloo"
    jax.config.update("jax_cpu_collectives_implementation", os.environ["CPU_COLLECTIVES"])

jax.distributed.initialize()  # SLURM auto-detection

pid, nproc = jax.process_index(), jax.process_count()
coord = jax._src.distributed.global_state.coordinator_address
n_global = len(jax.devices())
assert nproc == int(os.environ["SLURM_NTASKS"]), (nproc, os.environ["SLURM_NTASKS"])
assert len(jax.local_devices()) == DEVICES and n_global == DEVICES * nproc, jax.devices()

mesh = Mesh(np.array(jax.devices()), ("d",))
sharding = NamedSharding(mesh, P("d"))
# Each process contributes elements [pid*DEVICES, (pid+1)*DEVICES) of arange(n_global).
local = np.arange(pid * DEVICES, (pid + 1) * DEVICES, dtype=np.float32)
x = jax.make_array_from_process_local_data(sharding, local, (n_global,))
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
gathered = multihost_utils.process_allgather(x, tiled=True)

expect = n_global * (n_global - 1) / 2
ok = float(total) == expect and np.array_equal(gathered, np.arange(n_global))
print(
    f"{'OK' if ok else 'FAIL'} process {pid}/{nproc} coordinator={coord} "
    f"devices={n_global} sum={float(total)} expect={expect} "
    f"gathered={gathered.tolist()} node={os.environ.get('SLURMD_NODENAME')}",
    flush=True,
)
jax.distributed.shutdown()
sys.exit(0 if ok else 1)
