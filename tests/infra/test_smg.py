"""smg as the router (vllm_router_implementation: smg; roles/vllm_router): on each router host that runs it, its worker
API answers only with the routers' key, lists exactly the workers of its manifest, each ready and registered with what
Mooncake needs (a worker without it goes through passthrough: decode recomputes, silently), and nothing has gone
through passthrough. Requests through it moving KV are test_e2e.py's (its router API runs on every router host)."""
import json

import pytest
import yaml

from conftest import (REPO, ROUTER_KEY_FILE, check_output_masked, curl_json, hvars, in_group, read_root_file,
                      router_auth_headers, router_key_configured, run_as_root)
from conftest import BUNDLE, load_filter

ROUTER_VARS = yaml.safe_load((REPO / 'roles' / 'vllm_router' / 'vars' / 'main.yml').read_text())
MANIFEST = ROUTER_VARS['_vllm_router_manifest_file']
BUNDLE_SMG = load_filter('smg')


def smg_host(host):
    v = hvars(host)
    if not in_group(host, 'vllm_router') or v['vllm_router_implementation'] != 'smg':
        pytest.skip('no smg router on this host')
    return v, BUNDLE.router_local_url(v['inventory_hostname'], {v['inventory_hostname']: v})


def test_smg_unit_runs_smg_with_its_manifest(host):
    _, _ = smg_host(host)
    pid = host.check_output('systemctl show -p MainPID --value vllm-router')
    assert pid != '0'
    # smg names its process smg::router (setproctitle): the launcher handed over, and no key is on its command line
    # (test_units.py's scan covers every process).
    assert host.check_output('cat /proc/%s/comm' % pid).startswith('smg::router')
    f = host.file(MANIFEST)
    assert f.exists and f.mode == 0o640 and f.user == 'root' and f.group == hvars(host)['vllm_router_user']


def test_smg_worker_api_demands_the_key(host):
    _, base = smg_host(host)
    code = host.check_output("curl -s -o /dev/null -w '%%{http_code}' -m 10 %s/workers" % base)
    assert code == '401', 'smg answered /workers without the key: %s' % code
    code = host.check_output("curl -s -o /dev/null -w '%%{http_code}' -m 10 -H 'Authorization: Bearer wrong' %s/workers"
                             % base)
    assert code == '401', 'smg answered /workers with a wrong key: %s' % code


def test_smg_lists_its_manifest_each_ready_with_its_kv_registration(host):
    _, base = smg_host(host)
    manifest = json.loads(read_root_file(host, MANIFEST))
    listed = curl_json(host, base + '/workers', headers=router_auth_headers(host))
    plan = BUNDLE_SMG.smg_membership(listed, manifest)
    assert plan['in_sync'] and plan['ready'], plan
    by_url = {w['url'].rstrip('/'): w for w in listed['workers']}
    for w in manifest['workers']:
        got = by_url[w['url']]
        assert got.get('kv_connector') == 'MooncakeConnector', got
        if w['worker_type'] == 'prefill':
            assert got.get('kv_engine_id') == w['kv_engine_id'] and got.get('bootstrap_port') == w['bootstrap_port'], got


def test_smg_sent_nothing_through_passthrough(host):
    v, _ = smg_host(host)
    ip = str(v.get('vllm_router_prometheus_host') or '')
    ip = v['common_host_ip'] if not ip or '{' in ip else ip  # the role's default: the cluster address
    text = check_output_masked(host, 'curl -sS -m 10 http://%s:%s/metrics' % (ip, v['vllm_router_prometheus_port']), [])
    rows = [ln for ln in text.splitlines() if ln.startswith('smg_pd_kv_connector_mode_total')]
    passthrough = [ln for ln in rows if 'mode="passthrough"' in ln and float(ln.rsplit(' ', 1)[1]) > 0]
    assert passthrough == [], 'smg routed requests through passthrough (decode recomputed them): %s' % passthrough


# Runs on the host as root: reads the key from its 0600 file (never on this scanner's argv) and counts the journal
# lines of the router unit that hold it.
_JOURNAL_SCAN = r'''
import subprocess, sys
path, var = sys.argv[1], sys.argv[2]
key = [l.split("=", 1)[1].strip() for l in open(path) if l.startswith(var + "=")][0]
assert key
out = subprocess.run(["journalctl", "-u", "vllm-router", "--no-pager", "-o", "cat"], capture_output=True, text=True).stdout
print(sum(1 for line in out.splitlines() if key in line))
'''


def test_smg_journal_never_holds_the_key(host):
    """smg gets the key in process (pd-smg-launch); it must not log it (its config, a request's headers)."""
    v, _ = smg_host(host)
    if not router_key_configured(v):
        pytest.skip('no router key on this host')
    res = run_as_root(host, "python3 -c '%s' %s %s" % (_JOURNAL_SCAN.replace("'", "'\"'\"'"), ROUTER_KEY_FILE,
                                                       'VLLM_ROUTER_API_KEY'))
    assert res.rc == 0, res.stderr[-500:]
    assert res.stdout.strip() == '0', 'the router key is in %s lines of the vllm-router journal' % res.stdout.strip()


def test_router_runs_the_program_the_inventory_names(host):
    """Every router host runs the program its vllm_router_implementation names (a move between programs that stopped
    half way leaves the old one running: the router role restarts it on the next run)."""
    v = hvars(host)
    if not in_group(host, 'vllm_router'):
        pytest.skip('not a router host')
    want = v['vllm_router_implementation']
    pid = host.check_output('systemctl show -p MainPID --value vllm-router')
    comm = host.check_output('cat /proc/%s/comm' % pid)
    assert comm.startswith('smg::') == (want == 'smg'), '%s runs %r, its inventory names %s' % (
        v['inventory_hostname'], comm, want)
