"""What the Mooncake processes keep in etcd, read from Python (etcd3gw, tests/infra/etcd_gateway.py) on the
first etcd member, over TLS with the bundle's client certificate and over the plain listener the masters use:

- the masters' HA key (plugins/filter/mooncake_etcd.py: mooncake-store/<cluster id>/master_view) exists with a
  live lease and names the master whose /health says leader (and whom every master follows);
- in store mode with the etcd metadata backend, every running store-mode instance has its transfer engine's
  metadata (mooncake/ram/<ip:port>, mooncake/rpc_meta/<ip:port>);
- no key under the bundle's prefixes belongs to no running process (a stale segment of a killed engine).
"""
import json
import runpy

import etcd_gateway  # etcd3gw, pinned in requirements.txt: missing, this module fails to load (not a skip)
import pytest

from conftest import (REPO, curl_json, deployed_kv_config, deployed_master_args, etcd_client, groups, hvars, kv_connectors,
                      other_host, read_root_file, run_as_root, wait_until)

mooncake_etcd = runpy.run_path(str(REPO / 'plugins' / 'filter' / 'siblings.py'))['load']('mooncake_etcd')

STORE_CONNECTOR = 'MooncakeStoreConnector'


def first_etcd(host):
    members = groups(host).get('etcd', [])
    if not members or hvars(host)['inventory_hostname'] != members[0]:
        pytest.skip('read once, from the first etcd member')


def ha_masters(request, host):
    """[(name, testinfra host, deployed args)] of the masters; skips when they do not run HA."""
    masters = [(m, other_host(request, m)) for m in groups(host).get('mooncake_master', [])]
    if not masters:
        pytest.skip('no mooncake_master group')
    out = [(m, h, deployed_master_args(h)) for m, h in masters]
    if out[0][2].get('enable_ha') != 'true':
        pytest.skip('the masters do not run HA (--enable_ha): they keep nothing in etcd')
    return out


def masters_view(request, host, masters):
    """The masters' own view (mooncake_etcd.master_view_problems' masters): /health of each, read on that master
    (the firewall opens the metrics port to monitoring only)."""
    out = []
    for name, h, args in masters:
        mv = hvars(h)
        url = 'http://%s:%s/health' % (args.get('metrics_host', mv['common_host_ip']), args['metrics_port'])
        try:
            health = curl_json(h, url, timeout=10)
        except Exception as e:  # noqa: BLE001 - a master that does not answer is reported, not compared
            health = {'status': 'no answer: %s' % e}
        out.append({'host': name, 'address': '%s:%s' % (args['rpc_address'], args['rpc_port']),
                    'healthy': health.get('status') == 'ok', 'role': health.get('role'),
                    'leader_address': health.get('leader_address'), 'view_version': health.get('view_version')})
    return out


def etcd_view(cli, cluster_id):
    """mooncake_etcd.master_view_problems' view, read with cli."""
    key = mooncake_etcd.master_view_key(cluster_id)
    kv = etcd_gateway.read_prefix(cli, key).get(key)
    if kv is None:
        return {'value': None, 'lease': 0, 'lease_ttl': None, 'error': None}
    ttl = etcd_gateway.lease_ttl(cli, kv['lease']) if kv['lease'] else None
    return dict(kv, lease_ttl=ttl, error=None)


def test_master_view_in_etcd_names_the_leader(host, request):
    first_etcd(host)
    masters = ha_masters(request, host)
    cluster_id = masters[0][2]['cluster_id']
    cli = etcd_client(host)
    state = {}

    def agree():
        state['view'], state['masters'] = etcd_view(cli, cluster_id), masters_view(request, host, masters)
        state['problems'] = mooncake_etcd.master_view_problems(state['view'], state['masters'])
        return not state['problems']

    # A failover in progress (lease expiry, a new election) settles within a few lease TTLs.
    wait_until(agree, timeout=30, interval=2)
    print('etcd: %s = %r (lease %x, TTL %s s left); masters: %s'
          % (mooncake_etcd.master_view_key(cluster_id), state['view']['value'], state['view']['lease'],
             state['view']['lease_ttl'], json.dumps(state['masters'])))
    assert not state['problems'], state
    assert state['view']['lease'] and state['view']['lease_ttl'] > 0, state['view']


def test_masters_plain_listener_serves_the_same_view(host, request):
    """The masters reach etcd through --etcd_endpoints (Mooncake's plain listener when etcd runs TLS): every
    endpoint answers, with the key the TLS listener shows."""
    first_etcd(host)
    masters = ha_masters(request, host)
    args = masters[0][2]
    key = mooncake_etcd.master_view_key(args['cluster_id'])
    tls = etcd_gateway.read_prefix(etcd_client(host), key).get(key)
    assert tls, 'no %s in etcd' % key
    # Read from the first master, as the masters do: the firewall opens the plain listener to Mooncake's clients only.
    master = masters[0][1]
    for endpoint in args['etcd_endpoints'].split(';'):
        cli = etcd_gateway.client(lambda cmd: run_as_root(master, cmd), 'http://' + endpoint)
        plain = etcd_gateway.read_prefix(cli, key).get(key)
        assert plain and (plain['value'], plain['lease']) == (tls['value'], tls['lease']), (endpoint, plain, tls)


def store_instances(request, host):
    """[(vllm host name, testinfra host, instance, its deployed mooncake.json)] of every instance that runs a store
    client: store mode, or the store tier's prefill instances (its deployed kv-transfer-config, not the inventory's)."""
    out = []
    for name in groups(host).get('vllm_prefill', []) + groups(host).get('vllm_decode', []):
        h = other_host(request, name)
        for inst in hvars(h).get('vllm_instances') or []:
            if STORE_CONNECTOR in kv_connectors(deployed_kv_config(h, inst['name'])):
                cfg = json.loads(read_root_file(h, '/etc/vllm/%s.mooncake.json' % inst['name']))
                out.append((name, h, inst, cfg))
    return out


def engines_per_address(instances):
    """{local_hostname: engines}: the transfer engines the running store-mode instances of each address run (one
    per worker: the tensor-parallel size). The segment's port in etcd is the engine's own RPC port, which is not a
    TCP listener of the instance's unit (seen on the lab: mooncake/ram/172.30.0.21:13147 while the unit listened
    elsewhere), so segments are matched by address and counted."""
    out = {}
    for _, _, inst, cfg in instances:
        out[cfg['local_hostname']] = out.get(cfg['local_hostname'], 0) + int(inst.get('tensor_parallel_size') or 1)
    return out


def complete_segments(keys):
    """{address: number of segments with every kind of key (ram and rpc_meta)}."""
    kinds = {}
    for key in keys:
        seg = mooncake_etcd.engine_segment(key)
        if seg:
            kinds.setdefault(seg, set()).add(key[len(mooncake_etcd.ENGINE_PREFIX):].split('/', 1)[0])
    out = {}
    for seg, have in kinds.items():
        if have == set(mooncake_etcd.ENGINE_KINDS):
            addr = mooncake_etcd.split_hostport(seg)
            out[addr[0] if addr else seg] = out.get(addr[0] if addr else seg, 0) + 1
    return out


def test_store_metadata_for_every_store_instance(host, request):
    first_etcd(host)
    instances = store_instances(request, host)
    if not instances:
        pytest.skip('P2P mode (MooncakeConnector): the engines handshake directly and keep nothing in etcd')
    etcd_backed = [i for i in instances if str(i[3].get('metadata_server', '')).startswith('etcd://')]
    if not etcd_backed:
        pytest.skip('store mode with the http metadata backend: the metadata lives in the first master, not etcd')
    keys = etcd_gateway.read_prefix(etcd_client(host), mooncake_etcd.ENGINE_PREFIX)
    have = complete_segments(keys)
    for addr, engines in engines_per_address(etcd_backed).items():
        assert have.get(addr, 0) >= engines, ('%s: %d engine(s) of running store-mode instances, %d with their metadata '
                                              '(%s) in etcd: %s' % (addr, engines, have.get(addr, 0),
                                                                   '/'.join(mooncake_etcd.ENGINE_KINDS), sorted(keys)))


def test_no_key_without_a_running_owner(host, request):
    """Under the bundle's prefixes: only the cluster's own master view and the segments of running store-mode
    instances. A stale segment is what a killed engine leaves (its keys have no lease, mooncake_etcd)."""
    first_etcd(host)
    masters = [(m, other_host(request, m)) for m in groups(host).get('mooncake_master', [])]
    cluster_id = deployed_master_args(masters[0][1]).get('cluster_id') if masters else None
    cli = etcd_client(host)
    keys = {}
    for prefix in mooncake_etcd.PREFIXES:
        keys.update(etcd_gateway.read_prefix(cli, prefix))
    engines = engines_per_address(store_instances(request, host))
    # Segments of an address that runs no store-mode engine, and the master views of other cluster ids.
    segments = {mooncake_etcd.engine_segment(k) for k in keys if mooncake_etcd.engine_segment(k)}
    owned = {seg for seg in segments if (mooncake_etcd.split_hostport(seg) or ('',))[0] in engines}
    stale = mooncake_etcd.unowned_keys(keys, cluster_id, owned)
    assert not stale, {k: keys[k] for k in stale}
    # More complete segments on an address than engines run there: a killed engine's keys (no lease) are left.
    extra = {a: n for a, n in complete_segments(keys).items() if n > engines.get(a, 0)}
    assert not extra, 'more engine segments than running engines (left by killed engines): %s, engines %s' % (extra, engines)
