"""Preflight checks of the classes router, kv_mode: what the routers and the instances that share a Mooncake store must
agree on (API key, store keys, rendered prefill tokens).

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
import re

from .core import _cfgs, _effective, _instances, _j, _setting, _store_users, _vllm_argv, check, refuse


@check('router', scope='fleet')
def router_api_keys(hostvars, host, groups, specs):
    """Every router has the same vllm_router_api_key: the vLLM instances demand one key (VLLM_API_KEY, roles/vllm),
    the routers' (each sends its own to the workers). The keys are compared, never shown."""
    by_key = {}
    for router, rc in _cfgs(hostvars, groups.get('vllm_router') or []):
        by_key.setdefault(str(rc.get('vllm_router_api_key') or ''), []).append(router)
    if len(by_key) < 2:
        return []
    parts, n = [], 0
    for key, routers in sorted(by_key.items(), key=lambda kv: sorted(kv[1])):
        if key:
            n += 1
        parts.append('%s: %s' % (', '.join(sorted(routers)), ('key #%d' % n) if key else 'no key'))
    return [refuse('vllm_router_api_key', host, 'vllm_router_api_key differs between the routers (checked on %s): %s '
                   '(values not shown). Every vLLM instance demands one key on /v1/* (VLLM_API_KEY, the routers\' '
                   'key), so a router with another key, or none, gets 401 from every instance'
                   % (host, '; '.join(parts)),
                   'set vllm_router_api_key once for the group (group_vars/vllm_router/main.yml, from Ansible Vault) '
                   'and remove the per-host values.', whole=True)]


# --- the store's keys: instances that share a store must compute the same keys for the same prefix ------------

# vLLM's block-hash algorithms whose seed is random per process unless PYTHONHASHSEED is set
# (vllm/v1/core/kv_cache_utils.py, _NON_CRYPTO_HASH_FUNCTIONS): no two instances would ever share a key.
NON_CRYPTO_HASH_ALGOS = ('xxhash', 'xxhash_cbor')
HASH_ALGO_FLAG = '--prefix-caching-hash-algo'
# The characters a store key uses as separators (plugins/filter/kv_config.py).
_KEY_FORBIDDEN = re.compile(r'[@\s]')


def _instance_env(cfg, inst, key):
    """An instance's effective value of env var key (mooncake_env < vllm_env < the instance's env), None if unset."""
    value = None
    for env in (cfg.get('mooncake_env'), cfg.get('vllm_env'), inst.get('env')):
        if isinstance(env, dict) and key in env:
            value = env[key]
    return None if value is None else str(value)


@check('kv_mode', scope='fleet')
def store_keys(hostvars, host, groups, specs):
    """Every store client has a model revision (the keys' namespace), and the instances that share the store agree
    on it, on the served model name and on the block hash (algorithm and PYTHONHASHSEED); block size and KV dtype
    are pd_engine_equal's (every prefill and decode instance). A difference would not fail: reuse would silently
    stop, or, for a revision, KV of other weights would be served."""
    users = _store_users(hostvars, groups)
    if not users:
        return []
    out = []
    empty = [h for h, cfg in users if not str(cfg.get('vllm_model_revision') or '').strip()]
    if empty:
        out.append(refuse('vllm_model_revision', host, 'vllm_model_revision is empty on %s, which run a Mooncake store '
                          'client (store mode or vllm_store_tier; checked on %s): the store keys carry only the model '
                          'directory\'s name, so after a weights upgrade an instance would load KV the old weights '
                          'computed' % (', '.join(empty), host),
                          'set vllm_model_revision in group_vars/all.yml to the weights\' version (the hub commit, or '
                          'your own label such as "2026-11-30") and change it with every model upgrade.', whole=True))
    bad = [(h, cfg.get('vllm_model_revision')) for h, cfg in users
           if _KEY_FORBIDDEN.search(str(cfg.get('vllm_model_revision') or '').strip())]
    for h, value in bad:
        out.append(refuse('vllm_model_revision', h, 'holds "@" or white space, which the store keys use as separators',
                          'use letters, digits, ".", "-", "_" or ":".', value=value))
    for var in ('vllm_model_revision', 'vllm_served_model_name'):
        values = {}
        for h, cfg in users:
            values.setdefault(_j(_setting(cfg, var)), []).append(h)
        if len(values) > 1:
            out.append(refuse(var, host, '%s differs among the hosts that share the store (%s; checked on %s): their '
                              'keys differ, so no instance finds what another stored'
                              % (var, '; '.join('%s on %s' % (v, ', '.join(hs)) for v, hs in values.items()), host),
                              'set %s once, in group_vars/all.yml.' % var, whole=True))
    seeds, algos = {}, {}
    for h, cfg in users:
        for _, inst in _instances(cfg):
            who = '%s/%s' % (h, inst.get('name'))
            seed = _instance_env(cfg, inst, 'PYTHONHASHSEED')
            algo = _effective(_vllm_argv(cfg, inst), HASH_ALGO_FLAG)[0]
            seeds.setdefault(seed, []).append(who)
            algos.setdefault(algo, []).append(who)
            if str(algo) in NON_CRYPTO_HASH_ALGOS and seed is None:
                # The host/instance stands where the host stands: 'FLAG ALGO on HOST/INSTANCE'.
                out.append(refuse('%s %s' % (HASH_ALGO_FLAG, algo), who, 'without PYTHONHASHSEED: vLLM seeds that hash '
                                  'at random in every process, so no other instance ever finds this one\'s blocks in '
                                  'the store', 'use sha256 (vLLM\'s default), or set PYTHONHASHSEED in vllm_env.'))
    if len(seeds) > 1:
        # The instances (HOST/NAME) name their hosts; there is no "checked on" in this message.
        seen = '; '.join('%s on %s' % ('unset' if k is None else _j(k), _who_s(v)) for k, v in seeds.items())
        out.append(refuse('PYTHONHASHSEED', _first_host(seeds), 'PYTHONHASHSEED differs among the store\'s instances '
                          '(%s): their block hashes, so their keys, differ' % seen,
                          'set it once in vllm_env (group_vars/all.yml), or nowhere.', whole=True))
    if len(algos) > 1:
        seen = '; '.join('%s on %s' % ('unset (sha256)' if k is None else k, _who_s(v)) for k, v in algos.items())
        out.append(refuse(HASH_ALGO_FLAG, _first_host(algos), '%s differs among the store\'s instances (%s): their '
                          'block hashes, so their keys, differ' % (HASH_ALGO_FLAG, seen), 'give it one value in '
                          'vllm_extra_args (group_vars/all.yml), or leave vLLM\'s default everywhere.', whole=True))

    return out


def _first_host(by_value):
    """The host of the first instance ('HOST/NAME') a {value: [instance, ...]} message names."""
    return next(iter(by_value.values()))[0].split('/')[0]


def _who_s(names, limit=4):
    return ', '.join(names[:limit]) + (' and %d more' % (len(names) - limit) if len(names) > limit else '')


# Prefill policies that match tokens the prefill instances render for the router (POST /v1/completions/render).
RENDER_POLICIES = ('cache_aware',)


@check('router', scope='fleet')
def router_prefill_render(hostvars, host, groups, specs):
    """A router whose prefill policy matches tokens needs every prefill instance to render them
    (vllm_prefill_render): without it vllm-router 0.1.17 routes by load only, silently (docs/routing.md)."""
    policies = {}
    for router, rc in _cfgs(hostvars, groups.get('vllm_router') or []):
        if str(rc.get('vllm_router_prefill_policy')) in RENDER_POLICIES:
            policies.setdefault(str(rc.get('vllm_router_prefill_policy')), []).append(router)
    if not policies:
        return []
    off = [h for h, c in _cfgs(hostvars, groups.get('vllm_prefill') or []) if c.get('vllm_prefill_render') is False]
    if not off:
        return []
    return [refuse('vllm_prefill_render', host, 'vllm_prefill_render is false on %s while the routers %s route prefill '
                   'by %s (checked on %s): that policy matches the tokens each prefill renders for it (POST '
                   '/v1/completions/render); without them vllm-router routes by load only, and a conversation\'s next '
                   'turn recomputes its prefix elsewhere'
                   % (', '.join(off), ', '.join(sorted(r for rs in policies.values() for r in rs)),
                      ' / '.join(sorted(policies)), host),
                   'set vllm_prefill_render: true (the default), or vllm_router_prefill_policy: round_robin.',
                   whole=True)]
