"""Preflight checks of the class budget: one timeout budget across the layers a request crosses (the entry's
timeout server, the router's request timeout, decode's wait for KV, the canary), in an order that can work
(plugins/filter/timeout_budget.py holds the table and the rules; docs/reliability.md explains them).

Unit-tested in tests/unit/test_timeout_budget.py and tests/unit/test_preflight_classes.py.
"""
from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools
from ansible_collections.pd_bundle.serving.plugins.filter import timeout_budget as _budget

from .core import _cfgs, _truthy, _vllm_hosts, _vllm_pools, check, refuse


def _pools_or_none(hostvars, groups):
    """The fleet's normalized pools; None where vllm_pools is malformed (pools_valid's to refuse)."""
    written, names = _vllm_pools(hostvars, groups)
    try:
        return _pools.normalize_pools(written if isinstance(written, list) else None, groups, names)
    except Exception:  # noqa: BLE001 - a malformed vllm_pools is pools_valid's to refuse
        return None


def _deciding_routers(hostvars, groups):
    """(pool, its first router, that router's settings) for each pool with a router: the host whose canary decides
    heals and ejections (roles/vllm_router/vars/main.yml). None of them where vllm_pools is malformed."""
    cfgs = dict(_cfgs(hostvars, groups.get('vllm_router') or []))
    for pool in _pools_or_none(hostvars, groups) or []:
        first = next((h for h in pool.get('routers') or [] if h in cfgs), None)
        if first is not None:
            yield pool, first, cfgs[first]


@check('budget', scope='fleet')
def timeout_budget_order(hostvars, host, groups, specs):
    """Each layer gives up after the one inside it: the entry and the router after decode's longest wait for KV
    (each router against its own pool's hosts), the canary within its interval and before the KV wait, and after
    the store tier's bound on the pool's prefills."""
    vllms = _cfgs(hostvars, _vllm_hosts(groups))
    pools = _pools_or_none(hostvars, groups) or []
    routers = []
    for h, cfg in _cfgs(hostvars, groups.get('vllm_router') or []):
        mine = [p for p in pools if str(h) in p.get('routers', [])]
        hosts = _pools.pool_hosts(mine[0], ('prefill', 'decode')) if mine else [v for v, _ in vllms]
        routers.append((h, cfg, hosts))
    entries = _cfgs(hostvars, groups.get('entry') or [])
    # Named on the host the variable is set on, and on the host it is checked on, as every fleet check's message.
    return [refuse(var, where, '%s (checked on %s)' % (problem, host), fix, whole=True)
            for var, where, problem, fix in _budget.budget_problems(entries, routers, vllms,
                                                                      groups.get('vllm_prefill') or [])]


@check('canary', scope='fleet')
def canary_heal_pool(hostvars, host, groups, specs):
    """Healing on a pool with one prefill and one decode instance: the canary cannot tell a wedged instance from a
    broken path (no peer to compare with), so it would never heal; refused rather than left on for nothing. The
    switch is read on the pool's first router, the one that heals (roles/vllm_router/vars/main.yml)."""
    out = []
    for pool, first, cfg in _deciding_routers(hostvars, groups):
        if not _truthy(cfg.get('vllm_router_canary_heal'), True):
            continue
        if len(pool['prefill']) == 1 and len(pool['decode']) == 1:
            (ph, pi), (dh, di) = pool['prefill'][0], pool['decode'][0]
            out.append(refuse('vllm_router_canary_heal', first,
                              'vllm_router_canary_heal is on for router %s (pool %s), but the pool has one prefill '
                              'instance (%s/%s) and one decode instance (%s/%s): with no peer to compare with, a wedged '
                              'instance cannot be told from a broken path, and nothing would ever be healed (checked on %s)'
                              % (first, pool['name'], ph, pi, dh, di, host),
                              'set vllm_router_canary_heal: false on the routers of pool %s (the canary and '
                              'PDPairBroken still run), or give the pool a second prefill or decode instance.'
                              % pool['name'], whole=True))
    return out


def _eject_setting(cfg):
    """vllm_router_canary_eject as 'auto', True or False; None when it is none of them."""
    value = cfg.get('vllm_router_canary_eject')
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return {'auto': 'auto', 'true': True, 'yes': True, 'on': True, 'false': False, 'no': False, 'off': False}.get(text)


def eject_worst_s(cfg, prefills):
    """Seconds from a path's cut to its instance out of every router, at worst: the run that sees it starts within
    one interval; a decode's pairs are probed one after another, each failing one costs failures x timeout (a
    failure is confirmed at once); then every router's health check must see /health 503 (its period x threshold).
    Mirrors plugins/tools/pd_canary.py's walk (run) and Ejector."""
    def num(name):  # cfg has the role defaults overlaid; a value of the wrong type is the argument spec's to refuse
        try:
            return float(cfg.get(name, 0))
        except (TypeError, ValueError):
            return 0.0
    return (num('vllm_router_canary_interval')
            + prefills * num('vllm_router_canary_eject_failures') * num('vllm_router_canary_timeout')
            + num('vllm_router_health_check_interval_secs') * num('vllm_router_health_failure_threshold'))


@check('canary', scope='fleet')
def canary_eject_pool(hostvars, host, groups, specs):
    """Ejection (vllm_router_canary_eject, read on the pool's first router, the one that decides): true on a pool
    of one prefill and one decode (nothing could ever go out: the last of a side stays in), a value that is not
    auto/true/false, or a canary pace that cannot take a broken path out within vllm_router_canary_eject_within."""
    out = []
    for pool, first, cfg in _deciding_routers(hostvars, groups):
        setting = _eject_setting(cfg)
        single = len(pool['prefill']) == 1 and len(pool['decode']) == 1
        if setting is None:
            out.append(refuse('vllm_router_canary_eject', first, 'vllm_router_canary_eject=%r on router %s is not '
                              'auto, true or false (checked on %s)' % (cfg.get('vllm_router_canary_eject'), first, host),
                              'set vllm_router_canary_eject to auto (the default), true or false.', whole=True))
            continue
        if setting is True and single:
            (ph, pi), (dh, di) = pool['prefill'][0], pool['decode'][0]
            out.append(refuse('vllm_router_canary_eject', first,
                              'vllm_router_canary_eject is true for router %s (pool %s), but the pool has one prefill '
                              'instance (%s/%s) and one decode instance (%s/%s): the last prefill and the last decode '
                              'in rotation are never taken out, so nothing could ever be ejected (checked on %s)'
                              % (first, pool['name'], ph, pi, dh, di, host),
                              'set vllm_router_canary_eject: auto or false on the routers of pool %s, or give the pool '
                              'a second prefill or decode instance.' % pool['name'], whole=True))
            continue
        if setting is False or (setting == 'auto' and single):
            continue
        worst, goal = eject_worst_s(cfg, len(pool['prefill'])), cfg.get('vllm_router_canary_eject_within')
        try:
            goal = float(goal)
        except (TypeError, ValueError):
            continue  # the argument spec's to refuse
        if worst > goal:
            out.append(refuse('vllm_router_canary_interval', first,
                              'the canary on router %s (pool %s) can take %.0f s to take a broken path out of rotation: '
                              'vllm_router_canary_interval=%s + %d prefill instance(s) x vllm_router_canary_eject_failures'
                              '=%s x vllm_router_canary_timeout=%s + the routers\' health check (%s s x %s) is above '
                              'vllm_router_canary_eject_within=%s (checked on %s)'
                              % (first, pool['name'], worst, cfg.get('vllm_router_canary_interval'),
                                 len(pool['prefill']), cfg.get('vllm_router_canary_eject_failures'),
                                 cfg.get('vllm_router_canary_timeout'), cfg.get('vllm_router_health_check_interval_secs'),
                                 cfg.get('vllm_router_health_failure_threshold'), goal, host),
                              'lower vllm_router_canary_interval or vllm_router_canary_timeout on router %s, or raise '
                              'vllm_router_canary_eject_within (a broken path then keeps receiving requests for longer), '
                              'or set vllm_router_canary_eject: false.' % first, whole=True))
    return out
