"""What the bundle manages on a vLLM instance's command line, in its environment and in its mooncake.json:
ONE table, read by the renderers (the unit's ExecStart, the env file, mooncake.json) and by preflight, which
refuses an escape hatch (vllm_extra_args, an instance's extra_args, mooncake_env / vllm_env / an instance's
env, vllm_mooncake_store_config) that repeats a managed name. A flag or variable added here is rendered from
here and protected at once; tests/unit/test_managed.py ties the rendered files to this table both ways.

Why refuse: argparse keeps the LAST value of a repeated flag, and systemd the last assignment of a repeated
variable in an EnvironmentFile (and an EnvironmentFile beats the unit's Environment=). The bundle's own
view of the instance (router worker lists, firewall, status, the transfer check) would then describe a
setup that no longer exists.

Filters:
- bundle_vllm_exec_start: the unit's ExecStart command from the venv: `vllm serve`, managed flags, then the extra args
- bundle_vllm_serve_extra_args: SERVE_EXTRA_ARGS: the extra args, then the managed flags that follow them
- bundle_vllm_user_env: the operator's env dict, refused when it names a managed variable
- bundle_vllm_user_store_config: the operator's mooncake.json fields, refused when one is managed
Helpers for preflight (plugins/plugin_utils/preflight/): parse_flags, flag_name, managed_flag.
"""
import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # unit tests run without ansible
    class AnsibleFilterError(Exception):
        pass

# What the unit runs (vllm@.service's ExecStart): the venv's console script and its subcommand, as vLLM documents it
# and operators type it. `python -m vllm.entrypoints.openai.api_server` (what the units ran before) warns in 0.33 that it
# is deprecated.
VLLM_CLI = ('vllm', 'serve')
# The env variable that carries the operator's extra arguments ($VAR: systemd splits it into tokens).
VLLM_EXTRA_ARGS_ENV = 'SERVE_EXTRA_ARGS'

# Managed vLLM flags, in ExecStart order. env: the env-file variable carrying the value (${VAR}: one
# argument); value: a literal; tail: rendered into SERVE_EXTRA_ARGS after the extra args when the variable
# is a positive integer. vars: what the operator sets instead (the fix). appends: argparse action=append
# (a repeat adds, it does not replace: not an override).
# positional: rendered as `vllm serve`'s positional model (model_tag). It wins over a --model in the extra args, and
# --model stays managed so that preflight refuses one there all the same.
VLLM_FLAGS = [
    {'flag': '--model', 'env': 'SERVE_MODEL', 'positional': True, 'vars': 'vllm_model'},
    {'flag': '--served-model-name', 'env': 'SERVE_SERVED_MODEL_NAME', 'vars': 'vllm_served_model_name'},
    {'flag': '--host', 'env': 'SERVE_BIND_HOST', 'vars': 'vllm_bind_host'},
    {'flag': '--port', 'env': 'SERVE_PORT', 'vars': 'vllm_instances[].port'},
    {'flag': '--tensor-parallel-size', 'aliases': ['-tp'], 'env': 'SERVE_TP',
     'vars': 'vllm_instances[].tensor_parallel_size (default: one per GPU of gpus)'},
    {'flag': '--kv-transfer-config', 'env': 'SERVE_KV_TRANSFER_CONFIG',
     'vars': 'vllm_kv_connector, vllm_kv_load_failure_policy, vllm_mooncake_num_workers and the instance\'s '
             'engine_id / nics'},
    {'flag': '--middleware', 'value': 'pd_bundle_drain.DrainMiddleware', 'appends': True,
     'vars': 'nothing (the drain middleware of rolling restarts)'},
    {'flag': '--max-model-len', 'tail': 'vllm_max_model_len', 'vars': 'vllm_max_model_len'},
    # The routers' cache_aware (and kv_aware) tokenize a prompt with the prefill's POST /v1/completions/render,
    # which vLLM answers 403 without this ("missing_tokens": the router then routes by load; docs/routing.md).
    # It also opens vLLM's token-in/token-out routes; all of them under /v1 or /inference, behind the API key.
    {'flag': '--enable-scale-out', 'switch': 'vllm_prefill_render',
     'vars': 'vllm_prefill_render (prefill instances only)'},
]

# A CPU instance of one worker (vllm_cpu_in_process_worker, tensor parallel 1): its worker runs inside vLLM's engine
# process instead of a third process of its own. vLLM on CPU forces the multiprocess executor unless
# VLLM_ENABLE_V1_MULTIPROCESSING=0 (vllm/platforms/cpu.py, for OMP thread binding, which the lab turns off: nobind);
# the API server keeps its engine process either way (AsyncLLM does not read the variable). Measured on the lab: one
# process less importing torch, a start of 20 s instead of 31 s on an idle lab, ~0.5 GiB less per instance. The
# operator's own --distributed-executor-backend wins (the flag is then left out, not managed).
IN_PROCESS_WORKER_FLAG = ['--distributed-executor-backend', 'uni']
IN_PROCESS_WORKER_ENV = 'VLLM_ENABLE_V1_MULTIPROCESSING'

# Short aliases of vLLM flags (vllm/engine/arg_utils.py, EngineArgs.add_cli_args: -tp, -pp, -dp, -q).
VLLM_ALIASES = {'-tp': '--tensor-parallel-size', '-pp': '--pipeline-parallel-size', '-dp': '--data-parallel-size',
                '-q': '--quantization'}

# Managed environment of a vLLM instance -> what the operator sets instead. The env file
# (templates/vllm/instance.env.j2), the unit's Environment= (vllm@.service) and hf-token.env.
VLLM_ENV = {
    'SERVE_MODEL': 'vllm_model',
    'SERVE_SERVED_MODEL_NAME': 'vllm_served_model_name',
    'SERVE_BIND_HOST': 'vllm_bind_host',
    'SERVE_PORT': 'vllm_instances[].port',
    'SERVE_TP': 'vllm_instances[].tensor_parallel_size',
    'SERVE_KV_TRANSFER_CONFIG': 'vllm_kv_connector (and the KV settings of the role)',
    'SERVE_EXTRA_ARGS': 'vllm_extra_args / vllm_instances[].extra_args',
    'VLLM_HOST_IP': 'common_host_ip / vllm_instances[].host_ip',
    'VLLM_MOONCAKE_BOOTSTRAP_PORT': 'vllm_instances[].bootstrap_port / vllm_default_bootstrap_port',
    'PD_BUNDLE_BOOTSTRAP_HOST': 'common_host_ip / vllm_instances[].host_ip',
    'PD_BUNDLE_SIDE_CHANNEL_PORT': 'vllm_instances[].side_channel_port / vllm_side_channel_port_base',
    'PD_BUNDLE_SIDE_CHANNEL_SPAN': 'vllm_instances[].tensor_parallel_size',
    'VLLM_MOONCAKE_CONNECTOR_TIMEOUT': 'vllm_mooncake_connector_timeout',
    'VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT': 'vllm_mooncake_abort_request_timeout',
    'CUDA_VISIBLE_DEVICES': 'vllm_instances[].gpus',
    'VLLM_CPU_KVCACHE_SPACE': 'vllm_cpu_kvcache_space_gib',
    'VLLM_CPU_OMP_THREADS_BIND': 'vllm_cpu_omp_threads_bind',
    IN_PROCESS_WORKER_ENV: 'vllm_cpu_in_process_worker',
    'MC_MIN_RPC_PORT': 'mooncake_rpc_port_min',
    'MC_MAX_RPC_PORT': 'mooncake_rpc_port_max',
    'MC_FORCE_TCP': 'mooncake_protocol',
    'MC_TE_FILTERS': 'vllm_instances[].nics',
    'MC_GID_INDEX': 'vllm_instances[].gid_index (or the rdma role\'s selection)',
    'WITH_NVIDIA_PEERMEM': 'rdma_gpudirect',
    'MOONCAKE_CONFIG_PATH': 'vllm_kv_connector (store mode) / vllm_store_tier',
    'PD_BUNDLE_MULTI_METRICS': 'vllm_store_tier',
    'MC_STORE_CLUSTER_ID': 'mooncake_cluster_id',
    'PD_BUNDLE_STORE_LOOKUP_WAIT_MS': 'vllm_store_lookup_wait_ms',
    'HF_HOME': 'vllm_hf_home',
    'HF_HUB_OFFLINE': 'vllm_model (an absolute path is served offline)',
    'HF_TOKEN': 'vllm_hf_token',
    'VLLM_API_KEY': 'vllm_router_api_key (the routers\' key, in _vllm_api_key_file)',
    'PYTHONPATH': 'nothing (the bundle\'s drain middleware and side-channel pin)',
    'PD_BUNDLE_DRAIN_FILE': 'nothing (rolling restarts)',
    'PD_BUNDLE_DRAIN_TIMEOUT': 'vllm_drain_timeout',
    'PD_BUNDLE_SENDER_TASKS': 'vllm_mooncake_sender_per_request',
    'PD_BUNDLE_STORE_BREAKER_MS': 'vllm_store_tier_timeout_ms',
    'HOME': 'vllm_state_dir',
}

# Managed fields of a store-mode instance's mooncake.json (templates/vllm/mooncake.json.j2) -> the setting.
MOONCAKE_JSON = {
    'local_hostname': 'common_host_ip / vllm_instances[].host_ip',
    'metadata_server': 'mooncake_metadata_backend',
    'master_server_address': 'the mooncake_master group',
    'protocol': 'mooncake_protocol',
    'device_name': 'vllm_instances[].nics',
}

_NUMBER = re.compile(r'^-?[0-9.]+$')


def flag_name(token):
    """The canonical flag a token names ('--block_size=16' -> '--block-size', '-tp' -> '--tensor-parallel-size'),
    None when it is a value. vLLM's parser turns underscores in long options into dashes."""
    token = str(token)
    if not token.startswith('-') or _NUMBER.match(token) or token == '-':
        return None
    name = token.split('=', 1)[0]
    if name.startswith('--'):
        name = '--' + name[2:].replace('_', '-')
    return VLLM_ALIASES.get(name, name)


def parse_flags(tokens):
    """[(flag, value or None, index)] of an argument list: --flag=value or --flag value (the next token when it
    is no flag itself)."""
    tokens = [str(t) for t in tokens or []]
    out = []
    for i, tok in enumerate(tokens):
        name = flag_name(tok)
        if name is None:
            continue
        if '=' in tok:
            value = tok.split('=', 1)[1]
        elif i + 1 < len(tokens) and flag_name(tokens[i + 1]) is None:
            value = tokens[i + 1]
        else:
            value = None
        out.append((name, value, i))
    return out


def managed_flag(flag):
    """The VLLM_FLAGS entry of a canonical flag (aliases included), None when the bundle does not manage it."""
    for entry in VLLM_FLAGS:
        if flag == entry['flag'] or flag in entry.get('aliases', []):
            return entry
    return None


def vllm_exec_start(venv):
    """vllm@.service's command: the venv's `vllm serve`, the positional model, every other managed flag from its env
    variable (or literal), then $SERVE_EXTRA_ARGS (split into one argument per token)."""
    parts = ['%s/bin/%s' % (str(venv).rstrip('/'), VLLM_CLI[0])] + list(VLLM_CLI[1:])
    parts += ['${%s}' % e['env'] for e in VLLM_FLAGS if e.get('positional')]
    for entry in VLLM_FLAGS:
        if entry.get('positional'):
            continue
        if 'env' in entry:
            parts += [entry['flag'], '${%s}' % entry['env']]
        elif 'value' in entry:
            parts += [entry['flag'], entry['value']]
    return ' '.join(parts + ['$' + VLLM_EXTRA_ARGS_ENV])


def _positive_int(value):
    try:
        return int(value) > 0
    except (TypeError, ValueError):
        return False


def vllm_serve_extra_args(extra_args, settings):
    """SERVE_EXTRA_ARGS' tokens: the operator's extra args, then each tail flag whose variable (settings[var])
    is a positive integer (after the extra args, so the bundle's value is the last one), then each switch whose
    variable is true, then IN_PROCESS_WORKER_FLAG when settings['in_process_worker'] is true and the operator
    named no executor backend."""
    out = [str(a) for a in extra_args or []]
    for entry in VLLM_FLAGS:
        if 'tail' in entry and _positive_int((settings or {}).get(entry['tail'])):
            out += [entry['flag'], str(int(settings[entry['tail']]))]
        elif 'switch' in entry and (settings or {}).get(entry['switch']) is True:
            out.append(entry['flag'])
    if (settings or {}).get('in_process_worker') is True \
            and IN_PROCESS_WORKER_FLAG[0] not in [f for f, _, _ in parse_flags(out)]:
        out += IN_PROCESS_WORKER_FLAG
    return out


def vllm_in_process_worker(platform, tensor_parallel, enabled):
    """Whether an instance runs its worker inside the engine process (IN_PROCESS_WORKER_FLAG and _ENV): a CPU
    instance of one worker, with vllm_cpu_in_process_worker on."""
    return str(platform) == 'cpu' and str(tensor_parallel) == '1' and enabled is True


def vllm_user_env(env, where='the instance environment'):
    """env unchanged, or an error when it sets a managed variable (preflight refuses it first, with the host)."""
    clash = sorted(k for k in dict(env or {}) if k in VLLM_ENV)
    if clash:
        raise AnsibleFilterError('%s sets %s, managed by the bundle (%s). Fix: remove it and set the variable named.'
                                 % (where, ', '.join(clash), '; '.join('%s: %s' % (k, VLLM_ENV[k]) for k in clash)))
    return env


def vllm_user_store_config(cfg):
    """vllm_mooncake_store_config's fields unchanged, or an error when one is a managed mooncake.json field."""
    clash = sorted(k for k in dict(cfg or {}) if k in MOONCAKE_JSON)
    if clash:
        raise AnsibleFilterError('vllm_mooncake_store_config sets %s, managed by the bundle (%s).'
                                 % (', '.join(clash), '; '.join('%s: %s' % (k, MOONCAKE_JSON[k]) for k in clash)))
    return cfg


class FilterModule(object):
    def filters(self):
        return {
            'bundle_vllm_exec_start': vllm_exec_start,
            'bundle_vllm_serve_extra_args': vllm_serve_extra_args,
            'bundle_vllm_in_process_worker': vllm_in_process_worker,
            'bundle_vllm_user_env': vllm_user_env,
            'bundle_vllm_user_store_config': vllm_user_store_config,
        }
