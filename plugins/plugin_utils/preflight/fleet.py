"""Preflight checks of the classes kv_mode, fleet, router, pd_consistency: the whole inventory: one KV mode, distinct
endpoints, the router's overrides, and what prefill and decode must agree on.

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
import re

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import managed as _managed
from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools
from ansible_collections.pd_bundle.serving.plugins.filter import preflight as _pf
from ansible_collections.pd_bundle.serving.plugins.filter import target_rules as _rules

from .core import (_cfgs, _effective, _instances, _is_list, _j, _master_ha, _metadata_backend_set, _store_mode,
                   _tier_hosts, _truthy, _vllm_argv, _vllm_hosts, _vllm_pools, check, refuse)


# --- fleet-wide (once, after the per-host checks) -----------------------------------------------------

@check('kv_mode', scope='fleet')
def kv_mode_consistent(hostvars, host, groups, specs):
    out = []
    for var in ('vllm_kv_connector', 'mooncake_protocol'):
        values = [(h, cfg.get(var)) for h, cfg in _cfgs(hostvars, _vllm_hosts(groups))]
        if len({_j(v) for _, v in values}) > 1:
            # The hosts and their values stand in the sentence: each host is one to fix.
            out.append(refuse(var, values[0][0], '%s differs between prefill and decode hosts (%s): KV moves only '
                              'between instances with the same %s'
                              % (var, ', '.join('%s=%s' % hv for hv in values), var),
                              'set %s once, in group_vars/all.yml, and remove the per-host/per-group overrides.' % var,
                              whole=True))
    return out


@check('kv_mode', scope='fleet')
def kv_mode_store_master(hostvars, host, groups, specs):
    if not _store_mode(hostvars, groups) or groups.get('mooncake_master'):
        return []
    return [refuse('vllm_kv_connector', host, 'vllm_kv_connector=MooncakeStoreConnector (store mode) but the group '
                   'mooncake_master is empty (checked on %s): the store needs a master' % host,
                   'add one host (two or more for HA, with etcd) under mooncake_master:, or use vllm_kv_connector: '
                   'MooncakeConnector (P2P, no master needed).', whole=True)]


@check('kv_mode', scope='fleet')
def kv_mode_store_tier_master(hostvars, host, groups, specs):
    """vllm_store_tier needs a master to store through."""
    tier = _tier_hosts(hostvars, groups)
    if not tier or groups.get('mooncake_master'):
        return []
    return [refuse('vllm_store_tier', host, 'vllm_store_tier is true on %s but the group mooncake_master is empty '
                   '(checked on %s): the store tier puts and finds prefixes through a Mooncake master'
                   % (', '.join(tier), host), 'add one host (two or more for HA, with etcd) under mooncake_master:, or '
                   'set vllm_store_tier: false.', whole=True)]


@check('kv_mode', scope='fleet')
def kv_mode_store_ssd_tier(hostvars, host, groups, specs):
    """vllm_store_ssd is the store tier's SSD: on a prefill host without the tier it would do nothing, silently.
    Store mode ignores both (as vllm_store_tier: the lab's store-mode converge keeps the inventory's settings)."""
    if _store_mode(hostvars, groups):
        return []
    tier = _tier_hosts(hostvars, groups) if groups.get('mooncake_master') else []
    lone = [h for h, cfg in _cfgs(hostvars, (groups or {}).get('vllm_prefill') or [])
            if _truthy(cfg.get('vllm_store_ssd')) and h not in tier]
    if not lone:
        return []
    return [refuse('vllm_store_ssd', host, 'vllm_store_ssd is true on %s, which run no store tier (checked on %s): the '
                   'SSD tier sits behind the store tier\'s memory (vllm_store_tier: true and a mooncake_master group; '
                   'store mode ignores both)' % (', '.join(lone), host),
                   'set vllm_store_tier: true there, or vllm_store_ssd: false.', whole=True)]


@check('kv_mode', scope='fleet')
def kv_mode_store_metadata(hostvars, host, groups, specs):
    if not _store_mode(hostvars, groups):  # the store tier's clients handshake directly (P2PHANDSHAKE)
        return []
    backend = _bundle.metadata_backend(_metadata_backend_set(hostvars, groups), _master_ha(hostvars, groups)[1])
    masters = list(groups.get('mooncake_master') or [])
    if backend == 'etcd' and not groups.get('etcd'):
        missing, fix = 'the etcd group is empty', 'add 1, 3 or 5 hosts under etcd:, or set mooncake_metadata_backend: http'
    elif backend == 'http' and masters and str(
            (_cfgs(hostvars, masters[:1]) or [(None, {})])[0][1].get('mooncake_master_http_metadata_server', 'auto')
            ).strip().lower() in ('false', 'no', 'off', '0'):
        missing = 'the first master does not run its HTTP metadata server (mooncake_master_http_metadata_server)'
        fix = 'set mooncake_master_http_metadata_server: auto (or true), or mooncake_metadata_backend: etcd with an etcd group'
    else:
        return []  # no master at all: kv_mode_store_master
    return [refuse('mooncake_metadata_backend', host, 'mooncake_metadata_backend=%s in store mode (checked on %s), '
                   'but %s' % (backend, host, missing), '%s.' % fix, whole=True)]


@check('kv_mode', scope='fleet')
def kv_mode_ha_metadata(hostvars, host, groups, specs):
    if not _store_mode(hostvars, groups) or not _master_ha(hostvars, groups)[1] \
            or _metadata_backend_set(hostvars, groups) != 'http':
        return []
    return [refuse('mooncake_metadata_backend', host, 'mooncake_metadata_backend=http with %d HA masters in store mode '
                   '(checked on %s): the metadata would live in the first master\'s memory, and restarting that '
                   'master, leader or standby, loses every engine\'s segment metadata (store transfers fail until vLLM '
                   'restarts)'
                   % (len(groups.get('mooncake_master') or []), host), 'set mooncake_metadata_backend: auto (or etcd), '
                   'or run one master (mooncake_master_ha: false).', whole=True)]


def _endpoints(hostvars, hosts):
    """bundle_vllm_endpoints over the hosts that have settings: the list the router role builds (a host whose
    vllm_instances is no list of dicts is left out: its spec refuses it)."""
    insts = [(h, cfg.get('vllm_instances', [])) for h, cfg in _cfgs(hostvars, hosts)]
    return _bundle.vllm_endpoints([h for h, i in insts if _is_list(i) and all(isinstance(x, dict) for x in i)],
                                  hostvars, '_preflight_cfg')


@check('fleet', scope='fleet')
def fleet_addresses(hostvars, host, groups, specs):
    prefills = set(groups.get('vllm_prefill') or [])
    endpoints = []
    for i in _endpoints(hostvars, _vllm_hosts(groups)):
        endpoints.append({'host': i['host'], 'label': 'vllm_instances[%s].port' % i['name'], 'ip': i['ip'], 'port': i['port']})
        if i['host'] in prefills:
            endpoints.append({'host': i['host'], 'label': 'vllm_instances[%s].bootstrap_port' % i['name'], 'ip': i['ip'],
                              'port': i['bootstrap_port']})
    conflicts = _pf.endpoint_conflicts(endpoints)
    if not conflicts:
        return []
    # The variables (vllm_instances[NAME].port, ...) are in the conflicts.
    return [refuse('vllm_instances', host, 'Address collision across hosts (checked on %s): %s'
                   % (host, '; '.join(conflicts)),

                   'give each instance its own host_ip/common_host_ip and port.', whole=True)]


@check('fleet', scope='fleet')
def fleet_engine_ids(hostvars, host, groups, specs):
    dups = _pf.duplicates([i['engine_id'] for i in _endpoints(hostvars, _vllm_hosts(groups))])
    if not dups:
        return []
    return [refuse('engine_id', host, 'vllm_instances engine_id(s) %s are used by more than one instance (checked on '
                   '%s): decode finds prefill KV by engine id' % (', '.join(str(d) for d in dups), host),
                   'make every engine_id unique, or omit it (default HOST-NAME).', whole=True)]


@check('router', scope='fleet')
def router_overrides(hostvars, host, groups, specs):
    """The router's prefill/decode override lists name instances of the inventory (bundle_vllm_endpoints)."""
    prefills = [{'url': i['url'], 'bootstrap_port': i['bootstrap_port'], 'where': 'vllm_instances[%s] on %s' % (i['name'], i['host'])}
                for i in _endpoints(hostvars, groups.get('vllm_prefill') or [])]
    decodes = [{'url': i['url'], 'where': 'vllm_instances[%s] on %s' % (i['name'], i['host'])}
               for i in _endpoints(hostvars, groups.get('vllm_decode') or [])]
    out = []
    for router, rc in _cfgs(hostvars, groups.get('vllm_router') or []):
        errors = _pf.router_override_errors(rc.get('vllm_router_prefill_urls', []), rc.get('vllm_router_decode_urls', []),
                                            prefills, decodes)
        if errors:
            # The variables (vllm_router_prefill_urls, vllm_router_decode_urls) are in the errors.
            out.append(refuse('vllm_router_', router, 'On router %s: %s' % (router, '; '.join(errors)), 'correct the '
                              'list, or set it to [] so the router gets every instance of the vllm_prefill / '
                              'vllm_decode hosts.', whole=True))

    return out


# --- model pools (docs/pools.md) ------------------------------------------------------------------------

@check('fleet', scope='fleet')
def pools_valid(hostvars, host, groups, specs):
    """vllm_pools names each prefill and decode instance and each router once, with hosts of the right groups, one
    served model name per pool (plugins/filter/pools.py pool_problems)."""
    written, names = _vllm_pools(hostvars, groups)
    if not isinstance(written, list) or not all(isinstance(p, dict) for p in written):
        return []  # the common role's spec (a list of dicts) refuses it first
    # Named on the host it is checked on, as every fleet check's message; the pool's hosts are in the problem.
    return [refuse(var, host, problem, fix) for var, _, problem, fix in _pools.pool_problems(written, groups, names)]


# What a model pool sets for every instance it names (plugins/filter/pools.py, templates/vllm/instance.env.j2): the
# variable, the pool's key that wins over it, and whether the pool always sets it or only when it writes that key.
# A host whose every instance serves in pools that set it never reads the host's own value (issue 45: no setting
# silently ignored). The model and its source are the pools' on every host with a pooled instance (bundle_host_models).
POOL_OVERRIDES = (('vllm_model', 'model', True), ('vllm_model_src', 'model_src', True),
                  ('vllm_served_model_name', 'served_model_name', True),
                  ('vllm_model_revision', 'model_revision', False),
                  ('vllm_max_model_len', 'settings.vllm_max_model_len', False),
                  ('vllm_extra_args', 'settings.vllm_extra_args', False))
_MISSING = object()


def _all_scope(hostvars, groups, var):
    """VAR's value where group_vars/all sets it: the most common value among the hosts that run no vLLM instance
    (a pooled host's own value that differs from it was set for that host or one of its groups); _MISSING when none
    of them has it (all sets nothing, or there is no such host)."""
    vllm = set(_vllm_hosts(groups)) | set(groups.get('vllm_spare') or [])
    seen = [_j(hostvars[h][var]) for h in groups.get('all') or hostvars if h not in vllm and h in hostvars
            and var in hostvars[h]]
    return max(set(seen), key=seen.count) if seen else _MISSING


@check('fleet', scope='fleet')
def pools_override(hostvars, host, groups, specs):
    """A model, served name, revision, max model length or extra arguments set for a host (its host_vars or a group
    of it) whose every instance serves in model pools that set it themselves: the pools' value wins and the host's
    is read nowhere. Refused rather than silently ignored; group_vars/all's value (the fleet default, also what a
    spare host is provisioned with) is not one."""
    written, names = _vllm_pools(hostvars, groups)
    if not isinstance(written, list) or not all(isinstance(p, dict) for p in written) \
            or _pools.pool_problems(written, groups, names):
        return []  # no pools (one implicit pool: every host's own values), or pools_valid refuses them
    pools = _pools.normalize_pools(written, groups, names)
    bases = {var: _all_scope(hostvars, groups, var) for var, _, _ in POOL_OVERRIDES}
    out = []
    for h in _vllm_hosts(groups):
        if h not in hostvars or not names.get(h):
            continue
        mine = [(w, p) for w, p in zip(written, pools) if str(h) in _pools.pool_hosts(p)]
        if not mine or any(_pools.pool_of(pools, h, i) is None for i in names[h]):
            continue  # an instance in no pool is pools_valid's
        for var, key, always in POOL_OVERRIDES:
            if var not in hostvars[h]:
                continue
            value, base = hostvars[h][var], bases[var]
            if base is not _MISSING and _j(value) == base:
                continue
            top, _, sub = key.partition('.')
            if not always and not all(sub in (w.get(top) or {}) if sub else top in w for w, _ in mine):
                continue  # a pool of this host leaves it to the host: the host's value is read there
            winning = ', '.join('%s (%s: %s)' % (p['name'], key, _j(p[top] if always else (w[top][sub] if sub else w[top])))
                                for w, p in mine)
            out.append(refuse(var, h, 'is ignored: every instance of %s serves in a model pool that sets it itself, '
                              'and the pool wins: %s (checked on %s)' % (h, winning, host),
                              'remove %s from the host_vars of %s and the group_vars of its groups (group_vars/all '
                              'may keep the fleet default), or set it in the pool: vllm_pools[].%s.' % (var, h, key),
                              value=value))
    return out


# --- prefill/decode consistency (fleet): what KV shape and request length depend on ---------------------

def _pool_cfg(cfg, pool):
    """A host's settings as its instances of POOL run them: the pool's model, served name, revision and settings
    over the host's (the implicit pool of an inventory without vllm_pools: the host's, unchanged)."""
    if pool is None or pool.get('implicit'):
        return cfg
    out = dict(cfg, vllm_model=pool['model'], vllm_served_model_name=pool['served_model_name'],
               vllm_model_revision=pool['model_revision'])
    out.update(pool.get('settings') or {})
    return out


def _pd_instances(hostvars, groups):
    """{pool name: [(side, host, instance, argv)]} of every prefill and decode instance that has settings, by the
    model pool it serves in (one pool, named by pools.DEFAULT_POOL, without vllm_pools); instances that vllm_pools
    leaves out are pools_valid's."""
    written, names = _vllm_pools(hostvars, groups)
    pools = _pools.normalize_pools(written if not _pools.pool_problems(written, groups, names) else None,
                                   groups, names)
    out = {}
    for side, group in (('prefill', 'vllm_prefill'), ('decode', 'vllm_decode')):
        for h, cfg in _cfgs(hostvars, groups.get(group) or []):
            for _, inst in _instances(cfg):
                pool = _pools.pool_of(pools, h, inst.get('name')) if isinstance(inst, dict) else None
                if pool is not None:
                    out.setdefault(pool['name'], []).append((side, h, inst, _vllm_argv(_pool_cfg(cfg, pool), inst)))
    return out


def _of_pool(name):
    """' of pool NAME' in a message about an explicit pool's instances; '' for the implicit one (its messages are
    those of the bundle before pools)."""
    return '' if name == _pools.DEFAULT_POOL else ' of pool %s' % name


def _who(items, limit=4):
    names = ['%s/%s' % (h, i.get('name')) for h, i in items]
    return ', '.join(names[:limit]) + (' and %d more' % (len(names) - limit) if len(names) > limit else '')


@check('pd_consistency', scope='fleet')
def pd_engine_equal(hostvars, host, groups, specs):
    """Every setting of target_rules.PD_EQUAL has one value on every prefill and decode instance."""
    out = []
    for pool, insts in _pd_instances(hostvars, groups).items():
        out += _pd_engine_equal(insts, host, pool)
    return out


def _pd_engine_equal(insts, host, pool):
    out = []
    for flag, why in _rules.PD_EQUAL.items():
        by_value = {}
        for side, h, inst, argv in insts:
            value, source = _effective(argv, flag)
            key = _rules.pd_value(flag, value)
            by_value.setdefault(key, []).append((side, h, inst, value, source))
        if len(by_value) < 2:
            continue
        parts, sources = [], []
        for key, items in by_value.items():
            srcs = sorted({s for *_, s in items if s})
            sources += [s for s in srcs if s not in sources]
            sides = sorted({i[0] for i in items})
            shown = 'unset (vLLM\'s default)' if key is None else _j(items[0][3])
            parts.append('%s on %s %s%s' % (shown, '/'.join(sides), _who([(i[1], i[2]) for i in items]),
                                             ' (from %s)' % ', '.join(srcs) if srcs else ''))
        managed = _managed.managed_flag(flag)
        var = managed['vars'] if managed and 'appends' not in managed and re.match(r'^[a-z_]+$', managed['vars']) else None
        if pool != _pools.DEFAULT_POOL:
            fix = ('give %s one value for every prefill and decode instance of pool %s: set it in the pool '
                   '(vllm_pools: model, served_model_name, settings) and remove the per-group, per-host and '
                   'per-instance values' % (var or flag, pool))
        elif var:
            fix = ('set %s once for every prefill and decode host (group_vars/all.yml) and remove the per-group, '
                   'per-host and extra-args values' % var)
        else:
            fix = ('give %s one value for every prefill and decode instance: put it once in group_vars/all.yml '
                   'vllm_extra_args and remove it from the per-group, per-host and per-instance extra_args' % flag)
        out.append(refuse(flag, host, 'Prefill and decode%s disagree on %s (checked on %s): %s. It must be equal: %s'
                          % (_of_pool(pool), flag, host, '; '.join(parts), why), '%s.' % fix, whole=True))
    return out


@check('pd_consistency', scope='fleet')
def pd_tp_layout(hostvars, host, groups, specs):
    """Prefill and decode tensor parallelism: one a multiple of the other (target_rules.PD_TP_FLAG)."""
    bad = {}
    pairs_of_pools = [(p, d) for insts in _pd_instances(hostvars, groups).values()
                      for p in insts if p[0] == 'prefill' for d in insts if d[0] == 'decode']
    for p, d in pairs_of_pools:
        (tp_p, src_p), (tp_d, src_d) = _effective(p[3], _rules.PD_TP_FLAG), _effective(d[3], _rules.PD_TP_FLAG)
        if not (_pf.is_intlike(tp_p) and _pf.is_intlike(tp_d)) or int(tp_p) < 1 or int(tp_d) < 1:
            continue  # gpus_tp refuses it on the host
        lo, hi = sorted((int(tp_p), int(tp_d)))
        if hi % lo:
            bad.setdefault((int(tp_p), int(tp_d)), []).append((p, d, src_p, src_d))
    out = []
    for (tp_p, tp_d), pairs in sorted(bad.items()):
        p, d, src_p, src_d = pairs[0]
        more = ' (and %d more pairs)' % (len(pairs) - 1) if len(pairs) > 1 else ''
        out.append(refuse(src_p, host, 'Tensor parallelism of prefill %s/%s (%s=%d) and decode %s/%s (%s=%d) does not '
                          'fit%s (checked on %s): decode reads each prefill rank\'s share of the KV heads, so one size '
                          'must be a multiple of the other'
                          % (p[1], p[2].get('name'), src_p, tp_p, d[1], d[2].get('name'), src_d, tp_d, more, host),
                          'use tensor_parallel_size (and gpus) such that %d and %d divide, e.g. %d on both sides, and '
                          'drop any --tensor-parallel-size from the extra args.' % (tp_p, tp_d, tp_p), whole=True))
    return out
