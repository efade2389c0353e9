"""Preflight checks of the class budget: one timeout budget across the layers a request crosses (the entry's
timeout server, the router's request timeout, decode's wait for KV, the canary), in an order that can work
(plugins/filter/timeout_budget.py holds the table and the rules; docs/reliability.md explains them).

Unit-tested in tests/unit/test_timeout_budget.py and tests/unit/test_preflight_classes.py.
"""
from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools
from ansible_collections.pd_bundle.serving.plugins.filter import timeout_budget as _budget

from .core import _cfgs, _vllm_hosts, _vllm_pools, check, refuse


@check('budget', scope='fleet')
def timeout_budget_order(hostvars, host, groups, specs):
    """Each layer gives up after the one inside it: the entry and the router after decode's longest wait for KV
    (each router against its own pool's hosts), the canary within its interval and before the KV wait."""
    vllms = _cfgs(hostvars, _vllm_hosts(groups))
    written, names = _vllm_pools(hostvars, groups)
    try:
        pools = _pools.normalize_pools(written if isinstance(written, list) else None, groups, names)
    except Exception:  # noqa: BLE001 - a malformed vllm_pools is pools_valid's to refuse
        pools = []
    routers = []
    for h, cfg in _cfgs(hostvars, groups.get('vllm_router') or []):
        mine = [p for p in pools if str(h) in p.get('routers', [])]
        hosts = _pools.pool_hosts(mine[0], ('prefill', 'decode')) if mine else [v for v, _ in vllms]
        routers.append((h, cfg, hosts))
    entries = _cfgs(hostvars, groups.get('entry') or [])
    # Named on the host the variable is set on, and on the host it is checked on, as every fleet check's message.
    return [refuse(var, where, '%s (checked on %s)' % (problem, host), fix, whole=True)
            for var, where, problem, fix in _budget.budget_problems(entries, routers, vllms)]
