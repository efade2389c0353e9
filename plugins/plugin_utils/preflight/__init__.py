"""The preflight role's checks as tested Python: one function per check id, each returning its messages
(an empty list: the inventory passes that check). Unit-tested in tests/unit/test_preflight_checks.py.

The package (controller-side code of the collection, plugins/plugin_utils/preflight/):
- core:       the registry (CHECKS), its decorator @check, refuse (every message's one shape), the helpers and
              constants that more than one group of checks uses
- GROUPS:     one module per group of check classes (settings, instances, fleet, scope, managed, sandbox, addresses, store,
              entry, tls, monitoring, budget), imported below in this order, which is the order of CHECKS and so of the
              messages (tests/unit/test_preflight_messages.py holds it); each imports what it uses from core
- runner:     which checks apply where, and their messages (host_errors, fleet_errors, checks_of)
The filter plugin plugins/filter/preflight_checks.py imports this package by the collection's name and gives the
runner's functions their filter names.

Every message names the variable, the host (the host it was checked on, for fleet-wide checks) and the fix: the
checks build them with refuse(), which refuses a message without one of the three
(tests/unit/test_preflight_messages.py proves that no check formats its own).
The tasks of roles/preflight only call the two filters and assert that the list is empty:

- preflight_hosts_errors(cfgs, groups, specs, skip):  every per-host check, for every host ({host: cfg}), run once
- preflight_fleet_errors(hostvars, groups, specs, skip, host, phase, cfgs): the whole-inventory checks, run once

Inputs are plain data:
- cfg:      a host's effective settings (_preflight_cfg: the roles' defaults overlaid by the inventory)
- groups:   the inventory's groups ({group: [host, ...]})
- specs:    the roles' main argument specs ([{role, file, groups, options}], preflight_load_roles). Types, choices
            and an instance's keys live there only: tasks/argument_specs.yml validates them before these checks
            run, so a check skips a value of another type (tests/unit/test_preflight_checks.py proves that no
            check refuses a value only for what its spec declares). The checks say what a spec cannot: ranges,
            formats, cross-variable rules, and a string where a spec types a list or dict (Ansible's list
            type splits "a,b" on commas and its dict type parses "k=v", but the roles read the value as written).
- hostvars: {host: {'_preflight_cfg': cfg, 'ansible_host': ..., 'common_host_ip': ...}} (Ansible's hostvars
            with cfgs, {host: cfg}, beside it: fleet_errors adds each cfg as the host's _preflight_cfg; the fleet
            checks read each host's cfg and its address as bundle_host_ip does)
- skip:     preflight_skip, the check classes not to run (each check belongs to one class, CHECKS in core)
"""
from . import core
from . import settings, instances, fleet, scope, managed, sandbox, addresses, store, entry, tls, monitoring, budget
from .core import CHECKS, check, refuse
from .runner import applies, checks_of, fleet_errors, host_errors, hosts_errors, selected

# The group modules in the order they register their checks (the import above runs them in this order).
GROUPS = (settings, instances, fleet, scope, managed, sandbox, addresses, store, entry, tls, monitoring, budget)

__all__ = ['CHECKS', 'GROUPS', 'applies', 'check', 'checks_of', 'core', 'fleet_errors', 'host_errors', 'hosts_errors',
           'refuse', 'selected']
