"""Preflight check of the class fleet: a role's variable set for a host that does not run the role, where nothing
reads it (issue 45: no setting silently ignored).

Which code reads a variable is read from the bundle's own files (readers()): a role reads what its tasks, handlers,
vars, defaults, meta and its directory of templates/ name; a plugin outside preflight may read any host's value, so a
variable a plugin names is never refused. Unit-tested in tests/unit/test_preflight_scope.py.
"""
import collections
import functools
import os
import re

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import preflight as _pf

from .core import _cfgs, _j, check, refuse

# The roles whose plays run on their own groups only (playbooks/etcd.yml hosts: etcd, mooncake_master.yml:
# mooncake_master, router.yml: vllm_router, entry.yml: entry; tests/unit/test_preflight_scope.py reads the playbooks):
# a host outside those groups never runs them. The other roles run on several kinds of host (common, firewall,
# monitoring's exporters, vllm on spares, mooncake under vllm), so "outside the role" says nothing there.
SCOPED_ROLES = ('etcd', 'mooncake_master', 'vllm_router', 'entry')

# The collection's root (this file is plugins/plugin_utils/preflight/scope.py in a clone and an installed collection).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_ROLE_DIRS = ('tasks', 'handlers', 'templates', 'vars', 'defaults', 'files')
_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')


def _names(path):
    try:
        with open(path, encoding='utf-8', errors='replace') as fh:
            return set(_NAME.findall(fh.read()))
    except OSError:
        return set()


def _walk(top):
    for base, _, files in os.walk(top):
        for f in files:
            yield os.path.join(base, f)


@functools.lru_cache(maxsize=4)
def readers(root=_ROOT):
    """{name: set of readers}: each role whose files name it (its own role directory and templates/ROLE/), and
    'plugins' when a plugin outside preflight's own code names it (a filter may read it from any host's hostvars)."""
    out = collections.defaultdict(set)
    roles_dir = os.path.join(root, 'roles')
    for role in sorted(os.listdir(roles_dir)) if os.path.isdir(roles_dir) else []:
        paths = [p for d in _ROLE_DIRS for p in _walk(os.path.join(roles_dir, role, d))]
        paths += [os.path.join(roles_dir, role, 'meta', 'main.yml')]
        paths += list(_walk(os.path.join(root, 'templates', role)))
        for p in paths:
            for name in _names(p):
                out[name].add(role)
    plugins = os.path.join(root, 'plugins')
    own = (os.path.join(plugins, 'plugin_utils', 'preflight') + os.sep, os.path.join(plugins, 'filter', 'preflight'))
    for p in _walk(plugins):
        if p.endswith('.py') and not p.startswith(own):
            for name in _names(p):
                out[name].add('plugins')
    return out


def _fleet_value(values):
    """The value group_vars/all gives every host outside the role, from the values of all of them (the caller passes
    them only when every such host has the variable): the most common one (a host or group override differs from
    it); None when two values tie."""
    counts = collections.Counter(values).most_common(2)
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None
    return counts[0][0]


@check('fleet', scope='fleet')
def role_scope(hostvars, host, groups, specs):
    """A variable of etcd, mooncake_master, vllm_router or entry set for a host outside that role's groups (its
    host_vars or one of its groups), where no other role and no plugin reads it: the host never runs the role, so the
    value is read nowhere. Refused rather than silently ignored; group_vars/all's value (on every host alike) is not
    one, and a value read by another role or a plugin is left alone."""
    found = readers()
    # The bundle's hosts: an inventory may hold others (a bastion, localhost) that run none of its roles. Which
    # variables a host's inventory sets: the names of its hostvars, read once (ansible-core merges and templates a
    # host's variables on every access: 7 s on the lab when asked per variable); their values from its effective
    # settings (plain data, the inventory's value where it sets one).
    cfgs = dict(_cfgs(hostvars, _bundle.bundle_hosts(groups)))
    everyone = list(cfgs)
    names = {h: set(hostvars[h]) for h in everyone}
    # Each host's groups, from groups (hostvars' group_names would merge its variables again).
    group_names = {h: [g for g, members in groups.items() if h in (members or [])] for h in everyone}
    out = []
    for spec in specs:
        role = spec.get('role')
        if role not in SCOPED_ROLES:
            continue
        # Whether a host runs the role: the one rule the argument-spec check uses (preflight.py's _runs).
        outside = [h for h in everyone if not _pf._runs(spec, group_names[h])]
        for var in spec.get('options') or {}:
            if found.get(var, set()) - {role}:
                continue
            having = [h for h in outside if var in names[h]]
            if not having:
                continue
            fleet = None
            if len(having) == len(outside):
                fleet = _fleet_value([_j(cfgs[h].get(var)) for h in outside])
                if fleet is None:
                    continue  # every host has it and two values tie: which one group_vars/all sets is unknown
            for h in having:
                if fleet is not None and _j(cfgs[h].get(var)) == fleet:
                    continue
                out.append(refuse(var, h, 'is ignored: %s does not run the %s role (its hosts: the group%s %s), and '
                                  'no role or plugin on it reads %s (checked on %s)'
                                  % (h, role, '' if len(spec.get('groups') or []) == 1 else 's',
                                     ', '.join(spec.get('groups') or []), var, host),
                                  'set %s in group_vars/%s (or the host_vars of one of its hosts), or in group_vars/all '
                                  'for every host; remove it from the host_vars of %s and the group_vars of its other '
                                  'groups.' % (var, (spec.get('groups') or [role])[0], h),
                                  value=cfgs[h].get(var)))
    return out
