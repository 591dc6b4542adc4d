#!/usr/bin/env bash
# A two-node Slurm on this machine, for tests/test_slurm.py (issue 34): munged, slurmctld and
# two slurmd (node1, node2: NodeHostname=NodeAddr=localhost, their own ports), config and
# state in DIR. The node names do not resolve: an sbatch script finds the rendezvous host as
# the first node's NodeAddr (scontrol show node), which is its name on most clusters.
#
#   tests/slurm/start_local_slurm.sh DIR      # waits until sinfo shows both nodes idle
#   . DIR/env                                 # SLURM_CONF for sbatch / squeue / sinfo
#   tests/slurm/stop_local_slurm.sh DIR       # kills the daemons started here, by their pids
#
# Needs Debian's slurm-wlm and munge (apt-get install -y slurm-wlm munge) and root (SlurmUser
# root, as in CI). Ports: $PARTITA_SLURM_PORT (default 16817) for slurmctld, the next two for
# the slurmd. Exit 1 with the daemons' log tail if the nodes are not idle within 60 s.
set -euo pipefail
DIR=${1:?usage: start_local_slurm.sh DIR}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
PORT=${PARTITA_SLURM_PORT:-16817}
for tool in munged slurmctld slurmd sinfo sbatch; do
    command -v "$tool" >/dev/null || { echo "start_local_slurm: $tool not found (apt-get install -y slurm-wlm munge)" >&2; exit 1; }
done
mkdir -p "$DIR/state" "$DIR/spool/node1" "$DIR/spool/node2" "$DIR/munge"
chmod 755 "$DIR" "$DIR/munge"  # clients (sbatch as any user) reach the socket; the key stays 400
KEY=/etc/munge/munge.key
if [ ! -r "$KEY" ]; then
    KEY="$DIR/munge/munge.key"
    dd if=/dev/urandom bs=1 count=1024 of="$KEY" status=none
fi
cp "$KEY" "$DIR/munge/key" && chmod 400 "$DIR/munge/key"
SOCK="$DIR/munge/munge.sock"
NCPU=$(nproc)
cat > "$DIR/slurm.conf" <<EOF
ClusterName=partita-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$PORT
AuthType=auth/munge
AuthInfo=socket=$SOCK
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
NodeName=node1 NodeHostname=localhost NodeAddr=localhost Port=$((PORT + 1)) CPUs=$NCPU State=UNKNOWN
NodeName=node2 NodeHostname=localhost NodeAddr=localhost Port=$((PORT + 2)) CPUs=$NCPU State=UNKNOWN
PartitionName=ci Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
echo "export SLURM_CONF=$DIR/slurm.conf" > "$DIR/env"
export SLURM_CONF="$DIR/slurm.conf"

munged --force --socket="$SOCK" --key-file="$DIR/munge/key" --pid-file="$DIR/munged.pid" \
    --log-file="$DIR/munged.log" --seed-file="$DIR/munge/seed"
slurmctld -f "$SLURM_CONF" -i
slurmd -f "$SLURM_CONF" -N node1
slurmd -f "$SLURM_CONF" -N node2

for _ in $(seq 120); do
    if [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle')" = 2 ]; then
        sinfo -N
        exit 0
    fi
    sleep 0.5
done
echo "start_local_slurm: the two nodes are not idle after 60 s:" >&2
sinfo -N >&2 || true
tail -n 20 "$DIR"/slurmctld.log "$DIR"/slurmd-*.log >&2 || true
exit 1
