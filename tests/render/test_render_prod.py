"""Render mode on inventory/prod: the full file set, and the command lines it implies."""
import ipaddress
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, VAULT_PASS_TEST_ONLY, ansible_bin, command_line, expand_exec, parse_env_file, unit_exec_start

# Exposure thresholds for `systemd-analyze security --offline=true` (0 = locked down, 10 = unsafe).
# vLLM gets more room: CUDA/torch JIT needs writable-executable memory, and it needs GPU/RDMA devices.
# The firewall's oneshot only needs CAP_NET_ADMIN and a netlink socket, so it is held tighter.
EXPOSURE_MAX = {'default': 4.5, 'vllm@.service': 6.0, 'pd-bundle-firewall.service': 2.5}


@pytest.fixture(scope='module')
def inventory(prod_inventory):
    return prod_inventory


def instances(inventory, group):
    groups, hv = inventory
    return [(h, i) for h in groups[group] for i in hv[h]['vllm_instances']]


def pools(inventory):
    """inventory/prod's model pools, normalized (plugins/filter/pools.py): which instances and routers share one."""
    from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools
    groups, hv = inventory
    return _pools.bundle_inventory_pools(hv[groups['vllm_prefill'][0]].get('vllm_pools'), groups, hv)


def pool_of(inventory, host, instance=None):
    """The pool an instance (a router: instance None) serves in."""
    from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools
    if instance is None:
        return _pools.bundle_router_pool(pools(inventory), host)
    return _pools.pool_of(pools(inventory), host, instance)


def test_every_host_gets_its_files(prod_render, inventory):
    groups, _ = inventory
    expect = {}
    for h in groups['etcd']:
        expect.setdefault(h, []).extend(['etc/etcd/etcd.env', 'etc/systemd/system/etcd.service'])
    for h in groups['mooncake_master']:
        expect.setdefault(h, []).extend(['etc/mooncake/master.env', 'etc/systemd/system/mooncake-master.service',
                                         'opt/mooncake/bin/mooncake-check'])
    for group in ('vllm_prefill', 'vllm_decode'):
        for h, inst in instances(inventory, group):
            expect.setdefault(h, []).extend(['etc/vllm/%s.env' % inst['name'], 'etc/systemd/system/vllm@.service',
                                             'etc/vllm/api-key.env', 'opt/mooncake/bin/mooncake-check'])
    for h in groups['vllm_router']:
        expect.setdefault(h, []).extend(['etc/vllm-router/router.env', 'etc/systemd/system/vllm-router.service'])
    for h in list(expect):  # firewall_enabled in inventory/prod: every bundle host
        expect[h].extend(['etc/pd-bundle/firewall.nft', 'etc/systemd/system/pd-bundle-firewall.service'])
    for host, files in expect.items():
        for f in files:
            assert (prod_render / host / f).is_file(), '%s missing for %s' % (f, host)


@pytest.mark.parametrize('group,role', [('vllm_prefill', 'kv_producer'), ('vllm_decode', 'kv_consumer')])
def test_kv_transfer_config(prod_render, inventory, group, role):
    engine_ids = set()
    for host, inst in instances(inventory, group):
        env = parse_env_file(prod_render / host / 'etc/vllm' / ('%s.env' % inst['name']))
        argv = expand_exec(unit_exec_start(prod_render / host / 'etc/systemd/system/vllm@.service'), env)
        cfg = json.loads(argv[argv.index('--kv-transfer-config') + 1])
        assert cfg['kv_role'] == role
        if role == 'kv_producer':
            # inventory/prod runs the store tier: MultiConnector, the P2P hand-off first, the store's reuse second,
            # its keys under the served name and the weights' revision.
            assert cfg['kv_connector'] == 'MultiConnector'
            p2p, store = cfg['kv_connector_extra_config']['connectors']
            assert (store['kv_connector'], store['kv_role']) == ('MooncakeStoreConnector', 'kv_both')
            pool = pool_of(inventory, host, inst['name'])  # each model pool its own namespace in the store
            assert store['kv_connector_extra_config'] == {
                'cache_prefix': '%s:%s' % (pool['served_model_name'], pool['model_revision'])}
            assert env['MOONCAKE_CONFIG_PATH'] == '/etc/vllm/%s.mooncake.json' % inst['name']
            store_cfg = json.loads((prod_render / host / 'etc/vllm' / ('%s.mooncake.json' % inst['name'])).read_text())
            # the tier's clients handshake directly: no engine keys in etcd for a killed instance to leave behind
            assert store_cfg['metadata_server'] == 'P2PHANDSHAKE'
            assert store_cfg['master_server_address'].startswith('etcd://')  # HA: the leader found through etcd
            assert p2p['kv_role'] == role and 'engine_id' not in p2p  # the children take MultiConnector's
            cfg = dict(p2p, engine_id=cfg['engine_id'])
        else:
            assert 'MOONCAKE_CONFIG_PATH' not in env  # decode: P2P only, no store client
        assert cfg['kv_connector'] == 'MooncakeConnector'
        assert cfg['kv_connector_extra_config']['mooncake_protocol'] == 'rdma'
        assert cfg['kv_connector_extra_config']['device_name'] == ','.join(inst['nics'])
        engine_ids.add(cfg['engine_id'])
        assert env['VLLM_HOST_IP'] == inventory[1][host]['ansible_host']
        assert env['CUDA_VISIBLE_DEVICES'] == ','.join(str(g) for g in inst['gpus'])
        assert argv[argv.index('--tensor-parallel-size') + 1] == str(inst['tensor_parallel_size'])
        assert argv[argv.index('--port') + 1] == str(inst['port'])
        assert env['WITH_NVIDIA_PEERMEM'] == '1'
        assert 'MC_FORCE_TCP' not in env
        if role == 'kv_producer':
            assert env['VLLM_MOONCAKE_BOOTSTRAP_PORT'] == str(inst['bootstrap_port'])
            # The side channel is pinned (decodes cache its address): base + 16 x index, one per rank.
            n = inventory[1][host]['vllm_instances'].index(inst)
            assert env['PD_BUNDLE_SIDE_CHANNEL_PORT'] == str(18100 + 16 * n)
            assert env['PD_BUNDLE_SIDE_CHANNEL_SPAN'] == str(inst['tensor_parallel_size'])
        else:
            assert 'PD_BUNDLE_SIDE_CHANNEL_PORT' not in env
        print('%s %s: %s' % (host, inst['name'], command_line(argv)))
    assert len(engine_ids) == len(instances(inventory, group)), 'engine_id must be unique'


@pytest.mark.parametrize('nth', [0, 1, 2, 3])
def test_router_lists_every_prefill_and_decode_of_its_pool(prod_render, inventory, nth):
    """Each router's workers are every prefill and decode instance of its model pool, and no other."""
    groups, hv = inventory
    router = groups['vllm_router'][nth]
    pool = pool_of(inventory, router)['name']
    env = parse_env_file(prod_render / router / 'etc/vllm-router/router.env')
    argv = expand_exec(unit_exec_start(prod_render / router / 'etc/systemd/system/vllm-router.service'), env)
    print(command_line(argv))
    manifest = prod_render / router / 'etc/vllm-router/workers.json'
    if manifest.exists():
        # smg (the default): its workers come from the manifest file, each with the connector and a prefill's
        # bootstrap port and engine id (without them smg routes through passthrough); none is on its command line.
        assert '--pd-disaggregation' in argv and argv[argv.index('--discovery-file') + 1] == '/%s' % manifest.relative_to(prod_render / router)
        assert '--prefill' not in argv and '--decode' not in argv
        workers = json.loads(manifest.read_text())['workers']
        assert all(w['kv_connector'] == 'MooncakeConnector' for w in workers)
        assert all(w['kv_engine_id'] for w in workers if w['worker_type'] == 'prefill')
        prefills = [(w['url'], str(w['bootstrap_port'])) for w in workers if w['worker_type'] == 'prefill']
        decodes = [w['url'] for w in workers if w['worker_type'] == 'decode']
    else:
        assert '--vllm-pd-disaggregation' in argv
        assert argv[argv.index('--kv-connector') + 1] == 'mooncake'
        prefills = [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == '--prefill']
        decodes = [argv[i + 1] for i, a in enumerate(argv) if a == '--decode']
    assert prefills and decodes
    assert sorted(prefills) == sorted(('http://%s:%s' % (hv[h]['ansible_host'], i['port']), str(i['bootstrap_port']))
                                      for h, i in instances(inventory, 'vllm_prefill')
                                      if pool_of(inventory, h, i['name'])['name'] == pool)
    assert sorted(decodes) == sorted('http://%s:%s' % (hv[h]['ansible_host'], i['port'])
                                     for h, i in instances(inventory, 'vllm_decode')
                                     if pool_of(inventory, h, i['name'])['name'] == pool)
    # The routers listen on their cluster address only: the entry hosts reach them, the world does not.
    assert argv[argv.index('--host') + 1] == hv[router]['ansible_host']
    assert argv[argv.index('--prometheus-port') + 1] == '29000'


def test_master_ha_and_etcd_cluster(prod_render, inventory):
    groups, hv = inventory
    etcd_ips = [hv[h]['ansible_host'] for h in groups['etcd']]
    for h in groups['mooncake_master']:
        args = parse_env_file(prod_render / h / 'etc/mooncake/master.env')['MOONCAKE_MASTER_ARGS'].split()
        assert '--enable_ha=true' in args
        # etcd has TLS in prod: Mooncake (no TLS client settings) uses etcd's plain listener 2479.
        assert '--etcd_endpoints=' + ';'.join('%s:2479' % ip for ip in etcd_ips) in args
        assert '--rpc_address=%s' % hv[h]['ansible_host'] in args
    for h in groups['etcd']:
        env = parse_env_file(prod_render / h / 'etc/etcd/etcd.env')
        ip = hv[h]['ansible_host']
        assert env['ETCD_INITIAL_CLUSTER'] == ','.join(
            '%s=https://%s:2380' % (m, hv[m]['ansible_host']) for m in groups['etcd'])
        assert env['ETCD_LISTEN_CLIENT_URLS'].split(',') == [
            'https://%s:2379' % ip, 'https://127.0.0.1:2379', 'http://%s:2479' % ip]
        assert env['ETCD_ADVERTISE_CLIENT_URLS'] == 'https://%s:2379' % ip
        assert env['ETCD_CLIENT_CERT_AUTH'] == 'true' and env['ETCD_PEER_CLIENT_CERT_AUTH'] == 'true'
        assert env['ETCD_PEER_CERT_FILE'] == '/etc/etcd/pki/%s.crt' % h


def test_store_mode_mooncake_json(store_render, inventory):
    groups, hv = inventory
    etcd = ';'.join('%s:2479' % hv[h]['ansible_host'] for h in groups['etcd'])  # etcd's plain Mooncake listener
    for group, role in (('vllm_prefill', 'kv_producer'), ('vllm_decode', 'kv_consumer')):
        for host, inst in instances(inventory, group):
            path = store_render / host / 'etc/vllm' / ('%s.mooncake.json' % inst['name'])
            cfg = json.loads(path.read_text())
            assert cfg['local_hostname'] == hv[host]['ansible_host']
            # HA masters: segment metadata in etcd, not in one master's memory (mooncake_metadata_backend auto).
            assert cfg['metadata_server'] == 'etcd://' + etcd
            assert cfg['master_server_address'] == 'etcd://' + etcd  # 2 masters: HA, leader found via etcd
            assert cfg['protocol'] == 'rdma'
            assert cfg['device_name'] == ','.join(inst['nics'])
            assert cfg['global_segment_size'] == 8 * 1024 ** 3    # from the seed's cpu_memory_pool_size
            assert cfg['local_buffer_size'] == 512 * 1024 ** 2    # from the seed's gpu_memory_pool_size
            assert not {'cpu_memory_pool_size', 'gpu_memory_pool_size'} & set(cfg), 'older names are never emitted'
            env = parse_env_file(store_render / host / 'etc/vllm' / ('%s.env' % inst['name']))
            assert env['MOONCAKE_CONFIG_PATH'] == '/etc/vllm/%s.mooncake.json' % inst['name']
            kv = json.loads(env['SERVE_KV_TRANSFER_CONFIG'])
            assert (kv['kv_connector'], kv['kv_role']) == ('MooncakeStoreConnector', role)
    router = groups['vllm_router'][0]
    args = parse_env_file(store_render / router / 'etc/vllm-router/router.env')['VLLM_ROUTER_ARGS'].split()
    # Store mode is routed sequentially (prefill then decode): the router's nixl PD mode, no bootstrap ports.
    assert args[args.index('--kv-connector') + 1] == 'nixl'
    assert all(not args[i + 2].isdigit() for i, a in enumerate(args) if a == '--prefill')


def _units(render_dir):
    return sorted(render_dir.glob('*/etc/systemd/system/*.service'))


def _verify_root(tmp_path, unit):
    """A throwaway root: the rendered files, the OS's own units, and stub executables named as such."""
    root = tmp_path / 'root'
    host_dir = unit.parents[3]
    shutil.copytree(host_dir, root, symlinks=True, dirs_exist_ok=True)
    shutil.copytree('/usr/lib/systemd/system', root / 'usr/lib/systemd/system', symlinks=True, dirs_exist_ok=True)
    exe = unit_exec_start(unit).split()[0]
    stub = root / exe.lstrip('/')
    stub.parent.mkdir(parents=True, exist_ok=True)
    if not stub.exists():
        stub.write_text('#!/bin/sh\n# stub executable for systemd-analyze verify (test double)\n')
        stub.chmod(0o755)
    return root


def _need_tools(*tools):
    """Fail (never skip) without a tool: a skipped check would let a broken unit or ruleset pass."""
    missing = [t for t in tools if shutil.which(t) is None]
    assert not missing, '%s not installed: run scripts/install-deps.sh (systemd, nftables, util-linux)' % missing


def test_missing_tool_fails_not_skips():
    with pytest.raises(AssertionError, match='install-deps'):
        _need_tools('sh', 'pd-bundle-no-such-tool')


def test_units_verify_and_exposure(prod_render, tmp_path):
    _need_tools('systemd-analyze')
    report = []
    for unit in _units(prod_render):
        name = unit.name
        root = _verify_root(tmp_path / unit.parents[3].name / name, unit)
        target = name.replace('@.service', '@verify.service')
        if target != name:
            shutil.copy(root / 'etc/systemd/system' / name, root / 'etc/systemd/system' / target)
        res = subprocess.run(['systemd-analyze', 'verify', '--root=%s' % root, '/etc/systemd/system/%s' % target],
                             capture_output=True, text=True)
        noise = [l for l in res.stderr.splitlines() if l.strip()]
        assert res.returncode == 0 and not noise, '%s: %s' % (unit, res.stderr)
        res = subprocess.run(['systemd-analyze', 'security', '--offline=true', str(unit)], capture_output=True, text=True)
        line = [l for l in res.stdout.splitlines() if 'Overall exposure level' in l][0]
        score = float(line.split(':')[1].split()[0])
        report.append((unit.parents[3].name, name, score))
        assert score <= EXPOSURE_MAX.get(name, EXPOSURE_MAX['default']), line
    print('\n'.join('%-10s %-26s %.1f' % r for r in report))


def _ip_in(ip, elems):
    a = ipaddress.ip_address(ip)
    for e in elems or []:
        if isinstance(e, str) and a == ipaddress.ip_address(e):
            return True
        if isinstance(e, dict) and 'range' in e and \
                ipaddress.ip_address(e['range'][0]) <= a <= ipaddress.ip_address(e['range'][1]):
            return True
        if isinstance(e, dict) and 'prefix' in e and \
                a in ipaddress.ip_network('%s/%s' % (e['prefix']['addr'], e['prefix']['len'])):
            return True
    return False


def _in(port, elems):
    return any(lo <= port <= hi for lo, hi in
               ((e['range'][0], e['range'][1]) if isinstance(e, dict) else (e, e) for e in elems or []))


BUNDLE_GROUPS = ('etcd', 'mooncake_master', 'vllm_prefill', 'vllm_decode', 'vllm_router', 'entry', 'monitoring')
MONITORING_IP, OUTSIDER_IP = '10.10.9.77', '10.10.2.5'  # in / outside inventory/prod's firewall_extra_sources
KV = {'vllm_prefill', 'vllm_decode'}


def _load_ruleset(path):
    """The ruleset as nft loaded it (twice: the replace is repeatable), in a throwaway user+network namespace."""
    text = path.read_text()
    assert not [l for l in text.splitlines() if 'flush' in l and not l.strip().startswith('#')], \
        'the bundle must never flush other tables'
    res = subprocess.run(['unshare', '-rn', 'sh', '-c', 'nft -f "$1" && nft -f "$1" && nft -j list table inet pd_bundle',
                          '_', str(path)], capture_output=True, text=True)
    assert res.returncode == 0, '%s: %s' % (path, res.stderr)
    return json.loads(res.stdout)['nftables']


def _verdict(doc, saddr, dport):
    """What the loaded input chain does with a new TCP connection (not over loopback) from saddr to dport:
    accept, reject or drop. Matches this does not model (ct state, iif, udp, ICMP, VRRP) never match such a packet."""
    sets = {o['set']['name']: o['set'].get('elem', []) for o in doc if 'set' in o}
    chain = next(o['chain'] for o in doc if 'chain' in o and o['chain']['name'] == 'input')
    fam = 'ip6' if ':' in saddr else 'ip'

    def elems(right):
        return sets[right[1:]] if isinstance(right, str) and right.startswith('@') else \
            right['set'] if isinstance(right, dict) and 'set' in right else [right]

    for rule in (o['rule'] for o in doc if 'rule' in o and o['rule']['chain'] == 'input'):
        verdict, hit = None, True
        for e in rule['expr']:
            if 'match' in e:
                left, right = e['match']['left'].get('payload', {}), e['match']['right']
                if (left.get('protocol'), left.get('field')) == ('tcp', 'dport'):
                    hit = _in(dport, elems(right))
                elif left.get('field') == 'saddr':
                    hit = left.get('protocol') == fam and _ip_in(saddr, elems(right))
                else:
                    hit = False
                if not hit:
                    break
            verdict = next((k for k in ('accept', 'drop', 'reject') if k in e), verdict)
        if hit and verdict:
            return verdict
    return chain['policy']


def _want_sources(h, groups, hv):
    """{port: the source kinds allowed} of host h, written out from the issue's table (not from bundle.py): a
    group name, 'store' (store clients), 'monitoring' (the monitoring group and firewall_extra_sources), 'cluster'
    (every bundle host), 'any'; an empty set is loopback only."""
    want = {22: {'any'}}  # firewall_public_tcp_ports, open with firewall_default_drop
    if groups.get('monitoring'):  # a node exporter on every bundle host
        want[9100] = {'monitoring'}
    if h in groups.get('monitoring', []):  # Prometheus, Alertmanager
        want.update({9090: {'monitoring'}, 9093: {'monitoring'}})
    if h in groups['etcd']:
        want.update({2379: {'etcd'}, 2380: {'etcd'}, 2381: {'monitoring'}, 2479: {'mooncake_master', 'store'}})
    if h in groups['mooncake_master']:
        # 8080, the HTTP metadata server: off (auto) with HA masters or in P2P mode; _source_problems wants it dropped
        want.update({50051: {'store'}, 9003: {'monitoring'}})
    if h in groups['mooncake_master'] + groups['vllm_prefill'] + groups['vllm_decode']:
        want.update({p: set(KV) for p in (15000, 16000, 17000, 18800)})
    for g in ('vllm_prefill', 'vllm_decode'):
        for n, i in enumerate(hv[h]['vllm_instances'] if h in groups[g] else []):
            want[i['port']] = {'vllm_router', 'monitoring'}  # the API (routers' key) and /metrics
            if g == 'vllm_prefill':  # the pinned side channels: 16 apart, one per TP rank
                want.update({p: set(KV) for p in (18100 + 16 * n, 18100 + 16 * n + i['tensor_parallel_size'] - 1)})
                # bootstrap: the KV peers, and the routers (vllm-router queries it when it starts)
                want[i['bootstrap_port']] = KV | {'vllm_router'}
    if h in groups['vllm_router']:
        want.update({8000: {'entry'} if groups.get('entry') else {'any'}, 29000: {'monitoring'}})
    if h in groups.get('entry', []):
        want.update({443: {'any'}, 8404: set()})
    want.update({p: {'cluster'} for p in hv[h].get('firewall_cluster_tcp_ports', [])})
    return want


def _probes(inventory, store):
    """(address, the source kinds it belongs to) of every bundle host, a monitoring and an outside address."""
    groups, hv = inventory
    hosts = sorted({h for g in BUNDLE_GROUPS for h in groups.get(g, [])})
    probes = [(hv[p]['ansible_host'], {g for g in BUNDLE_GROUPS if p in groups.get(g, [])} | {'cluster'}
               | ({'store'} if p in store else set())) for p in hosts]
    return probes + [(MONITORING_IP, {'monitoring'}), (OUTSIDER_IP, set())]


def _pool_hosts(hv, h):
    """{pool name: its prefill and decode hosts} of the model pools vLLM host h serves in (vllm_pools as written)."""
    out = {}
    for p in hv[h].get('vllm_pools') or []:
        hosts = {str(r).partition('/')[0] for role in ('prefill', 'decode') for r in p.get(role) or []}
        if h in hosts:
            out[p['name']] = hosts
    return out


def _source_problems(doc, h, inventory, store, table=None):
    """Where host h's loaded ruleset doc differs from _want_sources: for each of its ports every probe gets
    accept when it is of an allowed kind, else reject; a port of no service (and the first side-channel port past
    the pinned ones) is dropped for all. With model pools a vLLM host's KV peers are the hosts of its own pools: a
    prefill or decode host of another pool only is no KV peer of h."""
    groups, hv = inventory
    probes, bad = _probes(inventory, store), []
    own = set().union(*_pool_hosts(hv, h).values()) if _pool_hosts(hv, h) else None
    for port, kinds in sorted(_want_sources(h, groups, hv).items()):
        allowed = []
        for ip, kind in probes:
            peer = next((p for p in hv if hv[p].get('ansible_host') == ip), None)
            if own is not None and peer not in own:
                kind = kind - KV
            want = 'accept' if 'any' in kinds or kinds & kind else 'reject'
            got = _verdict(doc, ip, port)
            allowed += [ip] if got == 'accept' else []
            if got != want:
                bad.append('%s:%s from %s (%s): %s, want %s' % (h, port, ip, ','.join(sorted(kind)), got, want))
        if table is not None:
            table.append('%-9s %-6s %-28s %s' % (h, port, ','.join(sorted(kinds)) or 'loopback', ' '.join(allowed)))
    others = [5555] + ([18100 + 16 * len(hv[h]['vllm_instances'])] if h in groups['vllm_prefill'] else []) \
        + ([8080] if h in groups['mooncake_master'] else [])
    bad += ['%s:%s from %s: %s, want drop' % (h, p, ip, _verdict(doc, ip, p))
            for p in others for ip, _ in probes if _verdict(doc, ip, p) != 'drop']
    return bad


def _check_rulesets(render, inventory, store):
    groups, hv = inventory
    entry_ips = [hv[e]['ansible_host'] for e in groups.get('entry', [])]
    table = []
    for h in sorted({h for g in BUNDLE_GROUPS for h in groups.get(g, [])}):
        doc = _load_ruleset(render / h / 'etc/pd-bundle/firewall.nft')
        rules = [o['rule']['expr'] for o in doc if 'rule' in o]
        assert json.dumps(rules[0]).find('"lo"') > 0 and json.dumps(rules[1]).find('established') > 0, rules[:2]
        chain = next(o['chain'] for o in doc if 'chain' in o)
        assert chain['policy'] == 'drop', 'inventory/prod ships firewall_default_drop: true (%s)' % h
        bad = _source_problems(doc, h, inventory, store, table)
        assert not bad, '\n'.join(bad)
        peers = [ip for ip in entry_ips if ip != hv[h]['ansible_host']]
        sets = {o['set']['name']: o['set'].get('elem', []) for o in doc if 'set' in o}
        if h in groups.get('entry', []):
            assert peers and sorted(e for e in sets['vrrp_peers_v4']) == sorted(peers), (h, sets.get('vrrp_peers_v4'))
        else:
            assert 'vrrp_peers_v4' not in sets, h
    print('host      port   allowed kinds                accepted from\n' + '\n'.join(table))


def _p2p_store_clients(inventory):
    """P2P (inventory/prod): the store clients are the store tier's prefill hosts (vllm_store_tier, on for every prefill
    in inventory/prod) and verify.yml's store round trip (the first prefill and decode host)."""
    groups, hv = inventory
    tier = {h for h in groups['vllm_prefill'] if hv[h].get('vllm_store_tier')}
    assert tier == set(groups['vllm_prefill']), 'inventory/prod runs the store tier on every prefill host'
    return tier | {groups['vllm_prefill'][0], groups['vllm_decode'][0]}


def test_firewall_rulesets_load_and_protect(prod_render, inventory):
    """Each host's ruleset loads (nft, in a throwaway user+network namespace) and admits, per port, exactly the
    sources that use it."""
    _need_tools('nft', 'unshare')
    _check_rulesets(prod_render, inventory, _p2p_store_clients(inventory))


def test_firewall_store_mode_admits_every_store_client(store_render, inventory):
    """Store mode: every prefill and decode host reaches etcd's plain listener and the master's RPC and metadata."""
    _need_tools('nft', 'unshare')
    groups, _ = inventory
    _check_rulesets(store_render, inventory, set(groups['vllm_prefill'] + groups['vllm_decode']))


# A protocol written by name needs /etc/protocols (netbase), which minimal hosts and the lab's containers lack:
# nft then refuses the whole ruleset. The rulesets name protocols by number.
PROTOCOL_BY_NAME = re.compile(r'\b(?:l4proto|ip protocol|ip6 nexthdr)\s+(?:\{[^}]*[a-z][^}]*\}|[a-z][a-z0-9-]*)')


def test_firewall_names_no_protocol_by_name(prod_render):
    rulesets = sorted(prod_render.glob('*/etc/pd-bundle/firewall.nft'))
    assert rulesets
    for f in rulesets:
        hits = PROTOCOL_BY_NAME.findall(f.read_text())
        assert not hits, '%s names a protocol (needs netbase; write its number): %s' % (f.relative_to(prod_render), hits)
    assert PROTOCOL_BY_NAME.search('meta l4proto { icmp, ipv6-icmp } accept')
    assert not PROTOCOL_BY_NAME.search('meta l4proto { 1, 58 } accept\nip protocol 112 accept')


def test_firewall_proof_catches_a_wrong_source(prod_render, inventory, tmp_path):
    """The per-port proof fails when one port admits one class too many: monitoring on etcd's plain listener
    (the issue's bypass), written into a copy of a rendered ruleset."""
    _need_tools('nft', 'unshare')
    groups, _ = inventory
    h = groups['etcd'][0]
    text = (prod_render / h / 'etc/pd-bundle/firewall.nft').read_text()
    assert text.count('elements = { 2381, 9003, 9100 }') == 1, 'the monitoring class of %s changed shape' % h
    wrong = tmp_path / 'wrong.nft'
    wrong.write_text(text.replace('elements = { 2381, 9003, 9100 }', 'elements = { 2381, 9003, 9100, 2479 }'))
    bad = _source_problems(_load_ruleset(wrong), h, inventory, _p2p_store_clients(inventory))
    mon = groups['monitoring'][0]
    assert bad == ['%s:2479 from %s (cluster,monitoring): accept, want reject' % (h, inventory[1][mon]['ansible_host']),
                   '%s:2479 from %s (monitoring): accept, want reject' % (h, MONITORING_IP)], bad


MANIFEST = REPO / 'tests' / 'render' / 'prod-render.sha256'


def test_render_is_byte_identical_to_the_recorded_one(prod_render):
    """Every file inventory/prod renders, byte for byte, against tests/render/prod-render.sha256.

    A refactor must not change what lands on hosts. A change that should (a new flag, a fixed unit)
    updates the manifest in the same commit, so the diff lists every rendered file it touches:
        make render-manifest
    """
    from conftest import render_manifest
    got = render_manifest(prod_render)
    want = MANIFEST.read_text() if MANIFEST.exists() else ''
    if got != want:
        g = dict(reversed(line.split('  ', 1)) for line in got.splitlines())
        w = dict(reversed(line.split('  ', 1)) for line in want.splitlines())
        diff = sorted(f for f in set(g) | set(w) if g.get(f) != w.get(f))
        raise AssertionError('render of inventory/prod differs from %s in %d file(s): %s\n'
                             'If the change is intended: make render-manifest, and say why in the commit.'
                             % (MANIFEST.relative_to(REPO), len(diff), ', '.join(diff[:20])))


# inventory/prod without its model pools: vllm_pools and entry_key_models removed, and the two routers the second
# pool added (router-3, router-4). Issue 34's promise to existing users: an inventory without pools renders exactly
# what the bundle rendered before pools (this manifest is the one of the commit before pools, and stays so).
NO_POOLS = {'group_vars/all.yml': {'vllm_pools': '__delete__'},
            'group_vars/entry/main.yml': {'entry_key_models': '__delete__'},
            'hosts.yml': {'all.children.vllm_router.hosts.router-3': '__delete__',
                          'all.children.vllm_router.hosts.router-4': '__delete__'}}
NO_POOLS_MANIFEST = REPO / 'tests' / 'render' / 'prod-no-pools-render.sha256'


def test_an_inventory_without_pools_renders_as_before_pools(tmp_path):
    """Every file of inventory/prod without its pools, byte for byte, against the render from before pools."""
    import shutil
    from conftest import apply_patch, render, render_manifest
    inv = tmp_path / 'inventory'
    shutil.copytree(REPO / 'inventory' / 'prod', inv)
    apply_patch(inv, NO_POOLS)
    res = render(inv, tmp_path / 'render')
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    got = render_manifest(tmp_path / 'render')
    want = NO_POOLS_MANIFEST.read_text()
    g = dict(reversed(line.split('  ', 1)) for line in got.splitlines())
    w = dict(reversed(line.split('  ', 1)) for line in want.splitlines())
    diff = sorted(f for f in set(g) | set(w) if g.get(f) != w.get(f))
    assert not diff, ('inventory/prod without pools renders %d file(s) unlike before pools (%s): %s'
                      % (len(diff), NO_POOLS_MANIFEST.relative_to(REPO), ', '.join(diff[:20])))


def test_no_secret_on_any_command_line(prod_render, inventory):
    """No vault secret reaches a command line: every rendered unit's ExecStart, expanded with the unit's
    EnvironmentFiles as systemd would, holds none of them; they live only in 0600 env files."""
    _, hv = inventory
    secrets = {str(v) for h in hv.values() for k, v in h.items() if k.startswith('vault_') and len(str(v)) >= 8}
    assert secrets, 'inventory/prod has no vault_ secret: the test would prove nothing'
    units = sorted(prod_render.rglob('*.service'))
    assert units
    for unit in units:
        host_root = prod_render / unit.relative_to(prod_render).parts[0]
        env = {}
        for line in unit.read_text().splitlines():
            if line.startswith('EnvironmentFile='):
                f = host_root / line.split('=', 1)[1].lstrip('-').lstrip('/')
                if f.exists():
                    env.update(parse_env_file(f))
        argv = expand_exec(unit_exec_start(unit), env)
        leaked = [s for s in secrets if any(s in a for a in argv)]
        assert not leaked, f'{unit.relative_to(prod_render)}: a vault secret is on the command line: {command_line(argv)[:200]}'
    holders = [p for p in prod_render.rglob('*') if p.is_file() and any(s in p.read_text(errors='ignore') for s in secrets)]
    # keepalived reads its VRRP password (auth_pass) from its config only: that file, 0600, may hold it too.
    assert holders and all((p.name.endswith('.env') or p.relative_to(prod_render).parts[1:] == ('etc', 'keepalived', 'keepalived.conf'))
                           and stat.S_IMODE(p.stat().st_mode) == 0o600 for p in holders), holders


def _managed_table():
    import importlib.util
    spec = importlib.util.spec_from_file_location('managed', REPO / 'plugins' / 'filter' / 'managed.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rendered_vllm_command_and_env_are_the_managed_table(prod_render, inventory):
    """What the bundle writes for a vLLM instance is what plugins/filter/managed.py lists (preflight refuses an
    override of exactly these): every env key (inventory/prod sets no extra env), and every flag before the
    extra args; each managed flag is on the command line with the bundle's value last."""
    mg = _managed_table()
    groups, hv = inventory
    for group in ('vllm_prefill', 'vllm_decode'):
        for host, inst in instances(inventory, group):
            env = parse_env_file(prod_render / host / 'etc/vllm' / ('%s.env' % inst['name']))
            assert set(env) <= set(mg.VLLM_ENV), set(env) - set(mg.VLLM_ENV)
            argv = expand_exec(unit_exec_start(prod_render / host / 'etc/systemd/system/vllm@.service'), env)
            extra = [str(a) for a in hv[host].get('vllm_extra_args', [])] + [str(a) for a in inst.get('extra_args', [])]
            # vLLM's CLI: VENV/bin/vllm serve MODEL (the positional model wins over any --model), then the flags
            positional = [env[e['env']] for e in mg.VLLM_FLAGS if e.get('positional')]
            assert argv[0].endswith('/bin/vllm') and argv[1] == 'serve' and positional == [env['SERVE_MODEL']]
            assert argv[2:2 + len(positional)] == positional
            head = argv[2 + len(positional):len(argv) - len(env['SERVE_EXTRA_ARGS'].split())]
            # tail and switch flags follow the extra args (SERVE_EXTRA_ARGS); the others come before them
            after = {e['flag'] for e in mg.VLLM_FLAGS if 'tail' in e or 'switch' in e or e.get('positional')}
            assert {a for a in head if a.startswith('--')} == {e['flag'] for e in mg.VLLM_FLAGS} - after
            tail = env['SERVE_EXTRA_ARGS'].split()
            assert tail[:len(extra)] == extra
            assert {a for a in tail[len(extra):] if a.startswith('--')} <= after
            # prefill instances render tokens for the routers' cache_aware (vllm_prefill_render, on in prod)
            assert ('--enable-scale-out' in tail[len(extra):]) == (group == 'vllm_prefill')


def test_render_mode_refuses_what_systemd_ignores(tmp_path):
    """Render mode runs systemd-analyze verify on every unit it writes: with preflight's value rules skipped,
    a state directory outside /var/lib renders StateDirectory=/srv/vllm, which systemd ignores; the render
    fails on that line and keeps no such unit."""
    out = tmp_path / 'render'
    cmd = [ansible_bin('ansible-playbook'), 'playbooks/render.yml', '-i', str(REPO / 'inventory' / 'prod'),
           '-e', 'render_dir=%s' % out, '-e', json.dumps({'preflight_skip': ['values'], 'vllm_state_dir': '/srv/vllm'}),
           '--tags', 'preflight,vllm', '--limit', 'gpu-d1']
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_VAULT_PASSWORD_FILE=str(VAULT_PASS_TEST_ONLY))
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode != 0
    assert 'StateDirectory= path is absolute, ignoring: /srv/vllm' in res.stdout + res.stderr
    assert not list(out.glob('*/etc/systemd/system/vllm@.service'))


def test_instances_demand_the_routers_key(prod_render, inventory):
    """Every vLLM instance host gets the routers' key (what vllm-router sends its workers as OPENAI_API_KEY) as
    VLLM_API_KEY in /etc/vllm/api-key.env (0600), which vllm@.service reads as environment: the only file of the
    host that holds it, and never in ExecStart (test_no_secret_on_any_command_line expands it)."""
    groups, _ = inventory
    keys = {parse_env_file(prod_render / r / 'etc/vllm-router/api-key.env')['OPENAI_API_KEY'] for r in groups['vllm_router']}
    assert len(keys) == 1 and all(keys), 'inventory/prod: one router key expected'
    key = keys.pop()
    for h in groups['vllm_prefill'] + groups['vllm_decode']:
        root = prod_render / h
        key_file = root / 'etc/vllm/api-key.env'
        assert parse_env_file(key_file) == {'VLLM_API_KEY': key}, h
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600, h
        unit = root / 'etc/systemd/system/vllm@.service'
        assert 'EnvironmentFile=/etc/vllm/api-key.env' in unit.read_text().splitlines(), h
        assert key not in unit_exec_start(unit), h
        holders = sorted(p.relative_to(root).as_posix() for p in root.rglob('*')
                         if p.is_file() and key in p.read_text(errors='ignore'))
        assert holders == ['etc/vllm/api-key.env'], (h, holders)
