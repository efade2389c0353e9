"""Cluster checks with pytest-testinfra, reusable against a real cluster:

    pytest tests/infra --hosts='ansible://all' --ansible-inventory=inventory/prod

Variables come from the inventory (host.ansible.get_variables()); what the inventory leaves out
falls back to the roles' defaults, repeated here in DEFAULTS.
"""
import json
import time

import pytest

DEFAULTS = {
    'etcd_client_port': 2379,
    'mooncake_master_metrics_port': 9003,
    'mooncake_master_rpc_port': 50051,
    'vllm_router_port': 8000,
    'vllm_router_prometheus_port': 29000,
    'vllm_default_bootstrap_port': 8998,
    'vllm_kv_connector': 'MooncakeConnector',
}


def hvars(host):
    v = dict(DEFAULTS)
    v.update(host.ansible.get_variables())
    v.setdefault('common_host_ip', v.get('ansible_host', v['inventory_hostname']))
    return v


def groups(host):
    return hvars(host).get('groups', {})


def in_group(host, group):
    return hvars(host)['inventory_hostname'] in groups(host).get(group, [])


def curl_json(host, url, data=None, timeout=120):
    cmd = "curl -sS --fail-with-body -m %d -H 'Content-Type: application/json' %s" % (timeout, url)
    if data is not None:
        cmd += " -d '%s'" % json.dumps(data).replace("'", "'\\''")
    out = host.check_output(cmd)
    return json.loads(out)


def metric_value(text, name, labels):
    """Sum of a Prometheus counter's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + '{'):
            continue
        lab, _, val = line.partition('} ')
        if all('%s="%s"' % kv in lab for kv in labels.items()):
            total += float(val.split()[0])
    return total


def wait_until(fn, timeout=120, interval=2):
    end = time.time() + timeout
    while True:
        try:
            res = fn()
            if res:
                return res
        except Exception:  # noqa: BLE001 - retried until the deadline
            if time.time() > end:
                raise
        if time.time() > end:
            return fn()
        time.sleep(interval)


def deployed_kv_config(h, inst_name):
    """The kv-transfer-config an instance really runs with (from its env file), not the inventory's:
    a converge with -e vllm_kv_connector=... changes the deployment without touching the inventory."""
    for line in h.file('/etc/vllm/%s.env' % inst_name).content_string.splitlines():
        if line.startswith('SERVE_KV_TRANSFER_CONFIG='):
            return json.loads(line.split('=', 1)[1].strip("'"))
    raise AssertionError('no SERVE_KV_TRANSFER_CONFIG in /etc/vllm/%s.env' % inst_name)


def other_host(request, name):
    """A testinfra host for another inventory host, with the same inventory and connection."""
    import testinfra
    inv = request.config.option.ansible_inventory
    return testinfra.get_host('ansible://%s' % name, ansible_inventory=inv)


def host_ip(h):
    v = hvars(h)
    return v['common_host_ip']
