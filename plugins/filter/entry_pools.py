"""The entry's model pools (issue 34): which HAProxy backend serves which model, and which key may call which pool.

- bundle_entry_pools(host, hostvars, groups, backend): [] for an inventory without vllm_pools (the entry then renders
  what it rendered before pools: one backend of every router); else each pool as {name, backend, served_model_name,
  backends: [{host, address, port}]}. vllm_pools is the common role's variable (the entry role does not run it):
  read from HOST's settings (bundle_host_cfg: the inventory over the roles' defaults), the routers' addresses and
  ports from bundle_router_endpoints.
- bundle_entry_router_backend(router, entry, hostvars, groups): the HAProxy backend ROUTER is a server of on
  entry host ENTRY (entry_router_backend without pools, its pool's backend with them; None: in no pool), for the
  router role's drain through the entry's admin socket.
- bundle_entry_key_pools(entry_key_models, pools, keys): the lines of the key -> pool access map, sorted:
  [key/pool, 1] for each pool a listed key may call, [key, 0] for each listed key (a key not listed may call every
  pool). A key or pool it does not know is an error: a typo must not leave a key unrestricted.
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools


def entry_pools(host, hostvars, groups, backend):
    vllm_pools = _bundle.host_cfg(host, hostvars).get('vllm_pools')
    if not vllm_pools:
        return []
    out = []
    for pool in _pools.normalize_pools(vllm_pools, groups, {}, {}):
        name = pool['served_model_name']
        # A map file splits a line at whitespace; the name is also the JSON id clients send.
        if not name or any(c.isspace() for c in str(name)):
            raise AnsibleFilterError('vllm_pools: pool %s has served_model_name %r: the entry routes by it, so it '
                                     'must be non-empty and without whitespace' % (pool['name'], name))
        eps = _bundle.router_endpoints(pool['routers'], hostvars)
        out.append({'name': pool['name'], 'backend': '%s_%s' % (backend, pool['name']),
                    'served_model_name': str(name),
                    'backends': [{'host': e['host'], 'address': e['address'], 'port': e['port']} for e in eps]})
    return out


def entry_router_backend(router, entry, hostvars, groups):
    backend = _bundle.host_cfg(entry, hostvars)['entry_router_backend']
    pools = entry_pools(entry, hostvars, groups, backend)
    if not pools:
        return backend
    return next((p['backend'] for p in pools if str(router) in [b['host'] for b in p['backends']]), None)


def entry_key_pools(entry_key_models, pools, keys):
    entry_key_models = entry_key_models or {}
    if entry_key_models and not pools:
        raise AnsibleFilterError('entry_key_models is set but vllm_pools is not: set vllm_pools (docs/pools.md) '
                                 'or remove entry_key_models')
    names = {p['name'] for p in pools or []}
    lines = []
    for key, allowed in sorted(entry_key_models.items()):
        if key not in (keys or {}):
            raise AnsibleFilterError('entry_key_models: %r is not a key of entry_keys' % key)
        unknown = sorted(set(allowed or []) - names)
        if unknown:
            raise AnsibleFilterError('entry_key_models.%s: %s not a pool of vllm_pools (%s); it lists pool names, '
                                     'not model names' % (key, ', '.join(unknown), ', '.join(sorted(names))))
        lines.append(['%s' % key, 0])
        lines.extend(['%s/%s' % (key, p), 1] for p in sorted(set(allowed or [])))
    return sorted(lines)


class FilterModule(object):
    def filters(self):
        return {
            'bundle_entry_pools': entry_pools,
            'bundle_entry_router_backend': entry_router_backend,
            'bundle_entry_key_pools': entry_key_pools,
        }
