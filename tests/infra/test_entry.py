"""The entry (roles/entry): HAProxy with TLS and client keys in front of the routers, keepalived's VIP.

    pytest tests/infra/test_entry.py --hosts='ansible://all' --ansible-inventory=inventory/prod

What a user sees, from this machine through the VIP: the OpenAI API with a key (200), nothing without one (401),
no router admin path even with one (404), TLS 1.2+ only; on the hosts: HAProxy and keepalived active, the VIP on
exactly one entry host, and the access log naming the key, never holding it.
The client key: PD_ENTRY_KEY (and PD_ENTRY_KEY_NAME), else the first of the inventory's entry_keys. The CA:
PD_ENTRY_CA, else entry_tls_ca_dir/ca.crt (the bundle's entry CA on the controller).
"""
import json
import os
import re
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import groups, hvars, in_group, other_host, role_defaults

DEFAULTS = role_defaults('entry_port', 'entry_health_path', 'entry_check_port')
ADMIN_PATHS = ['/workers', '/list_workers', '/metrics', '/health', '/v1/../workers']


def cfg(h):
    v = dict(DEFAULTS)
    v.update(hvars(h))
    return v


def _resolve(value, v):
    """A value as the inventory gives it: "{{ name }}" is that variable, the HOME lookup is this user's home."""
    if not isinstance(value, str):
        return value
    m = re.fullmatch(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", value.strip())
    if m:
        return _resolve(v[m.group(1)], v)
    home = "{{ lookup('ansible.builtin.env', 'HOME') }}"
    if value.startswith(home):
        return os.path.expanduser('~') + value[len(home):]
    if '{{' in value:
        raise AssertionError('cannot read %r here: set PD_ENTRY_KEY / PD_ENTRY_CA' % value)
    return value


def entry_hosts(h):
    return groups(h).get('entry', [])


def first_entry(h):
    """The tests that look at the whole entry run once, on the first entry host."""
    return in_group(h, 'entry') and hvars(h)['inventory_hostname'] == entry_hosts(h)[0]


def client(h):
    """(base URL, key name, key, TLS context) as a user of the entry has them."""
    v = cfg(h)
    keys = _resolve(v.get('entry_keys'), v) or {}
    name = os.environ.get('PD_ENTRY_KEY_NAME') or (sorted(keys)[0] if keys else None)
    key = os.environ.get('PD_ENTRY_KEY') or keys.get(name)
    assert key, 'no entry key: set PD_ENTRY_KEY, or entry_keys in the inventory (with its vault password)'
    ca = os.environ.get('PD_ENTRY_CA') or str(Path(_resolve(v['entry_tls_ca_dir'], v)) / 'ca.crt')
    assert Path(ca).is_file(), 'no entry CA at %s: set PD_ENTRY_CA' % ca
    host = _resolve(v.get('entry_vip'), v) or v['common_host_ip']
    port = int(v['entry_port'])
    return 'https://%s:%d' % (host, port), name, key, ssl.create_default_context(cafile=ca)


def call(base, path, ctx, key=None, method='GET', data=None):
    req = urllib.request.Request(base + path, method=method, data=data,
                                 headers={'Authorization': 'Bearer %s' % key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
            return resp.status, resp.read().decode(errors='replace')
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors='replace')


def test_haproxy_and_keepalived_active(host):
    if not in_group(host, 'entry'):
        pytest.skip('not an entry host')
    v = cfg(host)
    units = ['haproxy'] + (['keepalived'] if len(entry_hosts(host)) > 1 else [])
    for unit in units:
        assert host.service(unit).is_running and host.service(unit).is_enabled, '%s is not active and enabled' % unit
    ports = {int(l.split()[3].rpartition(':')[2]) for l in host.check_output('ss -Htln').splitlines() if l.strip()}
    assert int(v['entry_port']) in ports, 'nothing listens on entry_port %s' % v['entry_port']


def test_the_vip_is_on_exactly_one_entry_host(host, request):
    if not first_entry(host) or len(entry_hosts(host)) < 2:
        pytest.skip('checked once, with 2+ entry hosts')
    vip = _resolve(cfg(host)['entry_vip'], cfg(host))
    holders = [n for n in entry_hosts(host)
               if other_host(request, n).run('ip -o addr show to %s' % vip).stdout.strip()]
    assert len(holders) == 1, 'the VIP %s is on %s (exactly one entry host must hold it)' % (vip, holders or 'no host')


def test_openai_api_with_a_key_and_nothing_else(host):
    if not first_entry(host):
        pytest.skip('checked once, from this machine through the entry')
    v = cfg(host)
    base, name, key, ctx = client(host)
    status, body = call(base, '/v1/models', ctx, key)
    assert status == 200 and json.loads(body).get('data'), 'key %s: /v1/models -> %s %s' % (name, status, body[:200])
    assert call(base, '/v1/models', ctx)[0] == 401, 'no key must get 401'
    assert call(base, '/v1/models', ctx, 'not-a-key-of-this-entry')[0] == 401, 'a wrong key must get 401'
    for path in ADMIN_PATHS:
        assert call(base, path, ctx, key)[0] == 404, '%s must not reach the routers (404), even with a key' % path
    assert call(base, '/remove_worker?url=http://x', ctx, key, method='POST', data=b'')[0] == 404
    assert call(base, v['entry_health_path'], ctx)[0] == 200, 'the entry health path answers without a key'


def test_tls_1_2_or_newer_only_and_h2(host):
    if not first_entry(host):
        pytest.skip('checked once')
    base, _, _, ctx = client(host)
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
    base, name, key, ctx = client(host)
    marker = '/v1/models?pd-log-probe'
    assert call(base, marker, ctx, key)[0] == 200
    logs = {n: other_host(request, n).run("journalctl -u haproxy --since '-10 min' -o cat --no-pager").stdout
            for n in entry_hosts(host)}
    lines = [l for out in logs.values() for l in out.splitlines() if 'pd-log-probe' in l]
    assert lines, 'no access log line of the request in the entry hosts\' journals'
    assert all('key="%s"' % name in l for l in lines), lines
    assert not any(key in out for out in logs.values()), 'a client key is in an entry host\'s journal'
