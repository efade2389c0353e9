#!/usr/bin/env bash
# Run a command in the CPU the rest of the machine leaves idle, for work that times nothing (make test runs the
# preflight, render and core-range tests this way beside the docker lab). nice alone does not do it: with autogroup
# scheduling (kernel.sched_autogroup_enabled=1, Debian's default) nice only ranks the processes of one session
# against each other, and every session weighs the same. So, where the kernel has it (5.15+, cgroup v1 or v2), the
# command runs in a cgroup of its own marked cpu.idle: it runs only when nothing else wants the CPU. Elsewhere it gets
# a session of its own (setsid) whose group has nice 19 (/proc/self/autogroup). Always nice 19 and idle IO (ionice -c3).
# Measured on the lab (2 cores, 12 completions through one vLLM instance, 5.0-6.2 s alone): 7.8-10.9 s beside the
# static tier in a nice-19 autogroup, 5.1-10.0 s beside it in a cpu.idle cgroup. vLLM's threads wait on each other,
# so a co-runner still costs them something: the lab's goals are bounds with room, and the tier is done early in it.
#   scripts/background.sh COMMAND [ARGS...]
set -euo pipefail
join_idle_cgroup() {
  local g
  for g in /sys/fs/cgroup/cpu/pd-background /sys/fs/cgroup/pd-background; do
    [[ -d ${g%/*} && -w ${g%/*} ]] || continue
    if [[ $g == /sys/fs/cgroup/pd-background ]]; then  # cgroup v2: the cpu controller must be on for the children
      [[ -f /sys/fs/cgroup/cgroup.controllers ]] || continue
      grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || continue
    fi
    mkdir -p "$g" 2>/dev/null && [[ -w $g/cpu.idle ]] && echo 1 > "$g/cpu.idle" 2>/dev/null \
      && echo $$ > "$g/cgroup.procs" 2>/dev/null && return 0
  done
  return 1
}
if [[ -z "${PD_BACKGROUND_SESSION:-}" ]]; then
  PD_BACKGROUND_SESSION=1 exec setsid "$0" "$@"
fi
if ! join_idle_cgroup; then
  echo "[background] no cgroup with cpu.idle here: a nice-19 session instead" >&2
  [[ -w /proc/self/autogroup ]] && echo 19 > /proc/self/autogroup 2>/dev/null || true
fi
exec nice -n 19 ionice -c3 "$@"
