"""The entry (roles/entry): HAProxy with TLS and client keys in front of the routers, keepalived's VIP.

    pytest tests/infra/test_entry.py --hosts='ansible://all' --ansible-inventory=inventory/prod

What a user sees, from this machine through the VIP: the OpenAI API with a key (200), nothing without one (401),
no router admin path even with one (404), TLS 1.2+ only; on the hosts: HAProxy and keepalived active, the VIP on
exactly one entry host, and the access log naming the key, never holding it.
The client key: PD_ENTRY_KEY (and PD_ENTRY_KEY_NAME), else the first of the inventory's entry_keys. The CA:
PD_ENTRY_CA, else entry_tls_ca_dir/ca.crt (the bundle's entry CA on the controller) (conftest.entry_client).
A completion and a streamed chat completion through the entry, whose KV arrives at decode by transfer:
tests/infra/test_e2e.py.
"""
import json
import re
import socket
import ssl
import time

import pytest

from conftest import (entry_call, entry_cfg, entry_client, entry_hosts, first_entry, in_group, inventory_value,
                      other_host)

ADMIN_PATHS = ['/workers', '/list_workers', '/metrics', '/health', '/v1/../workers']


def test_haproxy_and_keepalived_active(host):
    if not in_group(host, 'entry'):
        pytest.skip('not an entry host')
    v = entry_cfg(host)
    units = ['haproxy'] + (['keepalived'] if len(entry_hosts(host)) > 1 else [])
    for unit in units:
        assert host.service(unit).is_running and host.service(unit).is_enabled, '%s is not active and enabled' % unit
    ports = {int(l.split()[3].rpartition(':')[2]) for l in host.check_output('ss -Htln').splitlines() if l.strip()}
    assert int(v['entry_port']) in ports, 'nothing listens on entry_port %s' % v['entry_port']


def test_the_vip_is_on_exactly_one_entry_host(host, request):
    if not first_entry(host) or len(entry_hosts(host)) < 2:
        pytest.skip('checked once, with 2+ entry hosts')
    v = entry_cfg(host)
    vip = inventory_value(v['entry_vip'], v)
    holders = [n for n in entry_hosts(host)
               if other_host(request, n).run('ip -o addr show to %s' % vip).stdout.strip()]
    assert len(holders) == 1, 'the VIP %s is on %s (exactly one entry host must hold it)' % (vip, holders or 'no host')


def test_openai_api_with_a_key_and_nothing_else(host):
    if not first_entry(host):
        pytest.skip('checked once, from this machine through the entry')
    v = entry_cfg(host)
    base, name, key, ctx = entry_client(host)
    status, body = entry_call(base, '/v1/models', ctx, key)
    assert status == 200 and json.loads(body).get('data'), 'key %s: /v1/models -> %s %s' % (name, status, body[:200])
    assert entry_call(base, '/v1/models', ctx)[0] == 401, 'no key must get 401'
    assert entry_call(base, '/v1/models', ctx, 'not-a-key-of-this-entry')[0] == 401, 'a wrong key must get 401'
    for path in ADMIN_PATHS:
        assert entry_call(base, path, ctx, key)[0] == 404, '%s must not reach the routers (404), even with a key' % path
    assert entry_call(base, '/remove_worker?url=http://x', ctx, key, method='POST', data=b'')[0] == 404
    assert entry_call(base, v['entry_health_path'], ctx)[0] == 200, 'the entry health path answers without a key'


def test_tls_1_2_or_newer_only_and_h2(host):
    if not first_entry(host):
        pytest.skip('checked once')
    base, _, _, ctx = entry_client(host)
    hostport = base.split('://', 1)[1]
    addr, port = hostport.rsplit(':', 1)
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.check_hostname, old.verify_mode = False, ssl.CERT_NONE
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        old.set_ciphers('ALL:@SECLEVEL=0')
    except ssl.SSLError:
        pass
    with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
        with socket.create_connection((addr, int(port)), timeout=10) as s, old.wrap_socket(s):
            pass
    ctx.set_alpn_protocols(['h2', 'http/1.1'])
    with socket.create_connection((addr, int(port)), timeout=10) as s, ctx.wrap_socket(s, server_hostname=addr) as t:
        assert t.version() in ('TLSv1.2', 'TLSv1.3') and t.selected_alpn_protocol() == 'h2'


def test_access_log_names_the_key_never_holds_it(host, request):
    if not first_entry(host):
        pytest.skip('checked once')
    base, name, key, ctx = entry_client(host)
    marker = '/v1/models?pd-log-probe'
    assert entry_call(base, marker, ctx, key)[0] == 200
    logs = {n: other_host(request, n).run("journalctl -u haproxy --since '-10 min' -o cat --no-pager").stdout
            for n in entry_hosts(host)}
    lines = [l for out in logs.values() for l in out.splitlines() if 'pd-log-probe' in l]
    assert lines, 'no access log line of the request in the entry hosts\' journals'
    assert all('key="%s"' % name in l for l in lines), lines
    assert not any(key in out for out in logs.values()), 'a client key is in an entry host\'s journal'


def _haproxy_workers(host):
    """PIDs of HAProxy's workers: the children of the unit's main process (the master)."""
    master = host.check_output('systemctl show -p MainPID --value haproxy').strip()
    out = host.run('pgrep -P %s -x haproxy' % master).stdout
    return set(out.split())


def test_reload_retires_the_old_workers(host):
    """Adding or revoking a key is `systemctl reload haproxy`: new workers read the new map, and the old ones
    must stop accepting and exit once their connections are done (here: none), or a revoked key keeps working
    on them. The master signals them across uids (CAP_KILL in the unit's sandbox); without it they stayed."""
    if not in_group(host, 'entry'):
        pytest.skip('not an entry host')
    old = _haproxy_workers(host)
    assert old, 'no HAProxy worker runs'
    host.run_expect([0], 'systemctl reload haproxy')
    deadline, now = time.monotonic() + 15, set()
    while time.monotonic() < deadline:
        now = _haproxy_workers(host)
        if now and not now & old:
            break
        time.sleep(0.5)
    assert now and not now & old, ('after a reload the old HAProxy workers %s are still running (workers now: %s): '
                                   'they keep serving the old key map' % (sorted(old & now), sorted(now)))
    assert len(now) == 1, 'one worker expected after the reload, found %s' % sorted(now)



def test_completion_ids_do_not_show_the_cluster(host):
    """Through the entry, with the official SDK (keep-alive, no retries), a completion and a streamed one: no id, no
    body and no header shows an instance's address (vllm-router puts them in the id; the entry's Lua filter cuts
    them out, templates/entry/hide-topology.lua.j2)."""
    if not first_entry(host):
        pytest.skip('checked once, from this machine through the entry')
    import openai
    v = entry_cfg(host)
    base, _, key, ctx = entry_client(host)
    model = inventory_value(host.ansible.get_variables().get('vllm_served_model_name', ''), v)
    client = openai.OpenAI(base_url=base + '/v1', api_key=key, max_retries=0, timeout=300,
                           http_client=openai.DefaultHttpx2Client(verify=ctx, timeout=300))
    raw = client.completions.with_raw_response.create(model=model, prompt='the entry hides the cluster ' * 20,
                                                      max_tokens=4, temperature=0)
    ids = [raw.parse().id]
    headers = ' '.join('%s: %s' % kv for kv in raw.headers.items())
    ids += [c.id for c in client.completions.create(model=model, prompt='streamed through the entry ' * 20,
                                                    max_tokens=4, temperature=0, stream=True)]
    assert len(ids) > 2 and all(i.startswith('cmpl-') for i in ids), ids
    leaks = [i for i in ids + [headers] if 'addr' in i or re.search(r'\d+\.\d+\.\d+\.\d+', i)]
    assert not leaks, 'the cluster shows through the entry: %s' % leaks
