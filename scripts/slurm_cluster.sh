#!/usr/bin/env bash
# Throw-away SLURM cluster on this one machine, for testing the SLURM launcher for real.
#
# Usage:
#   scripts/slurm_cluster.sh install                 # apt-get install slurm-wlm munge (idempotent)
#   scripts/slurm_cluster.sh start [--nodes N] DIR   # configure + start a cluster living in DIR
#   scripts/slurm_cluster.sh stop DIR                # stop everything `start DIR` started
#   scripts/slurm_cluster.sh status DIR              # sinfo of that cluster
#
# After `start DIR`, client commands need the config path:
#   export SLURM_CONF=DIR/slurm.conf; sinfo; srun -n1 hostname; sbatch job.sh
# `start` prints that export line last (`eval "$(... start DIR | grep ^export)"`).
#
# --nodes 1 (default): one node named after this host (`hostname -s`), one slurmd.
# --nodes N > 1: N emulated nodes named 127.0.0.1 .. 127.0.0.N, one slurmd each
#   (`slurmd -N NAME`, Debian's slurmd supports several per host), every one with
#   this machine's CPUs and memory. Needed for heterogeneous jobs: the backfill
#   scheduler (the only one that starts hetjobs) reserves WHOLE nodes for each
#   pending component, so a hetjob needs at least as many nodes as components;
#   on a single node only 1-component hetjobs ever start. IP-literal node names
#   resolve without /etc/hosts, so `jax.distributed.initialize()` (which uses
#   the first name of SLURM_STEP_NODELIST as coordinator host) just works.
#
# Everything lives under DIR: slurm.conf, a private munge key + munged (own socket),
# controller state, slurmd spools, logs and pid files (DIR/*.pid). Nothing
# system-wide is touched, several clusters can run side by side (each picks its
# own free ports), and `stop` kills only what its `start` launched.
# Must run as root (daemons run as root: SlurmUser=root).
#
# Environment knobs (all optional):
#   SLURM_CLUSTER_NODES     default for --nodes (1)
#   SLURM_CLUSTER_TIMEOUT   seconds to wait for the nodes to become idle (60)
#   SLURM_CLUSTER_NAME      ClusterName (dipsjax)
#   SLURM_CLUSTER_PARTITION partition name (debug)
#   SLURM_CLUSTER_OVERSUB   jobs allowed per CPU, OverSubscribe=FORCE:N (32)
#   SLURM_CLUSTER_PORT      first port to try (default: random in 20000-39999)
set -euo pipefail

PROG=$(basename "$0")

die() { echo "$PROG: error: $*" >&2; exit 1; }
log() { echo "$PROG: $*" >&2; }

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

# --------------------------------------------------------------------------- install
cmd_install() {
  # Fast path: binaries already there -> nothing to do.
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
     command -v munged >/dev/null && command -v sinfo >/dev/null; then
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "install needs root"
  export DEBIAN_FRONTEND=noninteractive
  local pkgs=(slurm-wlm munge) out
  if ! out=$(apt-get install -y -q "${pkgs[@]}" 2>&1); then
    # Most likely cause: empty/stale package lists (fresh container). Refresh once.
    log "apt-get install failed, running apt-get update and retrying"
    apt-get update -q >/dev/null 2>&1 || true
    apt-get install -y -q "${pkgs[@]}" >/dev/null 2>&1 ||
      die "apt-get install ${pkgs[*]} failed:"$'\n'"$out"
  fi
  command -v slurmctld >/dev/null || die "slurmctld still missing after install"
}

# --------------------------------------------------------------------------- helpers
# All TCP ports in use (any state, IPv4 and IPv6) on this host, one per line.
used_ports() {
  local f
  for f in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$f" ] || continue
    awk 'NR > 1 { n = split($2, a, ":"); print a[n] }' "$f"   # local "ADDR:PORT", hex
  done | while read -r hex; do echo $((16#$hex)); done | sort -un
}

# First port P of a run of COUNT consecutive free ports (P .. P+COUNT-1).
pick_ports() {
  local count=$1 used p i ok tries=0
  used=" $(used_ports | tr '\n' ' ') "
  p=${SLURM_CLUSTER_PORT:-$((20000 + (RANDOM * 32768 + RANDOM) % 20000))}
  while [ $tries -lt 500 ]; do
    [ $((p + count)) -lt 65000 ] || p=20000
    ok=1
    for ((i = 0; i < count; i++)); do
      [[ $used == *" $((p + i)) "* ]] && { ok=0; break; }
    done
    [ $ok = 1 ] && { echo "$p"; return 0; }
    p=$((p + count)); tries=$((tries + 1))
  done
  die "no run of $count free ports found"
}

# True if PID is a live (non-zombie) process. Our daemons are reparented to
# pid 1 once `start` exits; a dead one may linger as a zombie until reaped.
alive() {
  local pid=$1 state
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  # State is the field after "(comm)"; comm may hold spaces, so cut at the last ')'.
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# Send TERM to the given pids, wait up to GRACE s, then KILL survivors and wait.
terminate() {
  local grace=$1; shift
  local pids=() p i left
  for p in "$@"; do alive "$p" && pids+=("$p"); done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    left=0; for p in "${pids[@]}"; do alive "$p" && left=1; done
    [ $left = 0 ] && return 0
    sleep 0.1
  done
  local stubborn=()
  for p in "${pids[@]}"; do alive "$p" && stubborn+=("$p"); done
  if [ ${#stubborn[@]} -gt 0 ]; then
    log "still alive ${grace}s after SIGTERM, sending SIGKILL: ${stubborn[*]}"
    kill -KILL "${stubborn[@]}" 2>/dev/null || true
  fi
  for ((i = 0; i < 50; i++)); do
    left=0; for p in "${pids[@]}"; do alive "$p" && left=1; done
    [ $left = 0 ] && return 0
    sleep 0.1
  done
  log "warning: some pids survived SIGKILL: ${pids[*]}"
}

# slurmstepd processes of this cluster (they keep DIR/log/slurmd*.log open; their
# environment is scrubbed, so that is the reliable mark) plus all their
# descendants (the job's tasks), deepest last.
leftover_pids() {
  local dir=$1 p fd roots=()
  for p in $(pgrep -x slurmstepd 2>/dev/null || true); do
    for fd in /proc/"$p"/fd/*; do
      if [[ $(readlink "$fd" 2>/dev/null) == "$dir"/* ]]; then roots+=("$p"); break; fi
    done
  done
  [ ${#roots[@]} -gt 0 ] || return 0
  # Breadth-first walk of the process tree from the roots.
  ps -e -o pid=,ppid= | awk -v roots="${roots[*]}" '
    { kids[$2] = kids[$2] " " $1 }
    END {
      n = split(roots, q, " ")
      for (i = 1; i <= n; i++) {
        print q[i]
        m = split(kids[q[i]], k, " ")
        for (j = 1; j <= m; j++) q[++n] = k[j]
      }
    }'
}

# Print the daemon log files (*.log) to stderr; with a daemon name (e.g.
# slurmd.vm), also its captured stdout/stderr (*.out: errors before the log opens).
show_logs() {
  local dir=$1 failed=${2:-} f
  for f in "$dir"/log/*.log ${failed:+"$dir/log/$failed.out"}; do
    [ -s "$f" ] || continue
    echo "----- $f (last 20 lines) -----" >&2
    tail -n 20 "$f" >&2
  done
}

# --------------------------------------------------------------------------- start
cmd_start() {
  local nodes=${SLURM_CLUSTER_NODES:-1} dir=""
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
      --nodes=*) nodes=${1#--nodes=}; shift ;;
      -*) usage ;;
      *) [ -z "$dir" ] || usage; dir=$1; shift ;;
    esac
  done
  [ -n "$dir" ] || usage
  [[ $nodes =~ ^[1-9][0-9]*$ ]] && [ "$nodes" -le 250 ] || die "--nodes must be 1..250"
  [ "$(id -u)" = 0 ] || die "start needs root"
  cmd_install
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd -P)
  [ ! -e "$dir/slurm.conf" ] || die "$dir already holds a cluster (stop it and use a fresh DIR)"
  mkdir -p "$dir"/{state,log,munge,run}
  chmod 700 "$dir/munge"
  # Unix socket paths are limited to 108 bytes: slurmstepd makes one per step in
  # the slurmd spool dir (SPOOL/NODE/NODE_JOBID.STEPID), munged one for itself.
  # With a long DIR (pytest tmp paths) put both in a short directory under /tmp,
  # recorded in DIR/sockdir, linked as DIR/spool, and removed by `stop`.
  local sockdir="$dir"
  if [ ${#dir} -gt 40 ]; then
    sockdir=$(mktemp -d /tmp/slurm.XXXXXX)
    echo "$sockdir" >"$dir/sockdir"
    mkdir -p "$sockdir/spool"
    ln -s "$sockdir/spool" "$dir/spool"
  else
    mkdir -p "$dir/spool"
  fi

  local host conf="$dir/slurm.conf" hw port0 ctld_port names=() i
  host=$(hostname -s)
  # Node hardware as slurmd detects it (CPUs, board/socket/core/thread layout,
  # RealMemory): a node claiming more than it has is drained, and a layout
  # mismatch gets warnings, so take slurmd's own view; fall back to nproc+meminfo.
  hw=$(timeout 10 slurmd -C 2>/dev/null | head -n1 | sed -n 's/^NodeName=[^ ]* //p') || true
  if [ -z "$hw" ]; then
    hw="CPUs=$(nproc) RealMemory=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)"
  fi
  if [ "$nodes" = 1 ]; then
    names=("$host")
  else
    for ((i = 1; i <= nodes; i++)); do names+=("127.0.0.$i"); done
  fi
  # Ports: controller, then one per slurmd.
  port0=$(pick_ports $((nodes + 1)))
  ctld_port=$port0

  # ---- munge: private key and private munged with its own socket under DIR, so
  # clusters are independent of any system munged and `stop` kills exactly what
  # we started. munged insists that the socket directory be world-executable
  # (pytest tmp dirs are 0700); --force makes that a warning (clients are root).
  local sock="$sockdir/munge.socket"
  if [ -r /etc/munge/munge.key ]; then
    cp /etc/munge/munge.key "$dir/munge/munge.key"
  else
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 600 "$dir/munge/munge.key"
  munged --force --socket="$sock" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/log/munged.log" --pid-file="$dir/munged.pid" \
    --seed-file="$dir/munge/munged.seed" </dev/null >"$dir/log/munged.out" 2>&1 ||
    { show_logs "$dir"; die "munged failed to start"; }
  # (munged forks into the background; the pid file holds the daemon's pid)
  munge -S "$sock" -n </dev/null 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1 ||
    { show_logs "$dir"; cmd_stop "$dir" || true; die "munge round trip failed"; }

  # ---- slurm.conf
  {
    cat <<EOF
# Generated by $PROG start --nodes $nodes $dir  ($(date -Is))
ClusterName=${SLURM_CLUSTER_NAME:-dipsjax}
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root

# Auth through our private munged.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock

# All state inside DIR (%n = node name, so several slurmd can share the host).
StateSaveLocation=$dir/state
SlurmdSpoolDir=$sockdir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups in containers: track processes through /proc (parent/child links),
# no CPU binding, no accounting, no job completion log.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true

# CPUs are the only consumable resource (memory is not tracked, so jobs need no
# --mem). Heterogeneous jobs are started only by the backfill scheduler: run it
# every second instead of every 30 s (job start ~1 s after submission).
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU

# Fast turnaround for tests.
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=3
UnkillableStepTimeout=30
MessageTimeout=10

EOF
    if [ "$nodes" = 1 ]; then
      echo "NodeName=$host NodeAddr=127.0.0.1 Port=$((port0 + 1)) $hw State=UNKNOWN"
    else
      for ((i = 0; i < nodes; i++)); do
        echo "NodeName=${names[i]} NodeHostname=$host Port=$((port0 + 1 + i)) $hw State=UNKNOWN"
      done
    fi
    cat <<EOF
# OverSubscribe=FORCE:N lets up to N jobs (each hetjob component is a job)
# share a CPU, so more tasks than CPUs run concurrently.
PartitionName=${SLURM_CLUSTER_PARTITION:-debug} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:${SLURM_CLUSTER_OVERSUB:-32}
EOF
  } >"$conf"

  # ---- daemons: foreground mode (-D) under setsid, so the recorded pid is the
  # daemon itself; stdio detached so a caller capturing our output does not hang.
  local t0=$SECONDS n
  SLURM_CONF=$conf setsid slurmctld -D -f "$conf" \
    </dev/null >"$dir/log/slurmctld.out" 2>&1 &
  echo $! >"$dir/slurmctld.pid"
  for n in "${names[@]}"; do
    mkdir -p "$sockdir/spool/$n"
    local nflag=()
    [ "$nodes" = 1 ] || nflag=(-N "$n")
    SLURM_CONF=$conf setsid slurmd -D "${nflag[@]}" -f "$conf" \
      </dev/null >"$dir/log/slurmd.$n.out" 2>&1 &
    echo $! >"$dir/slurmd.$n.pid"
  done

  # ---- wait until every node reports idle
  local timeout=${SLURM_CLUSTER_TIMEOUT:-60} idle=0 f
  while :; do
    for f in "$dir"/slurmctld.pid "$dir"/slurmd.*.pid; do
      if ! alive "$(cat "$f")"; then
        show_logs "$dir" "$(basename "$f" .pid)"; cmd_stop "$dir" || true
        die "$(basename "$f" .pid) exited during startup (logs above)"
      fi
    done
    idle=$(SLURM_CONF=$conf sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$') || true
    [ "$idle" = "$nodes" ] && break
    if [ $((SECONDS - t0)) -ge "$timeout" ]; then
      SLURM_CONF=$conf sinfo -N -l >&2 2>/dev/null || true
      show_logs "$dir"
      cmd_stop "$dir" || true
      die "only $idle of $nodes nodes idle after ${timeout}s (logs above)"
    fi
    sleep 0.2
  done

  echo "# slurm cluster up in $((SECONDS - t0))s: $nodes node(s), ctld port $ctld_port, dir $dir"
  echo "export SLURM_CONF=$conf"
}

# --------------------------------------------------------------------------- stop
cmd_stop() {
  local dir=${1:?stop needs DIR}
  [ -d "$dir" ] || die "no such directory: $dir"
  dir=$(cd "$dir" && pwd -P)
  local conf="$dir/slurm.conf" f i pids=()

  # 1. Cancel all jobs while the controller is up, so steps end cleanly.
  if [ -f "$conf" ] && [ -f "$dir/slurmctld.pid" ] && alive "$(cat "$dir/slurmctld.pid")"; then
    if [ -n "$(SLURM_CONF=$conf timeout 10 squeue -h -o %i 2>/dev/null)" ]; then
      SLURM_CONF=$conf timeout 10 scancel --quiet --user=root 2>/dev/null || true
      for ((i = 0; i < 100; i++)); do   # up to 10 s (KillWait=3)
        [ -z "$(SLURM_CONF=$conf timeout 10 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
  fi
  # 2. Daemons: slurmd first, then the controller, then munged.
  for f in "$dir"/slurmd.*.pid; do [ -f "$f" ] && pids+=("$(cat "$f")"); done
  terminate 5 "${pids[@]}"
  for f in slurmctld munged; do
    [ -f "$dir/$f.pid" ] && terminate 5 "$(cat "$dir/$f.pid")"
  done
  # 3. Step daemons and task processes that outlived it all (slurmd does not end
  #    running steps when it stops).
  mapfile -t pids < <(leftover_pids "$dir")
  if [ ${#pids[@]} -gt 0 ]; then
    log "cleaning up leftover step processes: ${pids[*]}"
    terminate 3 "${pids[@]}"
  fi
  # 4. The short socket/spool directory made outside DIR (long DIR paths).
  if [ -f "$dir/sockdir" ]; then
    local sockdir
    sockdir=$(cat "$dir/sockdir")
    [[ $sockdir == /tmp/slurm.* ]] && rm -rf "$sockdir"
    rm -f "$dir/sockdir" "$dir/spool"
  fi
  rm -f "$dir"/slurmctld.pid "$dir"/slurmd.*.pid "$dir"/munged.pid
}

# --------------------------------------------------------------------------- status
cmd_status() {
  local dir=${1:?status needs DIR}
  dir=$(cd "$dir" && pwd -P)
  SLURM_CONF=$dir/slurm.conf sinfo -N
}

case "${1:-}" in
  install) cmd_install ;;
  start)   shift; cmd_start "$@" ;;
  stop)    shift; [ $# = 1 ] || usage; cmd_stop "$1" ;;
  status)  shift; [ $# = 1 ] || usage; cmd_status "$1" ;;
  -h|--help|help) usage 0 ;;
  *) usage ;;
esac
