"""plugins/filter/managed.py: the one table of what the bundle manages on a vLLM instance, tied to the templates
that render it (both ways: every managed name the templates write is in the table, every table entry is
written), and its filters."""
import importlib.util
import os
import re

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mg = _load('managed', 'plugins/filter/managed.py')


def _read(path):
    with open(os.path.join(REPO, path)) as fh:
        return fh.read()


def written_env_names():
    """Every variable the vLLM templates and tasks write: env file lines, the unit's Environment=, hf-token.env."""
    env_tpl = _read('templates/vllm/instance.env.j2')
    unit = _read('templates/vllm/vllm@.service.j2')
    tasks = _read('roles/vllm/tasks/configure.yml')
    names = set(re.findall(r'^([A-Z][A-Z0-9_]*)=', env_tpl, re.M))
    names |= set(re.findall(r'^Environment=([A-Z][A-Z0-9_]*)=', unit, re.M))
    names |= set(re.findall(r'content: "([A-Z][A-Z0-9_]*)=', tasks))
    return names


def test_every_written_env_variable_is_managed_and_every_managed_one_written():
    written = written_env_names()
    assert written - set(mg.VLLM_ENV) == set(), 'written but not in managed.VLLM_ENV'
    assert set(mg.VLLM_ENV) - written == set(), 'in managed.VLLM_ENV but never written'


def test_exec_start_comes_from_the_table():
    unit = _read('templates/vllm/vllm@.service.j2')
    assert re.search(r'^ExecStart=\{\{ vllm_venv \| pd_bundle\.serving\.bundle_vllm_exec_start \}\}$', unit, re.M)
    cmd = mg.vllm_exec_start('/opt/vllm/venv/')
    assert cmd == ('/opt/vllm/venv/bin/vllm serve ${SERVE_MODEL} '
                   '--served-model-name ${SERVE_SERVED_MODEL_NAME} --host ${SERVE_BIND_HOST} --port ${SERVE_PORT} '
                   '--tensor-parallel-size ${SERVE_TP} --kv-transfer-config ${SERVE_KV_TRANSFER_CONFIG} '
                   '--middleware pd_bundle_drain.DrainMiddleware $SERVE_EXTRA_ARGS')
    refs = set(re.findall(r'\$\{?([A-Z_]+)\}?', cmd))
    assert refs <= set(mg.VLLM_ENV)


def test_every_flag_has_one_way_to_render():
    for entry in mg.VLLM_FLAGS:
        assert sum(k in entry for k in ('env', 'value', 'tail', 'switch')) == 1, entry
        assert not entry.get('positional') or 'env' in entry, entry
        assert entry['flag'].startswith('--') and entry['vars']
        if 'env' in entry:
            assert entry['env'] in mg.VLLM_ENV


def test_env_template_reads_the_table():
    env_tpl = _read('templates/vllm/instance.env.j2')
    assert '| pd_bundle.serving.bundle_vllm_serve_extra_args(' in env_tpl and '| pd_bundle.serving.bundle_vllm_user_env |' in env_tpl
    assert '--max-model-len' not in env_tpl  # the tail flags come from the table


def test_mooncake_json_fields_are_the_managed_ones():
    tpl = _read('templates/vllm/mooncake.json.j2')
    fields = set(re.findall(r"^\s+'([a-z_]+)':", tpl, re.M)) - {'global_segment_size', 'local_buffer_size'}
    assert fields == set(mg.MOONCAKE_JSON)
    assert '| pd_bundle.serving.bundle_vllm_user_store_config |' in tpl


def test_serve_extra_args_puts_the_tail_last():
    assert mg.vllm_serve_extra_args(['--enforce-eager'], {'vllm_max_model_len': 32768}) == \
        ['--enforce-eager', '--max-model-len', '32768']
    assert mg.vllm_serve_extra_args(['--enforce-eager'], {'vllm_max_model_len': 0}) == ['--enforce-eager']
    assert mg.vllm_serve_extra_args([], {'vllm_max_model_len': '2048'}) == ['--max-model-len', '2048']
    assert mg.vllm_serve_extra_args([], {}) == []
    # a switch: the flag alone, only when its variable is true (a prefill instance with vllm_prefill_render)
    assert mg.vllm_serve_extra_args([], {'vllm_prefill_render': True}) == ['--enable-scale-out']
    assert mg.vllm_serve_extra_args([], {'vllm_prefill_render': False}) == []


def test_a_cpu_instance_of_one_worker_runs_it_in_the_engine_process():
    """vllm_cpu_in_process_worker: only vllm_platform cpu with tensor parallel 1; the operator's backend wins."""
    assert mg.vllm_in_process_worker('cpu', 1, True) is True
    assert mg.vllm_in_process_worker('cpu', '1', True) is True
    assert mg.vllm_in_process_worker('cpu', 2, True) is False
    assert mg.vllm_in_process_worker('cuda', 1, True) is False
    assert mg.vllm_in_process_worker('cpu', 1, False) is False
    assert mg.vllm_serve_extra_args(['--enforce-eager'], {'in_process_worker': True}) == \
        ['--enforce-eager', '--distributed-executor-backend', 'uni']
    assert mg.vllm_serve_extra_args([], {'in_process_worker': False}) == []
    assert mg.vllm_serve_extra_args(['--distributed_executor_backend=mp'], {'in_process_worker': True}) == \
        ['--distributed_executor_backend=mp']


def test_user_env_and_store_config_refuse_managed_names():
    assert mg.vllm_user_env({'NCCL_DEBUG': 'INFO'}) == {'NCCL_DEBUG': 'INFO'}
    with pytest.raises(mg.AnsibleFilterError, match='VLLM_HOST_IP'):
        mg.vllm_user_env({'VLLM_HOST_IP': '10.0.0.1'})
    assert mg.vllm_user_store_config({'transfer_timeout': 5}) == {'transfer_timeout': 5}
    with pytest.raises(mg.AnsibleFilterError, match='protocol'):
        mg.vllm_user_store_config({'protocol': 'tcp'})


@pytest.mark.parametrize('tokens,expected', [
    (['--port', '9000'], [('--port', '9000', 0)]),
    (['--port=9000'], [('--port', '9000', 0)]),
    (['--served_model_name', 'x'], [('--served-model-name', 'x', 0)]),
    (['-tp', '2', '--enforce-eager'], [('--tensor-parallel-size', '2', 0), ('--enforce-eager', None, 2)]),
    (['--seed', '-1'], [('--seed', '-1', 0)]),
    (['--override-generation-config', '{"port":1}'], [('--override-generation-config', '{"port":1}', 0)]),
])
def test_parse_flags(tokens, expected):
    assert mg.parse_flags(tokens) == expected


def test_managed_flag_knows_aliases():
    assert mg.managed_flag('--tensor-parallel-size')['env'] == 'SERVE_TP'
    assert mg.managed_flag(mg.flag_name('-tp'))['env'] == 'SERVE_TP'
    assert mg.managed_flag('--max-num-seqs') is None
