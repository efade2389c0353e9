"""Preflight checks of the class addresses: every cluster member at a distinct, usable address.

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import preflight as _pf

from .core import (WILDCARD_WORDS, _address, _cfgs, _iname, _instances, _j, _option, _port_suffix, _roles, _unusable,
                   _vllm_hosts, check, refuse)


# --- addresses: every cluster member at a distinct, usable address ---------------------------------------------


# Every address setting another host (or a client) must reach, but the host's own (common_host_ip / ansible_host,
# and an instance's host_ip: addresses_usable and addresses_distinct, fleet-wide): the role whose hosts use it, who
# reaches it, the setting of its port, the wildcard that binds every address where a bind address may be one,
# what "" means where it means "derive it", and what to set when not an address of the host itself.
# tests/unit/test_preflight_classes.py ties this table to the argument specs (every *_host, *_address, *_vip option).
REACHABLE = {
    'mooncake_master_rpc_address': {
        'role': 'master', 'port': 'mooncake_master_rpc_port', 'wildcard': None, 'empty': None,
        'by': 'the store clients and the other masters (the HA leader advertises it in etcd: --rpc_address)'},
    'mooncake_master_metrics_host': {
        'role': 'master', 'port': 'mooncake_master_metrics_port', 'wildcard': '0.0.0.0', 'empty': None,
        'by': 'Prometheus (the scrape targets name the host\'s cluster address: --metrics_host)'},
    'vllm_bind_host': {
        'role': 'vllm', 'port': 'vllm_instances[].port', 'wildcard': '0.0.0.0',
        'empty': 'each instance\'s own address, the default', 'by': 'the routers (each instance\'s address)'},
    'vllm_router_host': {
        'role': 'router', 'port': 'vllm_router_port', 'wildcard': '0.0.0.0',
        'empty': 'the host\'s cluster address, the default', 'by': 'the entry hosts and the controller'},
    'vllm_router_prometheus_host': {
        'role': 'router', 'port': 'vllm_router_prometheus_port', 'wildcard': '0.0.0.0', 'empty': None,
        'by': 'Prometheus (the scrape targets name the host\'s cluster address: --prometheus-host)'},
    'entry_bind_address': {
        'role': 'entry', 'port': 'entry_port', 'wildcard': '*', 'empty': 'HAProxy binds every IPv4 address',
        'by': 'the clients (at entry_vip, which keepalived moves between the entry hosts, or the host\'s address)'},
    'entry_vip': {
        'role': 'entry', 'port': 'entry_port', 'wildcard': None, 'empty': 'no VIP: one entry host',
        'by': 'the clients (https://entry_vip, held by keepalived)',
        'value': 'a free IPv4 address in the entry hosts\' subnet'},
}


def _reach_problem(text, a):
    """Why text cannot be the REACHABLE address a (a phrase), None when it can."""
    if not text:
        return None if a['empty'] else 'is empty'
    if text in WILDCARD_WORDS and a['wildcard'] and a['wildcard'] not in WILDCARD_WORDS:
        return 'is %s, a wildcard only HAProxy reads (this service takes an IP)' % _j(text)
    return _unusable(text, a['wildcard'] is not None)


@check('addresses')
def addresses_reachable(cfg, host, groups, specs):
    """Every address of REACHABLE on the hosts that use it: no loopback, no port suffix, no name, a wildcard only
    where a bind address may be one, "" only where it means "derive it"."""
    r, out = _roles(host, groups), []
    for var, a in REACHABLE.items():
        value = cfg.get(var)
        if not r.get(a['role']) or not isinstance(value, str):
            continue  # not this host's role; a templated default (the bundle's own); another type: the spec's
        why = _reach_problem(value.strip(), a)
        if not why:
            continue
        hostport = _port_suffix(value)
        if hostport and hostport[0].strip() and not _reach_problem(hostport[0].strip(), a):
            fix = 'set %s to %s alone and the port in %s' % (var, _j(hostport[0].strip()), a['port'])
        else:
            default = _option(specs, var).get('default')
            fix = 'set %s to %s%s%s%s%s' % (
                var, a.get('value') or 'an IP address of %s that %s reach' % (host, a['by'].split(' (')[0]),
                ' (its port is %s)' % a['port'] if hostport else '',
                ', %s to bind every address' % _j(a['wildcard']) if a['wildcard'] else '',
                ', or "" (%s)' % a['empty'] if a['empty'] else '',
                ', or remove it (default %s)' % default if _pf._is_template(default) else '')
        out.append(refuse(var, host, '%s; it must be reachable by %s' % (why, a['by']), '%s.' % fix, value=value))
    return out


@check('addresses', scope='fleet')
def addresses_usable(hostvars, host, groups, specs):
    """Every bundle host's cluster address (bundle_host_ip) is an IP the others can reach."""
    hosts = sorted(_bundle.bundle_hosts(groups))
    out = []
    for h, _ in _cfgs(hostvars, hosts):
        ip, source = _address(hostvars, h)
        why = _unusable(ip)
        if why:
            out.append(refuse('common_host_ip', host, '%s has no usable cluster address (checked on %s): %s=%s %s; it '
                              'becomes VLLM_HOST_IP, Mooncake\'s local_hostname, the etcd peer URLs and the router\'s '
                              'worker URLs' % (h, host, source, _j(ip), why),
                              'set common_host_ip for %s to its cluster-facing IP.' % h, whole=True))
    return out


@check('addresses', scope='fleet')
def addresses_distinct(hostvars, host, groups, specs):
    """No two bundle hosts, and no instance host_ip of another host, at the same address."""
    hosts = sorted(_bundle.bundle_hosts(groups))
    owners = {}
    for h, _ in _cfgs(hostvars, hosts):
        ip, source = _address(hostvars, h)
        if _unusable(ip) is None:
            owners.setdefault(str(ip), []).append('%s (%s)' % (h, source))
    out = [refuse('common_host_ip', host, 'Hosts %s share the address %s (checked on %s): members '
                  'of one cluster must be reachable at distinct addresses (etcd peers, KV transfer endpoints, the '
                  'router\'s workers)' % (' and '.join(who), ip, host),
                  'give each host its own common_host_ip (or ansible_host).', whole=True)
           for ip, who in sorted(owners.items()) if len(who) > 1]
    by_ip = {ip: [w.split(' ')[0] for w in who] for ip, who in owners.items()}
    for h, cfg in _cfgs(hostvars, _vllm_hosts(groups)):
        for idx, inst in _instances(cfg):
            ip = inst.get('host_ip')
            if not ip or not _pf.is_ip(ip):
                continue  # instances_optional_keys refuses a malformed one
            others = [o for o in by_ip.get(str(ip), []) if o != h]
            why = _unusable(ip)
            if others or why:
                out.append(refuse('vllm_instances[%s].host_ip' % _iname(idx, inst), h, '%s (checked on %s)'
                                  % (why or 'is the address of %s' % ' and '.join(others), host),
                                  'set host_ip to an address of %s itself (or omit it: the host\'s common_host_ip).'
                                  % h,
                                  value=ip))
    return out
