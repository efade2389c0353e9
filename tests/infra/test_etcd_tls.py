"""etcd with TLS (etcd_tls_enabled): https only on the client port, with the CA and a client certificate;
https peers; and the plain listener that Mooncake's etcd client (no TLS settings) uses."""
import json

import pytest

from conftest import deployed_etcd_env, etcdctl, groups, hvars, in_group, read_root_file


@pytest.fixture
def member(host):
    if not in_group(host, 'etcd'):
        pytest.skip('not an etcd member')
    v = hvars(host)
    if str(v.get('etcd_tls_enabled', False)).lower() not in ('true', 'yes', '1'):
        pytest.skip('etcd_tls_enabled is off in the inventory')
    env = deployed_etcd_env(host)
    assert 'ETCD_CERT_FILE' in env, 'the inventory turns TLS on, the deployed member runs without it'
    return host, v, env


def tls_curl(v, env, url, cert=True):
    cmd = 'curl -sS -m 10 --cacert %s' % env['ETCD_TRUSTED_CA_FILE']
    if cert:
        cmd += ' --cert %s --key %s' % (v.get('etcd_tls_client_cert_file', v['etcd_cert_dir'] + '/client.crt'),
                                        v.get('etcd_tls_client_key_file', v['etcd_cert_dir'] + '/client.key'))
    return '%s %s' % (cmd, url)


def tool_ran(res, tool):
    """A refusal counts only when the tool ran: rc 127/126 (not found / not executable) is no refusal."""
    assert res.rc not in (126, 127), '%s did not run (rc=%d): %s' % (tool, res.rc, (res.stderr or res.stdout).strip()[:300])


# curl's exit codes when a TLS server drops a client: 35 handshake failed, 52 empty reply (plain http
# to a TLS port), 55/56 send/receive failed (connection reset: a certificate was required).
CURL_TLS_REFUSALS = (35, 52, 55, 56)


def test_plain_http_refused_on_client_port(member):
    host, v, _ = member
    url = 'http://%s:%s' % (v['common_host_ip'], v['etcd_client_port'])
    res = host.run('curl -sS -m 10 -w "\\n%%{http_code}" %s/health' % url)
    tool_ran(res, 'curl')
    body, _, code = res.stdout.rpartition('\n')
    assert code != '200', 'plain http on the client port answered: %s' % res.stdout
    # Refused by the TLS listener: the connection closed (52) or Go's "HTTP request to an HTTPS server" 400.
    assert res.rc in CURL_TLS_REFUSALS or (code == '400' and 'HTTPS server' in body), \
        'unexpected answer to plain http (rc=%d): %s %s' % (res.rc, res.stdout, res.stderr)
    res = host.run('etcdctl --endpoints=%s --command-timeout=5s endpoint health' % url)
    tool_ran(res, 'etcdctl')
    assert res.rc != 0, 'etcdctl over plain http worked: %s' % res.stdout
    assert 'is unhealthy' in res.stdout + res.stderr, 'etcdctl failed for another reason: %s %s' % (res.stdout, res.stderr)


def test_https_needs_ca_and_client_certificate(member):
    host, v, env = member
    # Every name a local client may use must match the member certificate's SANs.
    for name in (v['common_host_ip'], '127.0.0.1', 'localhost'):
        url = 'https://%s:%s/health' % (name, v['etcd_client_port'])
        out = host.check_output(tls_curl(v, env, url))
        assert json.loads(out)['health'] == 'true', (url, out)
    if env.get('ETCD_CLIENT_CERT_AUTH') == 'true':
        res = host.run(tls_curl(v, env, 'https://%s:%s/v3/kv/range' % (v['common_host_ip'], v['etcd_client_port']),
                                cert=False) + " -X POST -d '{\"key\": \"AA==\"}'")
        tool_ran(res, 'curl')
        assert res.rc != 0, 'a client without a certificate was served: %s' % res.stdout
        assert res.rc in CURL_TLS_REFUSALS, \
            'a client without a certificate failed, but not in TLS (rc=%d): %s' % (res.rc, res.stderr)


def test_cluster_health_over_tls(member):
    host, _, _ = member
    out = host.check_output(etcdctl(host) + ' endpoint health --cluster -w json')
    health = json.loads(out)
    assert len(health) == len(groups(host)['etcd']), out
    assert all(h['health'] and h['endpoint'].startswith('https://') for h in health), out


def test_peer_and_client_urls_are_https(member):
    host, _, env = member
    assert env['ETCD_LISTEN_PEER_URLS'].startswith('https://'), env['ETCD_LISTEN_PEER_URLS']
    members = json.loads(host.check_output(etcdctl(host) + ' member list -w json'))['members']
    for m in members:
        assert all(u.startswith('https://') for u in m['peerURLs']), m
        assert all(u.startswith('https://') for u in m.get('clientURLs', [])), m


def test_keys_private_to_etcd(member):
    host, v, env = member
    user = v.get('etcd_user', 'etcd')
    for key in (env['ETCD_KEY_FILE'], v.get('etcd_tls_client_key_file', v['etcd_cert_dir'] + '/client.key')):
        f = host.file(key)
        assert f.exists and f.user == user and f.mode == 0o600, (key, f.user, oct(f.mode))


def test_mooncake_plain_listener(member, request):
    """Mooncake's listener serves plain http on the host IP, and the masters use it."""
    host, v, _ = member
    url = 'http://%s:%s' % (v['common_host_ip'], v['etcd_mooncake_client_port'])
    host.check_output('etcdctl --endpoints=%s --command-timeout=5s endpoint health' % url)
    # Not on loopback, and not advertised to clients.
    assert not host.socket('tcp://127.0.0.1:%s' % v['etcd_mooncake_client_port']).is_listening
    members = json.loads(host.check_output(etcdctl(host) + ' member list -w json'))['members']
    assert not any(str(v['etcd_mooncake_client_port']) in u for m in members for u in m.get('clientURLs', []))
    if in_group(host, 'mooncake_master'):
        args = [l for l in read_root_file(host, '/etc/mooncake/master.env').splitlines()
                if l.startswith('MOONCAKE_MASTER_ARGS=')][0]
        if '--enable_ha=true' in args:
            endpoints = args.split('--etcd_endpoints=')[1].split()[0].split(';')
            assert endpoints and all(e.endswith(':%s' % v['etcd_mooncake_client_port']) for e in endpoints), args
