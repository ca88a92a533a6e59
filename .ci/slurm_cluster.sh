#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests/test_benchmarks.py's SLURM test: Debian's slurm-wlm and munge,
# started without systemd. Run as root; idempotent (a cluster already answering is left alone).
set -euo pipefail
if sinfo -h > /dev/null 2>&1; then exit 0; fi
if ! command -v slurmctld > /dev/null || ! command -v munged > /dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge > /dev/null
fi
mkdir -p /etc/munge /var/log/munge /var/lib/munge /run/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2> /dev/null
chown -R munge:munge /etc/munge /var/log/munge /var/lib/munge /run/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged > /dev/null || su -s /bin/sh munge -c /usr/sbin/munged
host=$(hostname -s)
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
MpiDefault=none
KillWait=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
pgrep -x slurmctld > /dev/null || slurmctld
pgrep -x slurmd > /dev/null || slurmd
for _ in $(seq 30); do sinfo -h -o %T 2> /dev/null | grep -q idle && exit 0; sleep 1; done
echo "the SLURM cluster did not come up; see /var/log/slurm" >&2
exit 1
