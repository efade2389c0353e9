"""The runner: which checks apply where, and their messages (a check that raises becomes one naming it).
The filters of plugins/filter/preflight_checks.py call host_errors, fleet_errors and checks_of."""
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


def fleet_errors(hostvars, groups, specs, skip=None, host=None, phase=None):
    """Every fleet-wide check's messages (phase groups or fleet; None: both), checked on host."""
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
