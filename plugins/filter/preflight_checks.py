"""The preflight role's filters. The checks themselves, their registry and runner are the package
plugins/plugin_utils/preflight/ (one module per group of check classes; its docstring describes the inputs):

- preflight_host_errors(cfg, host, groups, specs, skip):  every per-host check, for one host
- preflight_hosts_errors(cfgs, groups, specs, skip):  the same for every host of cfgs ({host: cfg}), in one task
- preflight_fleet_errors(hostvars, groups, specs, skip, host, phase, cfgs): the whole-inventory checks, run once
- preflight_checks_of(settings, ids, host, groups): the named checks only (a role's own preflight)
"""
from ansible_collections.pd_bundle.serving.plugins.plugin_utils.preflight import (checks_of, fleet_errors, host_errors,
                                                                             hosts_errors)


class FilterModule(object):
    def filters(self):
        return {
            'preflight_host_errors': host_errors,
            'preflight_hosts_errors': hosts_errors,
            'preflight_fleet_errors': fleet_errors,
            'preflight_checks_of': checks_of,
        }
