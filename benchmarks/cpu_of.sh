#!/usr/bin/env bash
# usage: benchmarks/cpu_of.sh NAME COMMAND...
# The wall time and the CPU seconds of COMMAND and of every process it starts, daemons
# included (Ray's servers and actors re-parent themselves, so /usr/bin/time misses them):
# the command runs in its own cgroup (v1 cpuacct, /sys/fs/cgroup/cpuacct/NAME; needs root).
# docs/testing.md's figures: benchmarks/cpu_of.sh suite make test
set -u
name=$1; shift
cg=/sys/fs/cgroup/cpuacct/$name
mkdir -p "$cg" && echo 0 > "$cg/cpuacct.usage" || { echo "cpu_of: cannot use $cg" >&2; exit 2; }
echo "[$name] load at start $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s.%N)
bash -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$cg" "$@"; rc=$?
t1=$(date +%s.%N)
sleep 2  # the last daemons' exits
cpu=$(awk '{printf "%.1f", $1 / 1e9}' "$cg/cpuacct.usage")
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
echo "[$name] wall $wall s, CPU $cpu s, load at end $(cut -d' ' -f1-3 /proc/loadavg), exit $rc"
exit $rc
