#!/usr/bin/env python3
"""Restart this host's Mooncake master when its HA election is stuck on itself.

Seen on the lab (mooncake_master 0.3.13): after etcd stalled for ~25 s, a master won the election,
its lease keep-alive "did not become ready before timeout", and it went back to standby, but the
keep-alive it had started kept the lease, so the master view in etcd kept naming it. Both masters
then reported role standby with leader_address = that master, for good: no master served and every
store client failed "Failed to connect to master". Restarting that master drops its etcd client and
lease; the view expires and the masters elect again.

Stuck = /health answers role standby and leader_address is this master's own RPC address, for
--stuck-seconds in a row. Then `systemctl restart <unit>`, and no second restart for --grace seconds.

--textfile PATH: each sample also writes pd_mooncake_master_leader (1 = /health says role leader, else 0) for the
node exporter's textfile collector, and 0 when the watchdog stops (it stops with its master): the masters export
no leader metric of their own, and the monitoring role's leader-change alert counts this gauge's changes.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request


def stuck(health, self_addr):
    """A master that the view names as leader but that does not lead."""
    return (isinstance(health, dict) and health.get('role') == 'standby'
            and health.get('leader_address') == self_addr)


class Watch:
    """Decides, one health sample at a time, when to restart."""

    def __init__(self, self_addr, stuck_seconds, grace):
        self.self_addr, self.stuck_seconds, self.grace = self_addr, stuck_seconds, grace
        self.since = None
        self.quiet_until = 0.0

    def step(self, health, now):
        """True when the master must be restarted now."""
        if now < self.quiet_until or not stuck(health, self.self_addr):
            self.since = None if now >= self.quiet_until else self.since
            return False
        self.since = now if self.since is None else self.since
        if now - self.since < self.stuck_seconds:
            return False
        self.since, self.quiet_until = None, now + self.grace
        return True


LEADER_METRIC = ('# HELP pd_mooncake_master_leader 1 when this Mooncake master leads (its /health role), else 0.\n'
                 '# TYPE pd_mooncake_master_leader gauge\npd_mooncake_master_leader %d\n')


def write_leader(path, health):
    """The leader gauge into path, atomically (the collector never reads half a file)."""
    leader = isinstance(health, dict) and health.get('role') == 'leader'
    tmp = '%s.%d.tmp' % (path, os.getpid())
    with open(tmp, 'w') as f:
        f.write(LEADER_METRIC % leader)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return leader


def fetch(url, timeout):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read().decode() or '{}')
    except (OSError, ValueError):
        return None  # down or restarting: systemd restarts a dead master, nothing to do here


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--health-url', required=True, help='the master /health, e.g. http://10.0.0.11:9003/health')
    ap.add_argument('--self', required=True, dest='self_addr', help='this master RPC address as the view names it (ip:port)')
    ap.add_argument('--unit', default='mooncake-master.service')
    ap.add_argument('--interval', type=float, default=5)
    ap.add_argument('--stuck-seconds', type=float, default=30)
    ap.add_argument('--grace', type=float, default=60, help='no second restart within this many seconds')
    ap.add_argument('--textfile', help='write pd_mooncake_master_leader here (the node exporter textfile collector)')
    a = ap.parse_args(argv)
    watch = Watch(a.self_addr, a.stuck_seconds, a.grace)
    print('watching %s for a stuck election on %s' % (a.health_url, a.self_addr), flush=True)
    if a.textfile:
        def stop(signum, frame):
            write_leader(a.textfile, None)  # stopped with its master: not the leader
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
    while True:
        health = fetch(a.health_url, timeout=min(a.interval, 5))
        if a.textfile:
            try:
                write_leader(a.textfile, health)
            except OSError as e:  # the collector's directory is gone: keep watching the election
                print('cannot write %s: %s' % (a.textfile, e), flush=True)
        if watch.step(health, time.monotonic()):
            print('stuck for %ss: role standby while the view names this master (%s); restarting %s'
                  % (a.stuck_seconds, health, a.unit), flush=True)
            res = subprocess.run(['systemctl', 'restart', a.unit], capture_output=True, text=True)
            print('systemctl restart %s: rc=%d %s' % (a.unit, res.returncode, res.stderr.strip()), flush=True)
        time.sleep(a.interval)


if __name__ == '__main__':
    sys.exit(main())
