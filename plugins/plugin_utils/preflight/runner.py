"""The runner: which checks apply where, and their messages (a check that raises becomes one naming it).
The filters of plugins/filter/preflight_checks.py call hosts_errors, fleet_errors and checks_of."""
from collections.abc import Mapping

from .core import CHECKS, _roles


# --- runners ------------------------------------------------------------------------------------------

def _run(checks, args, where):
    """Messages of checks; a check that raises counts only when no other check refused anything (the data
    it choked on is then what the other messages name)."""
    errors, crashes = [], []
    for c in checks:
        try:
            errors.extend(c['fn'](*args))
        except Exception as exc:  # noqa: BLE001 - any crash becomes a message naming the check
            crashes.append('Preflight check %s could not evaluate the settings of %s (%s: %s). Fix: correct the value it '
                           'names; if it looks right, skip the check class %s with preflight_skip and report the bug.'
                           % (c['id'], where, type(exc).__name__, exc, c['skip']))
    return errors or crashes


def applies(c, cfg, host, groups, roles=None):
    """Whether the per-host check c applies to host: it runs the role c was registered for (or c has none). roles:
    _roles(host, groups, cfg) when the caller has it (host_errors works it out once for every check)."""
    if c['role'] is None:
        return True
    return bool((roles if roles is not None else _roles(host, groups, cfg)).get(c['role']))


def selected(scope, skip=None, phase=None):
    return [c for c in CHECKS if c['scope'] == scope and c['skip'] not in (skip or [])
            and (phase is None or c['phase'] == phase)]


def host_errors(cfg, host, groups, specs, skip=None):
    """Every per-host check's messages for host (preflight_skip classes left out; a check registered for a role only
    where host runs it)."""
    cfg, groups = dict(cfg or {}), dict(groups or {})
    roles = _roles(host, groups, cfg)
    return _run([c for c in selected('host', skip) if applies(c, cfg, host, groups, roles)],
                (cfg, host, groups, list(specs or [])), host)


def hosts_errors(cfgs, groups, specs, skip=None):
    """host_errors of every host in cfgs ({host: effective settings}, the play's hosts in order): the preflight play
    runs the per-host checks once for the whole inventory (one task, not one worker per host)."""
    return [m for h, cfg in dict(cfgs or {}).items() for m in host_errors(cfg, h, groups, specs, skip)]


class _HostWithCfg(Mapping):
    """One host's hostvars with '_preflight_cfg' (its effective settings) added, as the fleet checks read it."""

    def __init__(self, hv, cfg):
        self._hv = hv
        self._cfg = cfg

    def __getitem__(self, key):
        return self._cfg if key == '_preflight_cfg' else self._hv[key]

    def __iter__(self):
        yield '_preflight_cfg'
        yield from (k for k in self._hv if k != '_preflight_cfg')

    def __len__(self):
        return len(self._hv) + (0 if '_preflight_cfg' in self._hv else 1)


class _HostvarsWithCfgs(Mapping):
    """hostvars whose hosts in cfgs carry their '_preflight_cfg' (the others, outside a --limit, carry none)."""

    def __init__(self, hostvars, cfgs):
        self._hostvars = hostvars
        self._cfgs = dict(cfgs)

    def __getitem__(self, host):
        hv = self._hostvars[host]
        return _HostWithCfg(hv, self._cfgs[host]) if host in self._cfgs else hv

    def __iter__(self):
        return iter(self._hostvars)

    def __len__(self):
        return len(self._hostvars)


def fleet_errors(hostvars, groups, specs, skip=None, host=None, phase=None, cfgs=None):
    """Every fleet-wide check's messages (phase groups or fleet; None: both), checked on host. cfgs: {host: effective
    settings} when they are not in hostvars as each host's _preflight_cfg (the preflight play loads them once)."""
    if cfgs is not None:
        hostvars = _HostvarsWithCfgs(hostvars, cfgs)
    return _run(selected('fleet', skip, phase), (hostvars, host or 'the controller', dict(groups or {}), list(specs or [])),
                host or 'the fleet')


def checks_of(settings, ids, host, groups):
    """The messages of the named checks only, for a role's own preflight when its playbook runs without the preflight
    play (playbooks/etcd.yml alone): the role calls the one implementation here instead of repeating it in YAML.
    settings: the host's settings for a per-host check (a role passes the ones the check reads), hostvars for a
    fleet check. No specs: the preflight play has validated types; a message's default then reads "see the role
    defaults"."""
    wanted = [c for c in CHECKS if c['id'] in ids]
    unknown = sorted(set(ids) - {c['id'] for c in wanted})
    if unknown:
        raise ValueError('preflight_checks_of: no such check %s (plugins/filter/preflight_checks.py)' % unknown)
    groups, out = dict(groups or {}), []
    for c in wanted:
        if c['scope'] == 'fleet':
            out += _run([c], (settings or {}, host, groups, []), host)
        elif applies(c, dict(settings or {}), host, groups):
            out += _run([c], (dict(settings or {}), host, groups, []), host)
    return out
