"""Preflight checks of the class entry: the entry (HAProxy + keepalived in front of the routers).

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
import os
import re

from ansible_collections.pd_bundle.serving.plugins.filter import preflight as _pf

from .core import _address, _cfgs, _int, _j, _option, _tls_path_problem, _unusable, check, refuse


# --- the entry (HAProxy + keepalived in front of the routers) ------------------------------------------

ENTRY_KEY_NAME_RE = '^[A-Za-z0-9_.-]{1,64}$'
ENTRY_KEY_MIN_LEN = 16
ENTRY_GROUP_FILE = 'group_vars/entry/main.yml'


@check('entry', role='entry')
def entry_keys(cfg, host, groups, specs):
    """An entry host has client keys: a dict of names (map file and access log) to keys (Vault), each key long,
    without blanks, and used by one name only. Keys are never shown."""
    keys = cfg.get('entry_keys')
    if not isinstance(keys, dict) or not keys:
        return [refuse('entry_keys', host, 'is %s: the entry answers 401 to every request without a client key'
                       % ('empty' if isinstance(keys, dict) or keys is None else 'not a dict'),
                       'set entry_keys: {name: key, ...} for the group (%s, the keys from Ansible Vault: '
                       'vault_entry_keys).' % ENTRY_GROUP_FILE)]
    out = [refuse('entry_keys name %s' % _j(n), host, 'is not a name HAProxy\'s map and the access log can carry',
                  'use 1-64 of A-Z a-z 0-9 _ . - (e.g. team-a).')
           for n in keys if not re.match(ENTRY_KEY_NAME_RE, str(n))]
    out += [refuse('entry_keys[%s]' % n, host, 'is %s (value not shown)' % why, 'a random key of %d+ characters '
                   'without blanks, from Ansible Vault (e.g. openssl rand -hex 32).' % ENTRY_KEY_MIN_LEN)
            for n, k in keys.items()
            for why in [('not a string' if not isinstance(k, str) else
                         'shorter than %d characters' % ENTRY_KEY_MIN_LEN if len(k) < ENTRY_KEY_MIN_LEN else
                         'a key with blanks (a Bearer token is one word)' if re.search(r'\s', k) else None)] if why]
    by_key = {}
    for n, k in keys.items():
        by_key.setdefault(str(k), []).append(str(n))
    out += [refuse('entry_keys', host, 'gives one key to the names %s (value not shown): the access log and the rate '
                   'limits could not tell them apart' % ', '.join(sorted(names)), 'a key of its own for each name.')
            for names in by_key.values() if len(names) > 1]
    return out


@check('entry', role='entry')
def entry_rate_limits(cfg, host, groups, specs):
    limits, keys = cfg.get('entry_rate_limits', {}), cfg.get('entry_keys') or {}
    if not isinstance(limits, dict):
        return [refuse('entry_rate_limits', host, 'is not a dict', '{key name: requests per entry_rate_limit_period}, '
                       'or {}.', value=limits)]
    # With model pools a limit may name key/pool (roles/entry/README.md, Model pools).
    pools = {str(p.get('name')) for p in cfg.get('vllm_pools') or [] if isinstance(p, dict)}

    def known(n):
        key, _, pool = str(n).rpartition('/') if str(n) not in keys and '/' in str(n) else (n, '', None)
        return key in keys and (pool is None or pool in pools)
    out = [refuse('entry_rate_limits names %s' % _j(n), host, ', which is no name in entry_keys (%s)%s'
                  % (', '.join(sorted(map(str, keys))) if isinstance(keys, dict) else '-',
                     ' nor key/pool of a pool in vllm_pools (%s)' % ', '.join(sorted(pools)) if pools else ''),
                  'use a name of entry_keys, or key/pool with a pool of vllm_pools.' if pools else 'use a name of entry_keys.')
           for n in limits if not isinstance(keys, dict) or not known(n)]
    out += [refuse(var, host, 'is not a count of requests', 'an integer >= 0 (0 = no limit).', value=v)
            for var, v in [('entry_rate_limits[%s]' % n, v) for n, v in limits.items()]
            + [('entry_rate_limit_default', cfg.get('entry_rate_limit_default', 0))]
            if isinstance(v, bool) or not _pf.is_intlike(v) or int(v) < 0]
    return out


@check('entry', role='entry')
def entry_key_models(cfg, host, groups, specs):
    """With model pools, the pools each key may call: a key of entry_keys to a list of pool names of vllm_pools. A
    typo must not leave a key unrestricted, and a model name where a pool name belongs must say so."""
    access, keys = cfg.get('entry_key_models') or {}, cfg.get('entry_keys') or {}
    if not access:
        return []
    pools = {str(p.get('name')): str(p.get('served_model_name') or p.get('model') or '')
             for p in cfg.get('vllm_pools') or [] if isinstance(p, dict)}
    if not isinstance(access, dict):
        return [refuse('entry_key_models', host, 'is not a dict', '{key name: [pool name, ...]}, or {}.', value=access)]
    if not pools:
        return [refuse('entry_key_models', host, 'is set but vllm_pools is not: every key calls the one model',
                       'set vllm_pools (docs/pools.md) or remove entry_key_models.')]
    names = ', '.join(sorted(map(str, keys))) if isinstance(keys, dict) else '-'
    out = [refuse('entry_key_models names %s' % _j(k), host, ', which is no name in entry_keys (%s)' % names,
                  'use a name of entry_keys.') for k in access if not isinstance(keys, dict) or k not in keys]
    by_model = {m: n for n, m in pools.items()}
    for k, allowed in access.items():
        if not isinstance(allowed, (list, tuple)) or not allowed:
            out.append(refuse('entry_key_models[%s]' % k, host, 'is not a list of pool names: the key could call '
                              'nothing', 'a list of pools of vllm_pools (%s), or drop the key to let it call every '
                              'pool.' % ', '.join(sorted(pools)), value=allowed))
            continue
        for p in allowed:
            if str(p) not in pools:
                out.append(refuse('entry_key_models[%s]' % k, host, 'names %s, which is no pool of vllm_pools (%s)%s'
                                  % (_j(p), ', '.join(sorted(pools)), '; it is the model of pool %s' % by_model[str(p)]
                                     if str(p) in by_model else ''),
                                  'list pool names (a model upgrade keeps them).', value=list(allowed)))
    return out


@check('entry', role='entry')
def entry_prefix_balance(cfg, host, groups, specs):
    """The prefix balance hashes bytes HAProxy holds: at least a prompt's start, at most its buffer. Types are the
    spec's to refuse (_int skips them); the defaults named in the fixes are the spec's."""
    if str(cfg.get('entry_router_balance')) != 'prefix':
        return []
    out = []
    n, buf = _int(cfg.get('entry_prefix_hash_bytes')), _int(cfg.get('entry_bufsize'))
    if n is not None and not (64 <= n and (buf is None or n <= buf)):
        out.append(refuse('entry_prefix_hash_bytes', host, ': the prefix balance hashes this many bytes of each '
                          'request body (fewer than 64 hold little of a prompt; more than entry_bufsize=%s are not '
                          'buffered)'

                          % _j(cfg.get('entry_bufsize')), 'an integer from 64 to entry_bufsize (default %s).'
                          % _option(specs, 'entry_prefix_hash_bytes', 'entry').get('default'), shown=n))
    f = _int(cfg.get('entry_hash_balance_factor'))
    if f is not None and not (f == 0 or f > 100):
        out.append(refuse('entry_hash_balance_factor', host, 'is no bound HAProxy takes (a % of the average load)',
                          '0 (no bound) or an integer above 100 (default %s).'
                          % _option(specs, 'entry_hash_balance_factor', 'entry').get('default'), shown=f))
    return out


@check('entry', role='entry')
def entry_tls_files(cfg, host, groups, specs):
    """Operator-given certificate and key: both or neither, and both on the controller (preflight runs there)."""
    cert, key = str(cfg.get('entry_tls_cert_file') or ''), str(cfg.get('entry_tls_key_file') or '')
    if not cert and not key:
        return []
    if not cert or not key:
        return [refuse('entry_tls_cert_file', host, 'entry_tls_cert_file=%s and entry_tls_key_file=%s on %s: one '
                       'without the other' % (_j(cert), _j(key), host), 'give both (a certificate and its key) or '
                       'neither (a certificate from the bundle\'s entry CA).', whole=True)]
    return [refuse(var, host, 'is not a file on the controller', 'the path of the PEM %s on the machine that runs '
                   'ansible-playbook.' % what, value=path)
            for var, path, what in [('entry_tls_cert_file', cert, 'certificate chain'), ('entry_tls_key_file', key, 'key')]
            if not _tls_path_problem(path, 'controller') and not os.path.isfile(os.path.expanduser(path))]


def _entry_net(ip, prefix):
    import ipaddress
    return ipaddress.ip_interface('%s/%s' % (ip, prefix)).network


@check('entry', scope='fleet')
def entry_vip(hostvars, host, groups, specs):
    """With 2+ entry hosts keepalived holds entry_vip: one VIP, VRRP id and password for the group, an interface
    on every host, and the VIP in every entry host's subnet (host address / entry_vip_prefix), none's own."""
    import ipaddress
    entries = list(groups.get('entry') or [])
    cfgs = _cfgs(hostvars, entries)
    if len(entries) < 2 or not cfgs:
        return []
    out = []
    for var in ('entry_vip', 'entry_vip_prefix', 'entry_vrrp_router_id', 'entry_vrrp_password'):
        values = {}
        for h, c in cfgs:
            values.setdefault(str(c.get(var)), []).append(h)
        if len(values) > 1:
            out.append(refuse(var, host, '%s differs between the entry hosts (checked on %s): %s'
                              % (var, host, '; '.join('%s: %s' % (', '.join(hs), '(not shown)'
                                                                  if var == 'entry_vrrp_password' else v)
                                                      for v, hs in sorted(values.items()))),
                              'set it once for the group (%s).' % ENTRY_GROUP_FILE, whole=True))
    if out:
        return out
    h0, c = cfgs[0]
    vip, prefix = c.get('entry_vip'), c.get('entry_vip_prefix', 24)
    if isinstance(vip, str) and vip.strip() and _unusable(vip):
        return []  # loopback, bind-any, a port suffix, ...: addresses_reachable names it on every entry host
    if not vip or not _pf.is_ip(vip) or ':' in str(vip):
        return [refuse('entry_vip', h0, ': with %d entry hosts (%s) keepalived needs the IPv4 address clients use'
                       % (len(entries), ', '.join(entries)), 'set entry_vip to a free address in the entry hosts\' '
                       'subnet (%s).' % ENTRY_GROUP_FILE, value=vip)]
    if isinstance(prefix, bool) or not _pf.is_intlike(prefix) or not 1 <= int(prefix) <= 32:
        return [refuse('entry_vip_prefix', h0, 'is not a prefix length', 'the entry hosts\' subnet prefix, 1-32 (e.g. '
                       '24).', value=prefix)]
    rid, pw = c.get('entry_vrrp_router_id'), c.get('entry_vrrp_password')
    if isinstance(rid, bool) or not _pf.is_intlike(rid) or not 1 <= int(rid) <= 255:
        out.append(refuse('entry_vrrp_router_id', h0, 'is not a VRRP id', '1-255, unique among the VRRP groups of that '
                          'network.', value=rid))
    if not isinstance(pw, str) or not 1 <= len(pw) <= 8:
        out.append(refuse('entry_vrrp_password', h0, 'is %s (value not shown): keepalived\'s VRRPv2 PASS '
                          'authentication keeps 1-8 characters' % ('not set' if not pw else 'not 1-8 characters'),
                          'set vault_entry_vrrp_password to 8 random characters (e.g. openssl rand -hex 4) in Ansible '
                          'Vault.'))
    for h, hc in cfgs:
        if not str(hc.get('entry_vip_interface') or '').strip():
            out.append(refuse('entry_vip_interface', h, 'entry_vip_interface is not set for %s (checked on %s): '
                              'keepalived adds entry_vip to that interface' % (h, host),
                              'set entry_vip_interface (e.g. eth0) for the group or in host_vars/%s.yml.' % h,
                              whole=True))
        ip, source = _address(hostvars, h)
        if not _pf.is_ip(ip):
            continue  # addresses_usable refuses it
        if ipaddress.ip_address(ip) == ipaddress.ip_address(vip):
            out.append(refuse('entry_vip', h, 'entry_vip=%s is the address of %s (%s; checked on %s)'
                              % (vip, h, source, host), 'a free address for the VIP.', whole=True))
        elif ':' not in ip and ipaddress.ip_address(vip) not in _entry_net(ip, prefix):
            out.append(refuse('entry_vip', h, 'entry_vip=%s is outside the subnet of %s (%s=%s, entry_vip_prefix=%s: '
                              '%s; checked on %s): no client on that network could reach it there'
                              % (vip, h, source, ip, prefix, _entry_net(ip, prefix), host),
                              'a free address in %s, or the right entry_vip_prefix.' % _entry_net(ip, prefix),
                              whole=True))

    return out
