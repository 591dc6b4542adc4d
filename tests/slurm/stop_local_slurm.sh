#!/usr/bin/env bash
# Stop what tests/slurm/start_local_slurm.sh DIR started: each daemon by the pid in its pid file.
DIR=${1:?usage: stop_local_slurm.sh DIR}
for pidfile in "$DIR"/slurmd-node1.pid "$DIR"/slurmd-node2.pid "$DIR"/slurmctld.pid "$DIR"/munged.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
done
exit 0
