"""The targets' own rules as data, each with its source: what vLLM, etcd, pip and systemd accept, and which
vLLM settings prefill and decode must share. Read by the preflight checks, plugins/plugin_utils/preflight/ (classes
pd, values, sandbox); no filter of its own. Unit-tested through the checks (tests/unit/test_preflight_classes.py).
"""
import re

# --- prefill/decode consistency (vLLM) ---------------------------------------------------------------------
# Settings every prefill and every decode instance must share: decode reads prefill's KV blocks as they are
# (model and weights, dtype, block size, KV cache dtype, pipeline stages decide a block's shape; the tokenizer
# and the length limit decide which request they belong to), and the router forwards one request, with
# one model name, to both. Flag -> why. Sources: vllm/config/model.py (model, revision, tokenizer,
# tokenizer_revision, dtype, max_model_len, quantization, hf_overrides), vllm/config/cache.py (block_size,
# cache_dtype), vllm/config/parallel.py (pipeline_parallel_size), vllm/entrypoints/openai/cli_args.py
# (served_model_name).
PD_EQUAL = {
    '--model': 'the model whose KV is computed on prefill and read on decode',
    '--served-model-name': 'the router forwards one request, with one model name, to prefill and decode',
    '--revision': 'the weights the KV was computed with',
    '--tokenizer': 'the tokens a prompt becomes',
    '--tokenizer-revision': 'the tokens a prompt becomes',
    '--dtype': 'the KV block layout (activation dtype)',
    '--kv-cache-dtype': 'the KV block layout',
    '--block-size': 'the KV block layout (tokens per block)',
    '--quantization': 'the weights the KV was computed with',
    '--hf-overrides': 'the model config the KV shape follows',
    '--max-model-len': 'how long a request may be: a prompt prefill accepts must fit decode',
    '--pipeline-parallel-size': 'which layers a rank holds (the KV blocks it sends or expects)',
}
# Spellings of one value (vllm/config/model.py _STR_DTYPE_TO_TORCH_DTYPE: half = float16, float = float32;
# vllm/config/cache.py: fp8 is fp8_e4m3 on CUDA) and vLLM's own default when the flag is absent
# (EngineArgs: dtype auto, kv_cache_dtype auto, pipeline_parallel_size 1).
PD_SAME_VALUE = {'--dtype': {'half': 'float16', 'float': 'float32'}, '--kv-cache-dtype': {'fp8': 'fp8_e4m3'}}
PD_DEFAULT = {'--dtype': 'auto', '--kv-cache-dtype': 'auto', '--pipeline-parallel-size': '1'}
# Tensor parallelism may differ between prefill and decode only where the KV heads split evenly: each rank
# of the larger side maps onto exactly one rank of the smaller (the P2P connectors' tp_ratio rule,
# vllm/distributed/kv_transfer/kv_connector/v1: remote TP a divisor or multiple of the local one).
PD_TP_FLAG = '--tensor-parallel-size'

_HUMAN = re.compile(r'^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)\s*$')
# vllm/utils (human_readable_int, --max-model-len): lowercase units are decimal, uppercase binary.
_HUMAN_UNITS = {'': 1, 'k': 10 ** 3, 'm': 10 ** 6, 'g': 10 ** 9, 't': 10 ** 12,
                'K': 2 ** 10, 'M': 2 ** 20, 'G': 2 ** 30, 'T': 2 ** 40}


def human_int(value):
    """--max-model-len's number ('32k' = 32000, '32K' = 32768, '32768'), None when it is none."""
    m = _HUMAN.match(str(value))
    if not m:
        return None
    number, unit = m.group(1), m.group(2)
    if '.' in number and unit in ('K', 'M', 'G', 'T'):
        return None  # vLLM: binary units take whole numbers only
    return int(float(number) * _HUMAN_UNITS[unit])


def pd_value(flag, value):
    """A PD setting's value as vLLM reads it, for comparing (None: unset, vLLM's own default)."""
    if value is None:
        value = PD_DEFAULT.get(flag)
    if value is None:
        return None
    value = str(value).strip()
    if flag == '--max-model-len':
        n = human_int(value)
        return str(n) if n is not None else value
    if flag == '--model' and value.startswith('/'):
        return value.rstrip('/') or '/'
    return PD_SAME_VALUE.get(flag, {}).get(value, value)


# --- values the services refuse or ignore -------------------------------------------------------------------
# A rule: min / max (min_open: min itself refused) of a number, choices, or a kind of string (abs_path, under a
# prefix, location, url, requirements, hub_or_path); 'why' says what reads the value. The number's type of a
# role setting is its argument spec's (int or float: types live only in roles/*/meta/argument_specs.yml);
# a vLLM flag's type is vLLM's own (type: int | number | human_int | choices).

# vLLM flags in vllm_extra_args / an instance's extra_args whose values vLLM refuses at start (argparse types
# and config validation). Sources: vllm/engine/arg_utils.py (EngineArgs.add_cli_args), vllm/config/cache.py
# (gpu_memory_utilization in (0, 1]; BlockSize; CacheDType; swap_space >= 0), vllm/config/model.py (ModelDType;
# max_model_len through human_readable_int), vllm/config/scheduler.py (max_num_seqs, max_num_batched_tokens),
# vllm/config/parallel.py (sizes >= 1).
VLLM_FLAG_RULES = {
    '--gpu-memory-utilization': {'type': 'number', 'min': 0, 'min_open': True, 'max': 1},
    '--block-size': {'type': 'choices', 'choices': ['1', '8', '16', '32', '64', '128', '256']},
    '--kv-cache-dtype': {'type': 'choices',
                         'choices': ['auto', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla']},
    '--dtype': {'type': 'choices', 'choices': ['auto', 'half', 'float16', 'bfloat16', 'float', 'float32']},
    '--max-model-len': {'type': 'human_int', 'min': 1},
    '--max-num-batched-tokens': {'type': 'human_int', 'min': 1},
    '--max-num-seqs': {'type': 'int', 'min': 1},
    '--swap-space': {'type': 'number', 'min': 0},
    '--pipeline-parallel-size': {'type': 'int', 'min': 1},
    '--data-parallel-size': {'type': 'int', 'min': 1},
    '--seed': {'type': 'int'},
}

# Role settings the services read, by the role whose hosts run them.
VAR_RULES = {
    'vllm': {
        # vllm role: --max-model-len when > 0 (0 keeps the model's own)
        'vllm_max_model_len': {'min': 0, 'why': '--max-model-len, 0 = the model\'s own'},
        # vLLM's MooncakeConnector (vllm/envs.py: VLLM_MOONCAKE_*_TIMEOUT, seconds; 0 aborts every transfer)
        'vllm_mooncake_connector_timeout': {'min': 1, 'why': 'VLLM_MOONCAKE_CONNECTOR_TIMEOUT, seconds'},
        'vllm_mooncake_abort_request_timeout': {'min': 1,
                                                'why': 'VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, seconds'},
        # MooncakeConnector kv_connector_extra_config.num_workers: a thread pool size
        'vllm_mooncake_num_workers': {'min': 1, 'why': 'the connector\'s sender threads'},
        'vllm_store_lookup_wait_ms': {'min': 0, 'why': 'milliseconds, 0 turns the wait off'},
        # vllm/envs.py: VLLM_CPU_KVCACHE_SPACE, GiB (0 = vLLM's default)
        'vllm_cpu_kvcache_space_gib': {'min': 0, 'why': 'VLLM_CPU_KVCACHE_SPACE, GiB'},
        # the model: an absolute path on the host, or a hub repo id (huggingface_hub validate_repo_id:
        # [namespace/]name of letters, digits, -, _ and ., at most 96 characters)
        'vllm_model': {'kind': 'hub_or_path', 'why': 'an absolute path or a hub id (org/name)'},
        # vllm role: pip installs these into the venv (packaging.requirements, PEP 508)
        'vllm_pip_extra_packages': {'kind': 'requirements', 'why': 'pip requirements (PEP 508)'},
    },
    'etcd': {
        # etcd server/etcdmain/config.go: both in ms; election-timeout at most 50000 (maxElectionMs)
        'etcd_heartbeat_interval': {'min': 1, 'why': 'ETCD_HEARTBEAT_INTERVAL, ms'},
        'etcd_election_timeout': {'min': 1, 'max': 50000, 'why': 'ETCD_ELECTION_TIMEOUT, ms'},
        'etcd_quota_backend_bytes': {'min': 0, 'why': 'ETCD_QUOTA_BACKEND_BYTES, 0 = etcd\'s default'},
        'etcd_data_dir': {'kind': 'abs_path', 'why': 'ETCD_DATA_DIR and the unit\'s ReadWritePaths='},
    },
    'master': {
        # mooncake_master gflags: a ratio of the segment capacity, a lease in ms, the watchdog's seconds
        'mooncake_master_eviction_high_watermark_ratio': {'min': 0, 'min_open': True, 'max': 1,
                                                          'why': '--eviction_high_watermark_ratio, a fraction'},
        'mooncake_master_default_kv_lease_ttl': {'min': 1, 'why': '--default_kv_lease_ttl, ms'},
        'mooncake_master_watchdog_stuck_seconds': {'min': 1, 'why': 'the watchdog\'s --stuck-seconds'},
    },
    'router': {
        # vllm-router's CLI (clap, unsigned integers; an interval of 0 spins)
        'vllm_router_health_check_interval_secs': {'min': 1, 'why': '--health-check-interval-secs'},
        'vllm_router_health_failure_threshold': {'min': 1, 'why': '--health-failure-threshold'},
        'vllm_router_health_success_threshold': {'min': 1, 'why': '--health-success-threshold'},
        'vllm_router_request_timeout_secs': {'min': 0, 'why': '--request-timeout-secs, 0 = router default'},
        'vllm_router_max_concurrent_requests': {'min': 0,
                                                'why': '--max-concurrent-requests, 0 = router default'},
    },
    'all': {
        # pip: --find-links takes a URL or a local directory (a relative one would be read relative to the task's
        # working directory); --index-url a PEP 503 index URL (pip/_internal/cli/cmdoptions.py)
        'common_pip_find_links': {'kind': 'location', 'why': 'pip --find-links: an http(s)/file URL or an absolute path'},
        'common_pip_index_url': {'kind': 'url', 'why': 'pip --index-url: an http(s) URL'},
    },
}
# etcd server/etcdmain/config.go: "--election-timeout should be at least as 5 times as --heartbeat-interval".
ETCD_ELECTION_PER_HEARTBEAT = 5

# Values that reach a unit file: what systemd does with them (systemd.exec(5), systemd.service(5); checked
# against systemd-analyze verify itself by tests/unit/test_preflight_classes.py, where every refused value
# makes systemd log "ignoring" or refuse the unit).
SYSTEMD_RULES = {
    # mooncake-master.service: RestartSec={{ mooncake_master_restart_sec }}s, a number of seconds
    'mooncake_master_restart_sec': {'role': 'master', 'min': 0, 'unit_line': 'RestartSec=%ss',
                                    'why': 'RestartSec= (the unit appends s)'},
    # vllm@.service: StateDirectory= takes a path below /var/lib ("path is absolute, ignoring") and
    # WorkingDirectory= an absolute one
    'vllm_state_dir': {'role': 'vllm', 'kind': 'under', 'prefix': '/var/lib/', 'unit_line': 'StateDirectory=%s',
                       'why': 'StateDirectory= (a directory below /var/lib) and WorkingDirectory='},
}

_HUB_ID = re.compile(r'^(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*$')


def _number(value):
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and re.match(r'^-?[0-9]+$', value.strip()) else None


_SPEC_TYPES = {'int': 'int', 'float': 'number'}


def refusal(rule, value, spec_type=None):
    """Why rule refuses value (a phrase), None when it passes. spec_type: the setting's argument spec type."""
    kind = rule.get('kind') or rule.get('type') or _SPEC_TYPES.get(spec_type)
    if kind == 'choices':
        return None if str(value) in rule['choices'] else 'is not one of %s' % ', '.join(rule['choices'])
    if kind in ('int', 'number', 'human_int'):
        n = {'int': _int, 'number': _number, 'human_int': lambda v: human_int(v) if not isinstance(v, bool) else None}[
            kind](value)
        if n is None:
            if not (rule.get('kind') or rule.get('type')):
                return None  # a role setting of another type: its argument spec refuses it (types live there only)
            return 'is not %s' % {'int': 'an integer', 'number': 'a number', 'human_int': 'an integer (or 32k, 32K)'}[kind]
        lo, hi = rule.get('min'), rule.get('max')
        if lo is not None and (n < lo or (rule.get('min_open') and n == lo)):
            return 'must be %s %s' % ('above' if rule.get('min_open') else 'at least', lo)
        if hi is not None and n > hi:
            return 'must be at most %s' % hi
        return None
    text = value if isinstance(value, str) else None
    if text is None:
        if kind == 'requirements':  # a list (another type: its spec, a list of strings, refuses it)
            return None if not isinstance(value, (list, tuple)) or all(refusal(rule, v) is None for v in value) \
                else 'is not a list of pip requirements'
        return 'is not a string'
    if kind == 'abs_path':
        return None if text.startswith('/') and '//' not in text else 'is not an absolute path'
    if kind == 'under':
        rest = text[len(rule['prefix']):] if text.startswith(rule['prefix']) else ''
        return None if rest.strip('/') and '..' not in rest.split('/') else 'is not a directory below %s' % rule['prefix']
    if kind == 'url':
        return None if text == '' or re.match(r'^https?://[^/\s]+(/\S*)?$', text) else 'is not an http(s) URL'
    if kind == 'location':
        return None if text == '' or text.startswith('/') or re.match(r'^(https?|file)://\S+$', text) \
            else 'is neither an http(s)/file URL nor an absolute path'
    if kind == 'hub_or_path':
        return None if text.startswith('/') or (_HUB_ID.match(text) and len(text) <= 96) \
            else 'is neither an absolute path nor a hub id (org/name)'
    if kind == 'requirements':
        try:
            from packaging.requirements import Requirement
            Requirement(text)
            return None
        except Exception:  # packaging's InvalidRequirement
            return 'is not a pip requirement (PEP 508), e.g. "name==1.2.3"'
    return None


# --- what the hardened units hide or make read-only ---------------------------------------------------------
# The sandbox directives every unit takes from templates/common/hardening.j2 (read from that file by
# sandbox_directives, plugins/plugin_utils/preflight/sandbox.py) and what systemd does to paths under each
# (systemd.exec(5)):
# hidden: not there at all for the service; private: a fresh, empty directory per service (gone at stop);
# read_only: mounted read-only, except the unit's own writable paths (StateDirectory=, ReadWritePaths=,
# RuntimeDirectory=) and the API file systems.
SANDBOX_EFFECTS = {
    ('ProtectHome', 'yes'): {'hidden': ['/home', '/root', '/run/user']},
    ('ProtectHome', 'tmpfs'): {'hidden': ['/home', '/root', '/run/user']},
    ('ProtectHome', 'read-only'): {'read_only': ['/home', '/root', '/run/user']},
    ('PrivateTmp', 'yes'): {'private': ['/tmp', '/var/tmp']},
    ('ProtectSystem', 'strict'): {'read_only': ['/']},
    ('ProtectSystem', 'full'): {'read_only': ['/usr', '/boot', '/efi', '/etc']},
    ('ProtectSystem', 'yes'): {'read_only': ['/usr', '/boot', '/efi']},
}
SANDBOX_API_FS = ['/dev', '/proc', '/sys']

# Per unit: its template, the role whose hosts run it, its writable paths (settings, or fixed paths) as the
# template writes them (tests/unit/test_preflight_classes.py ties each to its template line), and the
# settings it reads (read: must not be hidden or private) or writes (write: also not read-only). write_if_hub:
# written only when vllm_model is a hub id (the download goes to HF_HOME; a local model is served offline).
UNIT_PATHS = {
    'vllm@.service': {
        'template': 'vllm/vllm@.service.j2', 'role': 'vllm',
        'writable': {'vllm_state_dir': 'StateDirectory={{ vllm_state_dir'},
        'read': ['vllm_model', 'vllm_hf_home'], 'write': ['vllm_state_dir'], 'write_if_hub': ['vllm_hf_home'],
    },
    'etcd.service': {
        'template': 'etcd/etcd.service.j2', 'role': 'etcd',
        'writable': {'etcd_data_dir': 'ReadWritePaths=-{{ etcd_data_dir }}', '/var/lib/etcd': 'StateDirectory=etcd'},
        'read': [], 'write': ['etcd_data_dir'], 'write_if_hub': [],
    },
}


def under(path, prefix):
    """Whether the absolute path is prefix or below it."""
    path, prefix = path.rstrip('/') or '/', prefix.rstrip('/') or '/'
    return prefix == '/' or path == prefix or path.startswith(prefix + '/')


class FilterModule(object):
    """Data only (Ansible loads every file of the filter directory as a filter plugin)."""

    def filters(self):
        return {}
