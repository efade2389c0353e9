#!/usr/bin/env bash
# Run a command at the lowest CPU and IO priority this machine offers, for work that asserts no time (make test runs
# the preflight, render and core-range tests this way beside the labs: they fill the CPU the labs leave idle).
# nice alone does not do it: with autogroup scheduling (kernel.sched_autogroup_enabled=1, Debian's default) nice only
# ranks the processes of one session against each other, and every session weighs the same. So the command gets a
# session of its own (setsid) and that session's group gets nice 19 (/proc/self/autogroup); docker's containers sit
# in their own cgroup, which then outweighs it too. ionice -c3: disk only when no one else wants it.
#   scripts/background.sh COMMAND [ARGS...]
set -euo pipefail
if [[ -z "${PD_BACKGROUND_SESSION:-}" ]]; then
  PD_BACKGROUND_SESSION=1 exec setsid "$0" "$@"
fi
[[ -w /proc/self/autogroup ]] && echo 19 > /proc/self/autogroup 2>/dev/null || true
exec nice -n 19 ionice -c3 "$@"
