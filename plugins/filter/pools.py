"""Model pools (issue 34): several models behind one entry, each served by its own prefill, decode and routers.

A pool, as the inventory writes it (vllm_pools, a list in group_vars/all):

    - name: chat                      # [a-z0-9-], at most POOL_NAME_MAX characters: units, labels, file names
      model: /srv/models/Qwen3-32B    # a path or a hub id, as vllm_model
      model_revision: "2025-04-29"    # as vllm_model_revision
      model_src: ""                   # as vllm_model_src: a controller directory shipped to model (optional)
      served_model_name: qwen3-32b    # what clients write in the request's "model"; one pool per name
      prefill: [gpu-p1, gpu-p2/prefill1]   # hosts (every instance on them) or host/instance
      decode: [gpu-d1]
      routers: [router-1, router-2]
      settings: {vllm_max_model_len: 32768}  # the pool's own P/D settings (POOL_SETTINGS)

An inventory without vllm_pools is one pool, DEFAULT_POOL, made of what it has today: every instance of the
vllm_prefill and vllm_decode hosts, every vllm_router host, and the model of vllm_model / vllm_served_model_name /
vllm_model_revision (implicit: True). Everything rendered from it is what the bundle rendered before pools.

- bundle_pools(vllm_pools, groups, instances, defaults): the pools, normalized (see normalize_pools).
- bundle_inventory_pools(vllm_pools, groups, hostvars, defaults): bundle_pools with the instances read from hostvars.
- bundle_pool_of(pools, host, instance): the name of the pool an instance serves in (None: none).
- bundle_instance_pool(pools, host, instance): that pool's model, served name, revision and settings.
- bundle_host_models(pools, host, own): the models a vLLM host needs on disk (shipped from model_src when set).
- bundle_router_pool(pools, host): the pool a router routes for.
- bundle_pool_endpoints(endpoints, pool): the instances (bundle_vllm_endpoints) of a pool: a router's workers.
- explicit_pools(pools): the pools of an inventory with vllm_pools, [] for the implicit one (nothing to group by).
- pool_hosts(pool, roles): the hosts of a pool's instances, each once.
- bundle_pool_choice_problem(pools, name, var, one): what is wrong with a playbook's -e VAR=NAME ('' when nothing).
- bundle_pool_named(pools, name): the pool -e VAR=NAME picks (NAME empty: the only pool, else None).
- bundle_pool_instances(names, host, pool, wanted): which of a host's instances a playbook acts on (one pool's).
- pool_problems(vllm_pools, groups, instances): what is wrong with the inventory's pools, as (var, host, problem, fix)
  for preflight's refuse(); an empty list when they can be normalized.
"""
import re

DEFAULT_POOL = 'default'
POOL_NAME_RE = re.compile(r'^[a-z0-9]([a-z0-9-]*[a-z0-9])?$')
# A pool's name goes into unit names, Prometheus labels, HAProxy backend names and the Mooncake key prefix.
POOL_NAME_MAX = 32
POOL_KEYS = ('name', 'model', 'model_revision', 'model_src', 'served_model_name', 'prefill', 'decode', 'routers',
             'settings')
# The settings a pool may give its own instances and routers (vllm_pools[].settings), each read per instance or
# router where the bundle renders it (instance.env.j2, the router's argv); any other is refused, never ignored.
POOL_SETTINGS = ('vllm_max_model_len', 'vllm_extra_args', 'vllm_router_prefill_policy', 'vllm_router_decode_policy',
                 'vllm_router_extra_args')
ROLES = ('prefill', 'decode')
GROUP_OF = {'prefill': 'vllm_prefill', 'decode': 'vllm_decode', 'routers': 'vllm_router'}


def _ref(ref):
    """'host' -> (host, None); 'host/instance' -> (host, instance)."""
    text = str(ref)
    host, _, inst = text.partition('/')
    return host, (inst or None)


def _members(refs, instances):
    """The (host, instance) pairs REFS name, in order, each once (a host: its instances in the inventory's order)."""
    out = []
    for ref in refs or []:
        host, inst = _ref(ref)
        for name in ([inst] if inst else list(instances.get(host) or [])):
            if (host, name) not in out:
                out.append((host, name))
    return out


def implicit_pool(groups, instances, defaults):
    """The one pool of an inventory without vllm_pools."""
    defaults = defaults or {}
    return {
        'name': DEFAULT_POOL, 'implicit': True,
        'model': defaults.get('vllm_model'), 'model_revision': defaults.get('vllm_model_revision'),
        'model_src': defaults.get('vllm_model_src') or '',
        'served_model_name': defaults.get('vllm_served_model_name'),
        'prefill': _members(groups.get('vllm_prefill') or [], instances),
        'decode': _members(groups.get('vllm_decode') or [], instances),
        'routers': list(groups.get('vllm_router') or []),
        'settings': {},
    }


def normalize_pools(vllm_pools, groups, instances, defaults=None):
    """Every pool as {name, implicit, model, model_revision, served_model_name, prefill: [[host, instance]], decode,
    routers: [host], settings}. GROUPS: the inventory's groups; INSTANCES: {host: [instance name, ...]} of every vLLM host;
    DEFAULTS: {vllm_model, vllm_served_model_name, vllm_model_revision} (the implicit pool's model, and a pool's
    revision when it names none). Refs are resolved as written; pool_problems says whether they make sense."""
    groups = groups or {}
    instances = instances or {}
    if not vllm_pools:
        pools = [implicit_pool(groups, instances, defaults)]
    else:
        defaults = defaults or {}
        pools = []
        for p in vllm_pools:
            model = p.get('model')
            pools.append({
                'name': str(p.get('name')), 'implicit': False,
                'model': model,
                'model_revision': p.get('model_revision', defaults.get('vllm_model_revision')),
                'model_src': str(p.get('model_src') or ''),
                'served_model_name': p.get('served_model_name') or (str(model).rstrip('/').rsplit('/', 1)[-1]
                                                                   if model else None),
                'prefill': _members(p.get('prefill'), instances),
                'decode': _members(p.get('decode'), instances),
                'routers': [str(h) for h in p.get('routers') or []],
                'settings': dict(p.get('settings') or {}),
            })
    for pool in pools:
        pool['prefill'] = [list(m) for m in pool['prefill']]
        pool['decode'] = [list(m) for m in pool['decode']]
    return pools


def bundle_pools(vllm_pools, groups, instances, defaults=None):
    return normalize_pools(vllm_pools, groups, instances, defaults)


def instance_names(hosts, hostvars):
    """{host: [instance name]} of HOSTS from their vllm_instances (hostvars: Ansible's, or plain dicts)."""
    out = {}
    for h in hosts or []:
        hv = hostvars[h] if h in hostvars else {}
        out[h] = [str(i.get('name')) for i in (hv.get('vllm_instances') or []) if isinstance(i, dict)]
    return out


def bundle_inventory_pools(vllm_pools, groups, hostvars, defaults=None):
    """bundle_pools with each vLLM host's instances read from HOSTVARS (the roles' one way to get the pools)."""
    hosts = list(groups.get('vllm_prefill') or []) + list(groups.get('vllm_decode') or [])
    return normalize_pools(vllm_pools, groups, instance_names(hosts, hostvars), defaults)


def explicit_pools(pools):
    """POOLS when the inventory has vllm_pools, [] for the one implicit pool of an inventory without them: whatever
    groups or labels by pool (status, monitoring) does nothing then, so those files stay as before pools."""
    return list(pools or []) if any(not p.get('implicit') for p in pools or []) else []


def pool_hosts(pool, roles=ROLES):
    """The hosts of POOL's instances in ROLES (prefill and decode, or one of them), each once, in order."""
    return list(dict.fromkeys(str(h) for role in roles for h, _ in pool[role]))


def bundle_host_models(pools, host, own=None):
    """[{model, model_src}] a vLLM host needs: its pools' models, each once, in pool order; OWN ({model, model_src}:
    the host's vllm_model and vllm_model_src) for a host with no instance in a pool (a spare host is provisioned
    with it, as before pools)."""
    out = []
    for pool in pools or []:
        if str(host) in pool_hosts(pool):
            item = {'model': pool['model'], 'model_src': pool.get('model_src') or ''}
            if item not in out:
                out.append(item)
    if not out and own:
        out.append({'model': own.get('model'), 'model_src': own.get('model_src') or ''})
    return out


def pool_of(pools, host, instance):
    """The pool (its dict) an instance serves in; None for an instance in no pool."""
    for pool in pools or []:
        if any([str(host), str(instance)] in pool[role] for role in ROLES):
            return pool
    return None


def bundle_instance_pool(pools, host, instance):
    """The pool an instance serves in, as {name, implicit, model, model_revision, served_model_name, settings}: what
    its env file renders (instance.env.j2). Raises for an instance in no pool (preflight refuses that inventory)."""
    pool = pool_of(pools, host, instance)
    if pool is None:
        raise ValueError('bundle_instance_pool: %s/%s is in no pool (vllm_pools)' % (host, instance))
    return {k: pool[k] for k in ('name', 'implicit', 'model', 'model_revision', 'served_model_name', 'settings')}


def bundle_pool_of(pools, host, instance):
    pool = pool_of(pools, host, instance)
    return pool['name'] if pool else None


def bundle_router_pool(pools, host):
    """The pool a router routes for (its dict); raises for a router in no pool (preflight refuses that inventory)."""
    for pool in pools or []:
        if str(host) in pool['routers']:
            return pool
    raise ValueError('bundle_router_pool: router %s is in no pool (vllm_pools)' % host)


def bundle_pool_endpoints(endpoints, pool):
    """ENDPOINTS (bundle_vllm_endpoints: {host, name, ...}) of the instances of POOL, in their order: a router's
    workers. The implicit pool keeps them all."""
    members = {(str(h), str(n)) for role in ROLES for h, n in pool[role]}
    return [e for e in endpoints or [] if (str(e.get('host')), str(e.get('name'))) in members]


def _wanted(wanted):
    """A list of names, or a comma string of them (-e x=a,b), as a list; empty: none asked for."""
    if isinstance(wanted, str):
        return [w.strip() for w in wanted.split(',') if w.strip()]
    return [str(w) for w in wanted or []]


def bundle_pool_choice_problem(pools, name, var, one=False):
    """'' when -e VAR=NAME picks a pool of POOLS, or NAME is empty and the playbook may do without one; else the
    message that refuses it, with VAR, the pools and the fix. ONE: the playbook acts on one pool (the benchmark: one
    model's numbers), so an empty NAME is refused when there is a choice (two pools or more); without ONE an empty
    NAME means every pool (the rolling restart)."""
    names = [p['name'] for p in pools or []]
    name = str(name or '').strip()
    if not name:
        if one and len(names) > 1:
            return ('%s is not set and vllm_pools has %d pools (%s): the run measures one model. '
                    'Fix: -e %s=<pool>, one of %s.' % (var, len(names), ', '.join(names), var, ', '.join(names)))
        return ''
    if name in names:
        return ''
    return ('%s=%s names no pool; the pools are %s%s. Fix: -e %s=<pool> with one of them%s.' % (
        var, name, ', '.join(names),
        ' (no vllm_pools: the one implicit pool of every instance)' if any(p['implicit'] for p in pools or []) else '',
        var, '' if one else ', or leave %s out for every pool' % var))


def bundle_pool_named(pools, name):
    """The pool -e VAR=NAME picks (its dict); NAME empty: the only pool (an inventory without vllm_pools, or with
    one pool), None when there are several. bundle_pool_choice_problem says first whether NAME is right."""
    name = str(name or '').strip()
    if not name:
        return pools[0] if len(pools or []) == 1 else None
    for pool in pools or []:
        if pool['name'] == name:
            return pool
    raise ValueError('bundle_pool_named: no pool %s in %s' % (name, [p['name'] for p in pools or []]))


def bundle_pool_instances(names, host, pool=None, wanted=None):
    """Which of HOST's instances (NAMES, in vllm_instances order) a playbook acts on: those of WANTED (a list or a comma
    string of names; empty: all) that serve in POOL (a pool's dict; None: any pool). Per instance, not per host: a
    host may serve one instance of each of two pools."""
    asked = _wanted(wanted)
    out = [str(n) for n in names or [] if not asked or str(n) in asked]
    if pool:
        members = {(str(h), str(n)) for role in ROLES for h, n in pool[role]}
        out = [n for n in out if (str(host), n) in members]
    return out


def pool_problems(vllm_pools, groups, instances):
    """(var, host, problem, fix) for each thing wrong with vllm_pools; HOST is the host a problem is about, or the
    first vLLM or router host for a problem of the list itself (preflight names a host in every message)."""
    if not vllm_pools:
        return []
    groups = groups or {}
    instances = instances or {}
    anchor = next(iter((groups.get('vllm_prefill') or []) + (groups.get('vllm_router') or [])), 'localhost')
    out = []
    if not isinstance(vllm_pools, list):
        return [('vllm_pools', anchor, 'is not a list of pools', 'write vllm_pools as a YAML list of '
                 '{name, model, served_model_name, prefill, decode, routers} (docs/pools.md).')]
    names, served = {}, {}
    seen = {'prefill': {}, 'decode': {}, 'routers': {}}
    for i, p in enumerate(vllm_pools):
        var = 'vllm_pools[%d]' % i
        if not isinstance(p, dict):
            out.append((var, anchor, 'is not a mapping', 'give each pool name, model, served_model_name, prefill, '
                        'decode and routers (docs/pools.md).'))
            continue
        name = str(p.get('name') or '')
        unknown = sorted(set(p) - set(POOL_KEYS))
        if unknown:
            out.append((var, anchor, 'has unknown keys %s' % ', '.join(unknown),
                        'use only %s (a setting of the pool goes under settings).' % ', '.join(POOL_KEYS)))
        if not POOL_NAME_RE.match(name) or len(name) > POOL_NAME_MAX:
            out.append((var + '.name', anchor, 'is %r: not a pool name' % name,
                        'name the pool with lowercase letters, digits and dashes, at most %d characters.'
                        % POOL_NAME_MAX))
        elif name in names:
            out.append((var + '.name', anchor, 'is %r, as vllm_pools[%d]' % (name, names[name]),
                        'give every pool its own name.'))
        else:
            names[name] = i
        if not p.get('model'):
            out.append((var + '.model', anchor, 'is not set', 'set the model the pool serves (a path or a hub id).'))
        sname = p.get('served_model_name') or (str(p.get('model')).rstrip('/').rsplit('/', 1)[-1] if p.get('model')
                                               else None)
        if sname in served:
            out.append((var + '.served_model_name', anchor, 'is %r, as pool %s' % (sname, served[sname]),
                        'give every pool its own served_model_name: the entry routes a request by it.'))
        elif sname:
            served[sname] = name
        settings = p.get('settings') or {}
        if not isinstance(settings, dict):
            out.append((var + '.settings', anchor, 'is not a mapping', 'write the pool settings as {variable: value}.'))
            settings = {}
        for key in sorted(settings):
            if key not in POOL_SETTINGS:
                out.append((var + '.settings.' + str(key), anchor, 'is not a setting a pool may set',
                            'set the model with the pool\'s model, model_revision and served_model_name, host settings '
                            'in host_vars; a pool sets only %s.' % ', '.join(POOL_SETTINGS)))
        for role in ('prefill', 'decode', 'routers'):
            refs = p.get(role) or []
            if not isinstance(refs, list) or not refs:
                out.append(('%s.%s' % (var, role), anchor, 'is empty', 'list the pool\'s %s (%s).' % (
                    role, 'hosts or host/instance' if role != 'routers' else 'vllm_router hosts')))
                continue
            group = GROUP_OF[role]
            for ref in refs:
                host, inst = _ref(ref)
                if host not in (groups.get(group) or []):
                    out.append(('%s.%s' % (var, role), host, 'names %s, which is not in the %s group' % (ref, group),
                                'add %s to %s, or name one of its hosts.' % (host, group)))
                    continue
                if role == 'routers' and inst:
                    out.append(('%s.%s' % (var, role), host, 'names %s: a router is a host' % ref,
                                'name the router host without an instance.'))
                    continue
                if inst and inst not in (instances.get(host) or []):
                    out.append(('%s.%s' % (var, role), host, 'names instance %s, which %s does not have' % (inst, host),
                                'name one of the host\'s vllm_instances.'))
                    continue
                members = [host] if role == 'routers' else [(host, n) for n in ([inst] if inst else
                                                                                instances.get(host) or [])]
                for m in members:
                    other = seen[role].get(m)
                    if other is not None and other != name:
                        what = m if role == 'routers' else '%s/%s' % m
                        out.append(('%s.%s' % (var, role), host, 'puts %s in pool %s too' % (what, other),
                                    'give every %s one pool (an instance or a router serves one model).' % (
                                        'router' if role == 'routers' else 'instance')))
                    seen[role][m] = name
    for role, group in (('prefill', 'vllm_prefill'), ('decode', 'vllm_decode')):
        for host in groups.get(group) or []:
            for inst in instances.get(host) or []:
                if (host, inst) not in seen[role]:
                    out.append(('vllm_pools', host, 'puts %s/%s (a %s instance) in no pool' % (host, inst, role),
                                'add %s (or %s/%s) to a pool\'s %s.' % (host, host, inst, role)))
    for host in groups.get('vllm_router') or []:
        if host not in seen['routers']:
            out.append(('vllm_pools', host, 'puts router %s in no pool' % host, 'add %s to a pool\'s routers.' % host))
    return out


class FilterModule(object):
    def filters(self):
        return {
            'bundle_pools': bundle_pools,
            'bundle_inventory_pools': bundle_inventory_pools,
            'bundle_instance_pool': bundle_instance_pool,
            'bundle_host_models': bundle_host_models,
            'bundle_pool_of': bundle_pool_of,
            'bundle_router_pool': bundle_router_pool,
            'bundle_pool_endpoints': bundle_pool_endpoints,
            'bundle_pool_choice_problem': bundle_pool_choice_problem,
            'bundle_pool_named': bundle_pool_named,
            'bundle_pool_instances': bundle_pool_instances,
        }
