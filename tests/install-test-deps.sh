#!/usr/bin/env bash
# Test-only prerequisites that come from the distribution, installed when root (make test):
#   slurm-wlm, munge   a real Slurm cluster on loopback for the eviction tests
#                      (tests/slurm_cluster.py; Debian 12 ships Slurm 22.05)
#   prometheus         a real Prometheus that scrapes the analyzer (tests/test_prometheus.py)
#   prometheus-node-exporter  its textfile collector serves the agent's metrics file (ibid.)
#   chromium           a real headless browser for the HTML report (tests/test_html_report.py)
#   nats-server        a real 3-node NATS JetStream cluster for the cluster mode
#                      (tests/nats_cluster.py; Debian 12 ships v2.9.10)
#   systemd-container, debootstrap   a real systemd booted in a Debian root file system
#                      (tests/test_systemd_deploy.py), which tests/systemd/build-rootfs.sh
#                      then builds into .cache/systemd-rootfs (once; kept while it is current)
# Not root: nothing is installed, and the tests that need them skip (or fail under CI=true).
set -u
need=()
for bin in slurmctld slurmd munged; do
  command -v "$bin" >/dev/null 2>&1 || need=(slurm-wlm munge)
done
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-node-exporter >/dev/null 2>&1 || need+=(prometheus-node-exporter)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ "$(id -u)" != 0 ]; then
  [ ${#need[@]} -eq 0 ] || echo "test deps: not root; ${need[*]} not installed (the tests that need them will skip)"
  exit 0
fi
if [ ${#need[@]} -eq 0 ]; then
  echo "test deps: slurm, munge, prometheus, node exporter, chromium, nats-server, systemd-nspawn and debootstrap present"
else
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || echo "test deps: apt-get update failed"
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; then
    echo "test deps: installed ${need[*]}"
  else
    echo "test deps: apt-get install ${need[*]} failed (the tests that need them will say so)"
  fi
fi
# the real-systemd test's root file system (its failure is the test's to report, with the log)
bash "$(dirname "$0")/systemd/build-rootfs.sh" || echo "test deps: the systemd test's root file system was not built (tests/test_systemd_deploy.py will say why)"
