"""One timeout budget across the layers a request crosses (docs/reliability.md, "The timeout budget").

A request waits at several layers at once, each with its own clock. When an outer layer gives up first, the inner
ones keep working for nobody: on the lab, requests whose KV never came stayed in decode's queue after their clients
had gone, and kept the pair slow after its path was back. This module holds the table of those clocks and the orders
that cannot work; preflight (plugins/plugin_utils/preflight/budget.py) refuses them before any host changes.

- haproxy_seconds(value): an HAProxy time ('600s', '10m', '1h', '3000' = ms) in seconds; None when it does not parse
- kv_wait_seconds(abort): decode's longest wait for one request's KV, from VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT
- router_timeout_seconds(value): the router's effective request timeout (0: vllm-router's default)
- budget_problems(entries, routers, vllms, prefills): [(var, host, problem, fix)] for each order that cannot work
- bundle_timeout_budget(entry, router, vllm): the table's rows for one entry, router and vLLM host's settings
"""
import re

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import target_rules as _rules

# vLLM's MooncakeConnector (mooncake_connector.py, vLLM 0.32 and 0.33): decode's socket to the prefill's side channel
# waits zmq.RCVTIMEO = (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60) s for an answer; the prefill answers "Timeout waiting
# for P side ready" after VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT when its side of the path works. So a decode waits for
# one request's KV at most this much longer than the abort timeout.
VLLM_RECV_MARGIN_S = 60
# vllm-router 0.1.17's --request-timeout-secs default (RouterArgs.request_timeout_secs), what 0 keeps.
ROUTER_DEFAULT_TIMEOUT_S = 1800
_HAPROXY_UNITS = {'us': 1e-6, 'ms': 1e-3, 's': 1, 'm': 60, 'h': 3600, 'd': 86400}


def haproxy_seconds(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value / 1000.0  # HAProxy reads a bare number as milliseconds
    m = re.match(r'^\s*([0-9]+)\s*(us|ms|s|m|h|d)?\s*$', str(value or ''))
    if not m:
        return None
    return int(m.group(1)) * _HAPROXY_UNITS[m.group(2) or 'ms']


def _int(value):
    """An int, or a string of digits, as an int; None otherwise (the same reading as preflight's)."""
    return _rules._int(value)


def store_bound_seconds(ms):
    """The store tier's bound (vllm_store_tier_timeout_ms) in seconds; None when it does not parse, 0 when off."""
    value = _int(ms)
    if value is None:
        return None
    return value // 1000 if value % 1000 == 0 else value / 1000.0


def kv_wait_seconds(abort):
    a = _int(abort)
    return None if a is None else a + VLLM_RECV_MARGIN_S


def router_timeout_seconds(value):
    v = _int(value)
    return None if v is None else (v or ROUTER_DEFAULT_TIMEOUT_S)


def _slowest_kv(vllms):
    """(host, abort, kv wait) of the vLLM host whose decode may wait longest for KV; None without one."""
    waits = [(h, _int(cfg.get('vllm_mooncake_abort_request_timeout')), kv_wait_seconds(cfg.get('vllm_mooncake_abort_request_timeout')))
             for h, cfg in vllms]
    waits = [w for w in waits if w[2] is not None]
    return max(waits, key=lambda w: w[2]) if waits else None


def budget_problems(entries, routers, vllms, prefills=()):
    """Orders that cannot work, as (var, host, problem, fix). entries: [(host, cfg)] of the entry hosts; routers:
    [(host, cfg, pool vLLM hosts)] of the router hosts; vllms: [(host, cfg)] of the prefill and decode hosts; prefills:
    the prefill hosts (the store tier's bound applies there only). Values of another type are the argument specs' to
    refuse, and are skipped here."""
    out = []
    cfg_of = dict(vllms)
    slowest = _slowest_kv(vllms)
    for host, cfg in entries:
        server = haproxy_seconds(cfg.get('entry_timeout_server'))
        if slowest and server is not None and server <= slowest[2]:
            vhost, abort, wait = slowest
            out.append(('entry_timeout_server', host,
                        'entry_timeout_server=%s on %s gives up on a request while decode may still wait for its KV for '
                        '%d s (vllm_mooncake_abort_request_timeout=%d on %s, plus vLLM\'s %d s receive margin): the '
                        'client is gone and the request stays in decode\'s queue'
                        % (cfg.get('entry_timeout_server'), host, wait, abort, vhost, VLLM_RECV_MARGIN_S),
                        'lower vllm_mooncake_abort_request_timeout below %d on %s, or raise entry_timeout_server above %ds.'
                        % (int(server) - VLLM_RECV_MARGIN_S, vhost, wait)))
    for host, cfg, pool_hosts in routers:
        timeout = router_timeout_seconds(cfg.get('vllm_router_request_timeout_secs'))
        mine = _slowest_kv([(h, cfg_of[h]) for h in pool_hosts if h in cfg_of])
        if mine and timeout is not None and timeout <= mine[2]:
            vhost, abort, wait = mine
            out.append(('vllm_router_request_timeout_secs', host,
                        'vllm_router_request_timeout_secs=%s on %s (%d s) gives up on a request while decode may still '
                        'wait for its KV for %d s (vllm_mooncake_abort_request_timeout=%d on %s, plus vLLM\'s %d s '
                        'receive margin)' % (cfg.get('vllm_router_request_timeout_secs'), host, timeout, wait, abort, vhost,
                                             VLLM_RECV_MARGIN_S),
                        'lower vllm_mooncake_abort_request_timeout below %d on %s, or raise '
                        'vllm_router_request_timeout_secs above %d (0: the router\'s %d).'
                        % (timeout - VLLM_RECV_MARGIN_S, vhost, wait, ROUTER_DEFAULT_TIMEOUT_S)))
        interval, canary = _int(cfg.get('vllm_router_canary_interval')), _int(cfg.get('vllm_router_canary_timeout'))
        for var, value in (('vllm_router_canary_interval', interval), ('vllm_router_canary_timeout', canary)):
            if value is not None and value < 1:
                out.append((var, host, '%s=%d on %s: the canary needs at least 1 s' % (var, value, host),
                            'set %s to 1 or more (default %s).' % (var, '30' if 'interval' in var else '10')))
        if interval and canary and interval >= 1 and canary >= 1:
            if canary >= interval:
                out.append(('vllm_router_canary_timeout', host,
                            'vllm_router_canary_timeout=%d on %s is not below vllm_router_canary_interval=%d: a run that '
                            'waits for one stuck pair would be stopped before its other pairs are tried'
                            % (canary, host, interval),
                            'lower vllm_router_canary_timeout below %d, or raise vllm_router_canary_interval above %d.'
                            % (interval, canary)))
            heal = _int(cfg.get('vllm_router_canary_heal_interval'))
            heal_on = _bundle._truthy(cfg.get('vllm_router_canary_heal'), True)
            if mine and heal_on and heal is not None and heal <= mine[2]:
                vhost, abort, wait = mine
                out.append(('vllm_router_canary_heal_interval', host,
                            'vllm_router_canary_heal_interval=%d on %s is not above the %d s decode may wait for KV '
                            '(vllm_mooncake_abort_request_timeout=%d on %s, plus vLLM\'s %d s receive margin): after a '
                            'heal, decodes still wait that long on the requests of the healed instance\'s previous '
                            'process (measured on the lab), so its pairs would fail again and it would be healed twice'
                            % (heal, host, wait, abort, vhost, VLLM_RECV_MARGIN_S),
                            'raise vllm_router_canary_heal_interval above %d, or lower vllm_mooncake_abort_request_timeout '
                            'below %d on %s.' % (wait, heal - VLLM_RECV_MARGIN_S, vhost)))
            if mine and canary >= mine[2]:
                vhost, abort, wait = mine
                out.append(('vllm_router_canary_timeout', host,
                            'vllm_router_canary_timeout=%d on %s is not below the %d s decode may wait for KV '
                            '(vllm_mooncake_abort_request_timeout=%d on %s): a canary into a stuck pair would end by the '
                            'KV wait, not by its own timeout, and a wedged pair would look slow instead of broken'
                            % (canary, host, wait, abort, vhost),
                            'lower vllm_router_canary_timeout below %d.' % wait))
            store = _slowest_store(vllms, pool_hosts, prefills)
            if store and canary <= store[1]:
                shost, bound = store
                out.append(('vllm_router_canary_timeout', host,
                            'vllm_router_canary_timeout=%d on %s is not above the %s s a store-tier prefill may wait '
                            'on the store before it skips it (vllm_store_tier_timeout_ms=%s on %s): while the store is '
                            'out, every canary through that prefill would time out and its healthy pairs would be '
                            'reported broken and healed' % (canary, host, bound, cfg_of[shost].get('vllm_store_tier_timeout_ms'),
                                                            shost),
                            'lower vllm_store_tier_timeout_ms below %d on %s, or raise vllm_router_canary_timeout above '
                            '%s.' % (canary * 1000, shost, bound)))
    return out


def _slowest_store(vllms, pool_hosts, prefills):
    """(host, seconds) of the store-tier prefill host of the pool with the longest store bound (vllm_store_tier on,
    vllm_store_tier_timeout_ms above 0); None without one."""
    bounds = [(h, store_bound_seconds(cfg.get('vllm_store_tier_timeout_ms'))) for h, cfg in vllms
              if h in pool_hosts and h in prefills and _bundle._truthy(cfg.get('vllm_store_tier'), False)]
    bounds = [b for b in bounds if b[1]]
    return max(bounds, key=lambda b: b[1]) if bounds else None


def timeout_budget(entry, router, vllm):
    """The budget's rows for one entry host's, one router host's and one vLLM host's settings (dicts; a missing one
    reads as unknown): [{layer, variable, seconds, bounds}], outermost first."""
    entry, router, vllm = entry or {}, router or {}, vllm or {}
    return [
        {'layer': 'entry (HAProxy)', 'variable': 'entry_timeout_server',
         'seconds': haproxy_seconds(entry.get('entry_timeout_server')),
         'bounds': 'silence from the router before the client gets 504; above the KV wait'},
        {'layer': 'router', 'variable': 'vllm_router_request_timeout_secs',
         'seconds': router_timeout_seconds(router.get('vllm_router_request_timeout_secs')),
         'bounds': 'one request through prefill and decode (0: vllm-router\'s %d); above the KV wait' % ROUTER_DEFAULT_TIMEOUT_S},
        {'layer': 'decode waits for KV', 'variable': 'vllm_mooncake_abort_request_timeout + %d' % VLLM_RECV_MARGIN_S,
         'seconds': kv_wait_seconds(vllm.get('vllm_mooncake_abort_request_timeout')),
         'bounds': 'prefill frees a request\'s KV after the abort timeout; decode\'s receive gives up %d s later' % VLLM_RECV_MARGIN_S},
        {'layer': 'bootstrap (per HTTP phase)', 'variable': 'vllm_mooncake_connector_timeout',
         'seconds': _int(vllm.get('vllm_mooncake_connector_timeout')),
         'bounds': 'decode\'s query of a prefill\'s bootstrap server, a worker\'s registration'},
        {'layer': 'canary', 'variable': 'vllm_router_canary_timeout',
         'seconds': _int(router.get('vllm_router_canary_timeout')),
         'bounds': 'one canary request; below the canary interval and the KV wait'},
        {'layer': 'heal interval', 'variable': 'vllm_router_canary_heal_interval',
         'seconds': _int(router.get('vllm_router_canary_heal_interval')),
         'bounds': 'at most one heal per pool per interval, counted from the healed instance\'s return; above the KV wait'},
        {'layer': 'drain (instance)', 'variable': 'vllm_drain_timeout', 'seconds': _int(vllm.get('vllm_drain_timeout')),
         'bounds': 'a rolling restart waits this long for an instance\'s requests, then restarts it'},
        {'layer': 'drain (router)', 'variable': 'vllm_router_drain_timeout',
         'seconds': _int(router.get('vllm_router_drain_timeout')),
         'bounds': 'a router restart waits this long at every entry for its open requests'},
        {'layer': 'store (tier)', 'variable': 'vllm_store_tier_timeout_ms',
         'seconds': store_bound_seconds(vllm.get('vllm_store_tier_timeout_ms')),
         'bounds': 'a prefill\'s store lookup at most this long before the store is skipped (fails open) until it '
                   'answers again; 0: no bound'},
    ]


class FilterModule(object):
    def filters(self):
        return {'bundle_timeout_budget': timeout_budget}
