"""The wrong inventories that used to pass preflight, render and break on the hosts, by class (the check
functions called directly: the end-to-end cases of tests/preflight keep one per class):

1. pd_consistency: prefill and decode disagree on what KV shape and request length depend on
2. managed:        the escape hatches (extra args, extra env, store config) repeat a managed name
3. values:         values the services reject or ignore (vLLM, etcd, pip, systemd rules as data)
4. sandbox:        paths the hardened units hide or make read-only
5. addresses:      cluster members without a distinct, usable address

Each refused case names the variable, the host (or host/instance) and the fix; each class has legal
variations that pass.
"""
import copy
import importlib.util
import os

import pytest

from test_preflight_checks import GROUPS, INVENTORY, REPO, SPECS, fleet, pc

GOOD_FLEET = INVENTORY


def inv_with(changes):
    """INVENTORY with {host: {var: value}} set; 'vllm_instances.N.key' paths set an instance's key."""
    inv = copy.deepcopy(INVENTORY)
    for host, values in changes.items():
        inv.setdefault(host, {})
        for var, value in values.items():
            if var.startswith('vllm_instances.'):
                _, idx, key = var.split('.', 2)
                inv[host]['vllm_instances'][int(idx)][key] = value
            else:
                inv[host][var] = value
    return inv


def run_class(skip_class, inv, groups=None):
    """Every message of the checks of one preflight_skip class, fleet and per host."""
    groups = groups or GROUPS
    hv = fleet(inv)
    ids = {c['id'] for c in pc.CHECKS if c['skip'] == skip_class}
    assert ids, skip_class
    out = []
    for c in pc.CHECKS:
        if c['id'] not in ids:
            continue
        if c['scope'] == 'fleet':
            out += c['fn'](hv, groups, SPECS, 'ctl-1')
        else:
            out += [m for h in hv if '_preflight_cfg' in hv[h]
                    for m in c['fn'](hv[h]['_preflight_cfg'], h, groups, SPECS)]
    return out


def assert_refused(skip_class, changes, expected, groups=None):
    msgs = run_class(skip_class, inv_with(changes), groups)
    text = ' '.join(msgs)
    assert msgs, 'class %s accepted %s' % (skip_class, changes)
    for sub in expected + ['Fix:']:
        assert sub in text, 'missing %r in %s' % (sub, text)


def assert_passes(skip_class, changes, groups=None):
    assert run_class(skip_class, inv_with(changes), groups) == []


SECOND_DECODE_POOL = {
    'groups': dict(GROUPS, vllm_decode=['gpu-d1', 'gpu-d2']),
    'gpu-d2': {'ansible_host': '10.0.1.32', 'vllm_model': '/srv/models/m', 'vllm_host_gpu_count': 4,
               'vllm_instances': [{'name': 'decode0', 'port': 8200, 'gpus': [0, 1, 2, 3], 'tensor_parallel_size': 4,
                                   'extra_args': ['--max-num-seqs', '64']}]},
}


# --- class 1: prefill/decode consistency -------------------------------------------------------------

PD_REFUSED = {
    'served_name_on_decode': ({'gpu-d1': {'vllm_served_model_name': 'qwen-decode'}},
                              ['--served-model-name', '"m" on prefill gpu-p1/prefill0', '"qwen-decode" on decode gpu-d1/decode0',
                               'vllm_served_model_name once']),
    'model_on_decode': ({'gpu-d1': {'vllm_model': '/srv/models/other'}},
                        ['--model', '"/srv/models/other" on decode gpu-d1/decode0', 'Fix: set vllm_model once']),
    'block_size_per_instance': ({'gpu-d1': {'vllm_instances.0.extra_args': ['--block-size', '32']}},
                                ['--block-size', 'unset (vLLM\'s default) on prefill gpu-p1/prefill0',
                                 '"32" on decode gpu-d1/decode0 (from vllm_instances[decode0].extra_args)']),
    'block_size_on_one_prefill': ({'gpu-p1': {'vllm_instances.1.extra_args': ['--block_size=64']},
                                   'gpu-d1': {'vllm_extra_args': ['--block-size', '16']}},
                                  ['--block-size', 'gpu-p1/prefill1 (from vllm_instances[prefill1].extra_args)',
                                   'gpu-d1/decode0 (from vllm_extra_args)']),
    'kv_cache_dtype': ({'gpu-p1': {'vllm_extra_args': ['--kv-cache-dtype', 'fp8']},
                        'gpu-d1': {'vllm_extra_args': ['--kv-cache-dtype=fp8_e5m2']}},
                       ['--kv-cache-dtype', '"fp8" on prefill', '"fp8_e5m2" on decode']),
    'dtype': ({'gpu-d1': {'vllm_extra_args': ['--dtype', 'bfloat16']}}, ['--dtype', '"bfloat16" on decode gpu-d1/decode0']),
    'max_model_len_vs_extra_arg': ({'gpu-p1': {'vllm_max_model_len': 32768},
                                    'gpu-d1': {'vllm_extra_args': ['--max-model-len', '16k']}},
                                   ['--max-model-len', '"32768" on prefill', 'gpu-p1/prefill0, gpu-p1/prefill1 (from vllm_max_model_len)',
                                    '"16k" on decode gpu-d1/decode0 (from vllm_extra_args)']),
    'max_model_len_per_group': ({'gpu-d1': {'vllm_max_model_len': 8192}},
                                ['--max-model-len', 'unset (vLLM\'s default) on prefill', '"8192" on decode gpu-d1/decode0']),
    'revision': ({'gpu-p1': {'vllm_extra_args': ['--revision', 'abc123']}}, ['--revision', '"abc123" on prefill']),
    'pipeline_stages': ({'gpu-d1': {'vllm_extra_args': ['-pp', '2']}}, ['--pipeline-parallel-size', '"2" on decode']),
}


@pytest.mark.parametrize('case', sorted(PD_REFUSED))
def test_pd_consistency_refuses(case):
    changes, expected = PD_REFUSED[case]
    assert_refused('pd_consistency', changes, expected)


def test_pd_tp_layout_refuses_sizes_that_do_not_divide():
    inv = inv_with({'gpu-d1': {'vllm_instances': [{'name': 'decode0', 'port': 8200, 'gpus': [0, 1, 2],
                                                   'tensor_parallel_size': 3}]}})
    msgs = pc.pd_tp_layout(fleet(inv), GROUPS, SPECS, 'ctl-1')
    assert len(msgs) == 1  # prefill0 (4) and prefill1 (4 GPUs) x decode0 (3): one message per size pair
    for sub in ['prefill gpu-p1/prefill0 (vllm_instances[prefill0].tensor_parallel_size=4)',
                'decode gpu-d1/decode0 (vllm_instances[decode0].tensor_parallel_size=3)', 'and 1 more pairs', 'Fix:']:
        assert sub in msgs[0]


def test_pd_tp_layout_reads_the_extra_args_too():
    inv = inv_with({'gpu-d1': {'vllm_instances.0.extra_args': ['-tp', '3']}})
    msgs = pc.pd_tp_layout(fleet(inv), GROUPS, SPECS, 'ctl-1')
    assert msgs and 'decode gpu-d1/decode0 (vllm_instances[decode0].extra_args=3)' in msgs[0]


PD_LEGAL = {
    'same_values_spelled_differently': {'gpu-p1': {'vllm_extra_args': ['--dtype', 'half', '--kv-cache-dtype', 'fp8',
                                                                       '--max-model-len', '32K']},
                                        'gpu-d1': {'vllm_extra_args': ['--dtype=float16', '--kv-cache-dtype', 'fp8_e4m3'],
                                                   'vllm_max_model_len': 32768}},
    'default_spelled_out': {'gpu-d1': {'vllm_extra_args': ['--dtype', 'auto', '--pipeline-parallel-size', '1']}},
    'served_name_default_equals_the_set_one': {'gpu-d1': {'vllm_served_model_name': 'm'}},
    'model_path_with_trailing_slash': {'gpu-d1': {'vllm_model': '/srv/models/m/', 'vllm_served_model_name': 'm'}},
    'decode_only_flag_that_is_not_kv': {'gpu-d1': {'vllm_instances.0.extra_args': ['--max-num-seqs', '64']}},
}


@pytest.mark.parametrize('case', sorted(PD_LEGAL))
def test_pd_consistency_legal(case):
    assert_passes('pd_consistency', PD_LEGAL[case])


def test_second_decode_pool_by_inventory_only_passes_every_check():
    inv = inv_with({'gpu-d2': SECOND_DECODE_POOL['gpu-d2']})
    groups = SECOND_DECODE_POOL['groups']
    hv = fleet(inv)
    assert pc.fleet_errors(hv, groups, SPECS, [], 'ctl-1') == []
    for h in hv:
        assert pc.host_errors(hv[h]['_preflight_cfg'], h, groups, SPECS, []) == []


# --- class 2: managed settings -----------------------------------------------------------------------

MANAGED_REFUSED = {
    'port_in_extra_args': ({'gpu-d1': {'vllm_extra_args': ['--port', '9000']}},
                           ['vllm_extra_args on gpu-d1 repeats --port', 'set vllm_instances[].port instead']),
    'served_name_underscore_form': ({'gpu-p1': {'vllm_instances.1.extra_args': ['--served_model_name=x']}},
                                    ['vllm_instances[prefill1].extra_args on gpu-p1 repeats --served-model-name',
                                     'set vllm_served_model_name instead']),
    'tp_alias': ({'gpu-p1': {'vllm_instances.0.extra_args': ['-tp', '2']}},
                 ['vllm_instances[prefill0].extra_args on gpu-p1 repeats --tensor-parallel-size']),
    'kv_transfer_config': ({'gpu-d1': {'vllm_extra_args': ['--kv-transfer-config', '{}']}},
                           ['repeats --kv-transfer-config', 'vllm_kv_connector']),
    'max_model_len_in_extra_args': ({'gpu-d1': {'vllm_extra_args': ['--max-model-len=4096']},
                                     'gpu-p1': {'vllm_extra_args': ['--max-model-len=4096']}},
                                    ['repeats --max-model-len', 'set vllm_max_model_len instead']),
    'vllm_env_host_ip': ({'gpu-d1': {'vllm_env': {'VLLM_HOST_IP': '10.0.1.99'}}},
                         ['vllm_env on gpu-d1 sets VLLM_HOST_IP', 'common_host_ip / vllm_instances[].host_ip']),
    'instance_env_gpus': ({'gpu-p1': {'vllm_instances.0.env': {'CUDA_VISIBLE_DEVICES': '0'}}},
                          ['vllm_instances[prefill0].env on gpu-p1 sets CUDA_VISIBLE_DEVICES', 'vllm_instances[].gpus']),
    'mooncake_env_nics': ({'gpu-p1': {'mooncake_env': {'MC_TE_FILTERS': 'mlx5_0'}}},
                          ['mooncake_env on gpu-p1 sets MC_TE_FILTERS']),
    'env_hf_home': ({'gpu-d1': {'vllm_env': {'HF_HOME': '/data/hf'}}}, ['vllm_env on gpu-d1 sets HF_HOME', 'vllm_hf_home']),
    'store_config_protocol': ({'gpu-d1': {'vllm_mooncake_store_config': {'global_segment_size': '4gb',
                                                                         'protocol': 'tcp'}}},
                              ['vllm_mooncake_store_config.protocol on gpu-d1', 'mooncake_protocol']),
    'router_extra_worker': ({'router-1': {'vllm_router_extra_args': ['--decode', 'http://10.0.1.99:8200']}},
                            ['vllm_router_extra_args on router-1 repeats --decode', 'add the instance to the inventory']),
    'router_port': ({'router-1': {'vllm_router_extra_args': ['--port=9000']}},
                    ['vllm_router_extra_args on router-1 repeats --port', 'set vllm_router_port instead']),
    'master_ha_flag': ({'ctl-1': {'mooncake_master_extra_args': ['--enable_ha=false']}},
                       ['mooncake_master_extra_args on ctl-1 repeats --enable_ha']),
    'etcd_env_cluster': ({'ctl-1': {'etcd_extra_env': {'ETCD_INITIAL_CLUSTER': 'ctl-1=http://10.0.0.11:2380'}}},
                         ['etcd_extra_env on ctl-1 sets ETCD_INITIAL_CLUSTER']),
}


@pytest.mark.parametrize('case', sorted(MANAGED_REFUSED))
def test_managed_refuses(case):
    changes, expected = MANAGED_REFUSED[case]
    assert_refused('managed', changes, expected)


MANAGED_LEGAL = {
    'unmanaged_flag_per_instance': {'gpu-d1': {'vllm_instances.0.extra_args': ['--max-num-seqs', '64']}},
    'appending_flag': {'gpu-d1': {'vllm_extra_args': ['--middleware', 'my.Middleware']}},
    'unmanaged_env': {'gpu-d1': {'vllm_env': {'NCCL_DEBUG': 'INFO'}, 'mooncake_env': {'MC_LOG_LEVEL': 'WARNING'}}},
    'store_config_extra_field': {'gpu-d1': {'vllm_mooncake_store_config': {'global_segment_size': '4gb',
                                                                           'local_buffer_size': '1gb',
                                                                           'transfer_timeout': 5}}},
    'router_unmanaged_flag': {'router-1': {'vllm_router_extra_args': ['--log-level', 'debug']}},
    'master_unmanaged_flag': {'ctl-1': {'mooncake_master_extra_args': ['--max_threads=8']}},
    'etcd_unmanaged_env': {'ctl-1': {'etcd_extra_env': {'ETCD_LOG_LEVEL': 'warn'}}},
    'value_that_looks_like_a_flag_name': {'gpu-d1': {'vllm_extra_args': ['--override-generation-config',
                                                                         '{"port":1}']}},
}


@pytest.mark.parametrize('case', sorted(MANAGED_LEGAL))
def test_managed_legal(case):
    assert_passes('managed', MANAGED_LEGAL[case])


def test_readme_lists_every_new_class():
    readme = open(os.path.join(REPO, 'roles', 'preflight', 'README.md')).read()
    for cls in ('pd_consistency', 'managed', 'values', 'sandbox', 'addresses'):
        if any(c['skip'] == cls for c in pc.CHECKS):
            assert '`%s`' % cls in readme


# --- class 3: values the services refuse or ignore ---------------------------------------------------

VALUES_REFUSED = {
    'gpu_memory_fraction': ({'gpu-d1': {'vllm_extra_args': ['--gpu-memory-utilization', '1.2']}},
                            ['vllm_extra_args on gpu-d1: --gpu-memory-utilization "1.2" must be at most 1']),
    'block_size_choice': ({'gpu-p1': {'vllm_instances.0.extra_args': ['--block-size=24']}},
                          ['vllm_instances[prefill0].extra_args on gpu-p1: --block-size "24" is not one of']),
    'flag_without_value': ({'gpu-p1': {'vllm_extra_args': ['--kv-cache-dtype']}},
                           ['vllm_extra_args on gpu-p1: --kv-cache-dtype has no value']),
    'connector_timeout_zero': ({'gpu-d1': {'vllm_mooncake_connector_timeout': 0}},
                               ['vllm_mooncake_connector_timeout=0 on gpu-d1 must be at least 1']),
    'model_relative_path': ({'gpu-p1': {'vllm_model': 'models/qwen 3'}},
                            ['vllm_model="models/qwen 3" on gpu-p1 is neither an absolute path nor a hub id']),
    'etcd_election_vs_heartbeat': ({'ctl-1': {'etcd_heartbeat_interval': 500, 'etcd_election_timeout': 1000}},
                                   ['etcd_election_timeout=1000 on ctl-1 is below 5 x etcd_heartbeat_interval=500',
                                    'at least 2500']),
    'etcd_election_too_long': ({'ctl-1': {'etcd_election_timeout': 60000}},
                               ['etcd_election_timeout=60000 on ctl-1 must be at most 50000']),
    'master_watermark_fraction': ({'ctl-1': {'mooncake_master_eviction_high_watermark_ratio': 95}},
                                  ['mooncake_master_eviction_high_watermark_ratio=95 on ctl-1 must be at most 1']),
    'pip_find_links_relative': ({'gpu-p1': {'common_pip_find_links': 'wheels/'}},
                                ['common_pip_find_links="wheels/" on gpu-p1 is neither an http(s)/file URL']),
    'pip_index_not_a_url': ({'router-1': {'common_pip_index_url': 'pypi.internal/simple'}},
                            ['common_pip_index_url="pypi.internal/simple" on router-1 is not an http(s) URL']),
    'pip_requirement': ({'gpu-d1': {'vllm_pip_extra_packages': ['flashinfer==>0.2']}},
                        ['vllm_pip_extra_packages=["flashinfer==>0.2"] on gpu-d1']),
    'systemd_restart_sec': ({'ctl-1': {'mooncake_master_restart_sec': -1}},
                            ['mooncake_master_restart_sec=-1 on ctl-1', 'RestartSec=-1s']),
    'systemd_state_dir': ({'gpu-d1': {'vllm_state_dir': '/srv/vllm'}},
                          ['vllm_state_dir="/srv/vllm" on gpu-d1', 'StateDirectory=/srv/vllm']),
    'gid_index_range': ({'gpu-d1': {'vllm_instances.0.gid_index': 300}},
                        ['vllm_instances[decode0].gid_index=300 on gpu-d1']),
    'router_interval_zero': ({'router-1': {'vllm_router_health_check_interval_secs': 0}},
                             ['vllm_router_health_check_interval_secs=0 on router-1 must be at least 1']),
}


@pytest.mark.parametrize('case', sorted(VALUES_REFUSED))
def test_values_refuses(case):
    changes, expected = VALUES_REFUSED[case]
    assert_refused('values', changes, expected)


VALUES_LEGAL = {
    'vllm_flags_in_range': {'gpu-d1': {'vllm_extra_args': ['--gpu-memory-utilization', '0.85', '--max-num-seqs=128',
                                                           '--swap-space', '0', '--seed', '-1']},
                            'gpu-p1': {'vllm_extra_args': ['--gpu-memory-utilization=1']}},
    'hub_id_and_urls': {'gpu-p1': {'vllm_model': 'Qwen/Qwen3-32B', 'common_pip_index_url': 'https://pypi.internal/simple',
                                   'common_pip_find_links': 'file:///srv/wheels'},
                        'gpu-d1': {'vllm_model': 'Qwen/Qwen3-32B', 'vllm_pip_extra_packages': ['flashinfer-python>=0.2,<0.3']}},
    'etcd_slow_network': {'ctl-1': {'etcd_heartbeat_interval': 250, 'etcd_election_timeout': 2500}},
    'systemd_values': {'ctl-1': {'mooncake_master_restart_sec': 3}, 'gpu-d1': {'vllm_state_dir': '/var/lib/vllm-pd'}},
}


@pytest.mark.parametrize('case', sorted(VALUES_LEGAL))
def test_values_legal(case):
    assert_passes('values', VALUES_LEGAL[case])


def _systemd_ignores(tmp_path, line):
    """The "ignoring" lines of systemd-analyze verify for a unit with line (render mode's own verify)."""
    spec = importlib.util.spec_from_file_location('bt', os.path.join(REPO, 'plugins', 'action', 'bundle_template.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    unit = tmp_path / 'x.service'
    unit.write_text('[Service]\nExecStart=/bin/true\n%s\n' % line)
    lines = mod.systemd_ignoring(str(unit), 'x.service')
    assert lines is not None, 'systemd-analyze not installed: run scripts/install-deps.sh'
    return lines


@pytest.mark.parametrize('var', sorted(pc._rules.SYSTEMD_RULES))
def test_systemd_rules_agree_with_systemd(var, tmp_path):
    """Each systemd rule refuses what systemd-analyze verify ignores, and passes what it takes."""
    rule = pc._rules.SYSTEMD_RULES[var]
    spec_type = pc._spec_type(SPECS, var)
    # A value of another type ('10min' for an int) is its argument spec's to refuse, not a rule's.
    bad, good = {'mooncake_master_restart_sec': (-1, 3), 'vllm_state_dir': ('/srv/vllm', '/var/lib/vllm-pd')}[var]
    for value, refused in ((bad, True), (good, False)):
        rendered = rule['unit_line'] % (value if var != 'vllm_state_dir' else
                                        (value[len('/var/lib/'):] if value.startswith('/var/lib/') else value))
        assert bool(_systemd_ignores(tmp_path, rendered)) == refused, rendered
        assert (pc._rules.refusal(rule, value, spec_type) is not None) == refused, value


# --- class 4: unit sandboxes -------------------------------------------------------------------------

SANDBOX_REFUSED = {
    'model_under_home': ({'gpu-d1': {'vllm_model': '/home/m', 'vllm_served_model_name': 'm'},
                          'gpu-p1': {'vllm_model': '/home/m', 'vllm_served_model_name': 'm'}},
                         ['vllm_model="/home/m" on gpu-d1 is under /home', 'ProtectHome=yes',
                          'vllm@.service fails at start']),
    'model_under_run_user': ({'gpu-p1': {'vllm_model': '/run/user/m'}}, ['vllm_model="/run/user/m" on gpu-p1 is under /run/user']),
    'model_in_tmp': ({'gpu-p1': {'vllm_model': '/tmp/models/m'}},
                     ['vllm_model="/tmp/models/m" on gpu-p1 is under /tmp', 'PrivateTmp=yes']),
    'hf_home_read_only_for_a_hub_model': ({'gpu-p1': {'vllm_model': 'org/m', 'vllm_hf_home': '/srv/hf'}},
                                          ['vllm_hf_home="/srv/hf" on gpu-p1 is read-only for the unit',
                                           'ProtectSystem=strict', 'Fix: put it below /var/lib/vllm']),
    'hf_home_in_var_tmp': ({'gpu-d1': {'vllm_hf_home': '/var/tmp/hf'}},
                           ['vllm_hf_home="/var/tmp/hf" on gpu-d1 is under /var/tmp']),
    'etcd_data_in_tmp': ({'ctl-1': {'etcd_data_dir': '/tmp/etcd'}},
                         ['etcd_data_dir="/tmp/etcd" on ctl-1 is under /tmp', 'lost at every stop']),
    'etcd_data_under_home': ({'ctl-1': {'etcd_data_dir': '/home/etcd-data'}},
                             ['etcd_data_dir="/home/etcd-data" on ctl-1 is under /home']),
}


@pytest.mark.parametrize('case', sorted(SANDBOX_REFUSED))
def test_sandbox_refuses(case):
    changes, expected = SANDBOX_REFUSED[case]
    assert_refused('sandbox', changes, expected)


SANDBOX_LEGAL = {
    'model_under_srv_hf_home_elsewhere': {'gpu-p1': {'vllm_model': '/srv/models/m', 'vllm_hf_home': '/srv/hf'}},
    'hub_model_with_default_hf_home': {'gpu-p1': {'vllm_model': 'org/m'}},
    'hub_model_hf_home_in_state_dir': {'gpu-p1': {'vllm_model': 'org/m', 'vllm_state_dir': '/var/lib/vllm-pd',
                                                  'vllm_hf_home': '/var/lib/vllm-pd/cache/hf'}},
    'etcd_data_in_its_own_dir': {'ctl-1': {'etcd_data_dir': '/data/etcd'}},
    'home_like_names_elsewhere': {'gpu-d1': {'vllm_model': '/srv/home/models/m', 'vllm_served_model_name': 'm'},
                                  'gpu-p1': {'vllm_model': '/srv/home/models/m', 'vllm_served_model_name': 'm'}},
}


@pytest.mark.parametrize('case', sorted(SANDBOX_LEGAL))
def test_sandbox_legal(case):
    assert_passes('sandbox', SANDBOX_LEGAL[case])


def test_sandbox_comes_from_the_macro_and_the_unit_templates():
    """The directives preflight knows are the macro's; each unit's writable paths are its template's lines."""
    assert pc.sandbox_directives() == {'ProtectSystem': 'strict', 'ProtectHome': 'yes', 'PrivateTmp': 'yes'}
    for unit, spec in pc._rules.UNIT_PATHS.items():
        text = open(os.path.join(REPO, 'templates', spec['template'])).read()
        assert "import hardening" in text, unit
        for line in spec['writable'].values():
            assert line in text, '%s: %s' % (unit, line)


def test_sandbox_reads_other_directives(tmp_path):
    macro = tmp_path / 'hardening.j2'
    macro.write_text('ProtectSystem=full\nProtectHome=read-only\n')
    box = pc._sandbox(pc.sandbox_directives(str(macro)))
    assert box == {'hidden': [], 'private': [], 'read_only': ['/usr', '/boot', '/efi', '/etc', '/home', '/root',
                                                               '/run/user']}


# --- class 5: addresses ------------------------------------------------------------------------------

ADDRESSES_REFUSED = {
    'two_hosts_one_ip': ({'gpu-d1': {'common_host_ip': '10.0.1.21'}},
                         ['Hosts gpu-d1 (common_host_ip) and gpu-p1 (ansible_host) share the address 10.0.1.21']),
    'no_address_at_all': ({'router-1': {'ansible_host': None}},
                          ['router-1 has no usable cluster address', 'the inventory name']),
    'dns_name': ({'gpu-p1': {'ansible_host': 'gpu-p1.example.com'}},
                 ['gpu-p1 has no usable cluster address', 'ansible_host="gpu-p1.example.com"', 'FACTS failure mode 6']),
    'loopback': ({'ctl-1': {'common_host_ip': '127.0.0.1'}},
                 ['ctl-1 has no usable cluster address', 'common_host_ip="127.0.0.1" is a loopback address']),
    'unspecified': ({'gpu-d1': {'common_host_ip': '0.0.0.0'}}, ['common_host_ip="0.0.0.0" is the unspecified address']),
    'instance_on_another_hosts_ip': ({'gpu-d1': {'vllm_instances.0.host_ip': '10.0.1.21'}},
                                     ['vllm_instances[decode0].host_ip="10.0.1.21" on gpu-d1 is the address of gpu-p1']),
    'instance_on_loopback': ({'gpu-p1': {'vllm_instances.1.host_ip': '127.0.0.1'}},
                             ['vllm_instances[prefill1].host_ip="127.0.0.1" on gpu-p1 is a loopback address']),
}


@pytest.mark.parametrize('case', sorted(ADDRESSES_REFUSED))
def test_addresses_refuses(case):
    changes, expected = ADDRESSES_REFUSED[case]
    assert_refused('addresses', changes, expected)


ADDRESSES_LEGAL = {
    'two_instances_share_nics_and_ip': {'gpu-p1': {'vllm_instances.0.nics': ['mlx5_0', 'mlx5_1'],
                                                   'vllm_instances.1.nics': ['mlx5_0', 'mlx5_1']}},
    'instance_on_a_second_ip_of_its_host': {'gpu-p1': {'vllm_instances.1.host_ip': '10.0.2.21'}},
    'instance_host_ip_is_its_own_host': {'gpu-d1': {'vllm_instances.0.host_ip': '10.0.1.31'}},
    'ipv6_cluster_address': {'gpu-d1': {'common_host_ip': 'fd00::31'}},
    'ssh_name_with_cluster_ip': {'gpu-p1': {'ansible_host': 'gpu-p1.example.com', 'common_host_ip': '10.0.1.21'}},
}


@pytest.mark.parametrize('case', sorted(ADDRESSES_LEGAL))
def test_addresses_legal(case):
    assert_passes('addresses', ADDRESSES_LEGAL[case])


def test_hosts_outside_the_bundle_groups_need_no_address():
    inv = inv_with({'ctl-2': {'ansible_host': None}})  # ctl-2 is in no group of GROUPS
    assert run_class('addresses', inv) == []


def test_master_and_etcd_tables_are_their_renderers():
    """The master's flags and etcd's environment are read from the files that render them."""
    flags = pc._renderer_names(*pc.MASTER_ARGS_RENDERER)
    assert {'--rpc_port', '--metrics_port', '--enable_ha', '--cluster_id'} <= set(flags)
    env = pc._renderer_names(*pc.ETCD_ENV_RENDERER)
    assert {'ETCD_NAME', 'ETCD_DATA_DIR', 'ETCD_INITIAL_CLUSTER', 'ETCD_LISTEN_CLIENT_URLS'} <= set(env)


def test_value_rules_name_real_settings_and_take_types_from_the_specs():
    """Every rule is about a setting a role's argument spec declares; a number's type is the spec's."""
    rules = dict(pc._rules.SYSTEMD_RULES)
    for per_role in pc._rules.VAR_RULES.values():
        rules.update(per_role)
    for var, rule in rules.items():
        opt = pc._option(SPECS, var)
        assert opt, '%s: no argument spec declares it' % var
        assert 'type' not in rule, '%s: the type lives in the argument spec' % var
        if 'kind' not in rule:
            assert opt.get('type') in ('int', 'float'), var
