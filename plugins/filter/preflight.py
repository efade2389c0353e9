"""Filters for the preflight role: the parts of inventory validation that Jinja does badly.

Pure functions (no Ansible state), unit-tested in tests/unit/test_preflight_filter.py.

- preflight_effective:        a host's effective settings = every role's literal defaults, overridden by the inventory
- preflight_effective_all:    the same for each of a list of hosts ({host: settings}), in one task
- preflight_port_conflicts:   per-host table of fixed ports -> messages for collisions and ports inside the engine range
- preflight_endpoint_conflicts: fleet-wide (ip, port) duplicates of vLLM instances
- preflight_router_override_errors: vllm_router_prefill_urls / _decode_urls entries that match no known instance
- preflight_duplicates:       values that occur more than once in a list
- preflight_is_ip:            IPv4/IPv6 literal
- preflight_is_cidr:          IPv4/IPv6 address or network without host bits (10.0.0.0/8, 10.0.0.5, fd00::/64)
- preflight_is_port:          an int (or a string of digits) in 1..65535
- preflight_is_intlike:       an int (or a string of digits), never a bool
- preflight_is_boollike:      a real bool, or a string/int that Ansible's bool filter maps unambiguously
- preflight_bad_tokens:       items of an argument list that are not one systemd token (non-strings, whitespace, empty)
- preflight_role_files:       the roles' defaults files and argument spec files under a roles directory (controller side)
- preflight_example_secrets:  vault data in the inventory that the repo's own TEST-ONLY / LAB-ONLY passwords decrypt
- preflight_load_roles:       those files read: every role's defaults merged, and each role's main argument spec
                              ({role, file, groups, options}) for the checks (plugins/plugin_utils/preflight/)
- preflight_spec_failures:    a failed validate_argument_spec loop as one message per refused variable (its host, value,
                              the declared type/choices and the fix)
- preflight_spec_errors:      every host's inventory values against the specs of the roles it runs (what
                              validate_argument_spec checks, by the same validator), as spec_failures' messages
"""
import copy
import glob
import ipaddress
import json
import os
import re

import yaml

try:
    from ansible.errors import AnsibleFilterError
    from ansible.utils.unsafe_proxy import wrap_var
except ImportError:  # unit tests run without ansible
    class AnsibleFilterError(Exception):
        pass

    def wrap_var(value):
        return value

_TEMPLATE_MARKERS = ('{{', '{%')
_BOOL_STRINGS = {'true', 'false', 'yes', 'no', 'on', 'off', '1', '0'}
_DIGITS = re.compile(r'^[0-9]+$')


def _is_template(value):
    return isinstance(value, str) and any(m in value for m in _TEMPLATE_MARKERS)


def effective(host_vars, defaults):
    """Effective value of every variable the roles default, for one host.

    host_vars: the host's hostvars (inventory, group_vars, host_vars, extra vars; no role defaults).
    defaults:  the roles' defaults/main.yml merged, read as plain YAML.

    A value the inventory sets wins. A default that is itself a template (e.g.
    "{{ ansible_host | default(inventory_hostname) }}") is left out: it depends on the
    run and the checks fall back on their own defaults for it. An inventory value that
    cannot be templated here (it refers to a role default, say) is left out too.
    """
    out = {}
    for key, val in dict(defaults or {}).items():
        if not _is_template(val):
            out[key] = val
    for key in list(dict(defaults or {}).keys()):
        try:
            present = key in host_vars
        except Exception:  # pragma: no cover - defensive, HostVarsVars is a Mapping
            present = False
        if not present:
            continue
        try:
            out[key] = host_vars[key]
        except Exception:  # undefined reference inside an inventory template
            out.pop(key, None)
    return out


def effective_all(hostvars, hosts, defaults):
    """{host: effective(hostvars[host], defaults)} for hosts (the play's): the preflight play loads every host's
    settings in one run-once task instead of one worker per host."""
    return {h: effective(hostvars[h], defaults) for h in hosts or []}


def is_intlike(value):
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and bool(_DIGITS.match(value))


def is_port(value):
    return is_intlike(value) and 1 <= int(value) <= 65535


def is_boollike(value):
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return value in (0, 1)
    return isinstance(value, str) and value.strip().lower() in _BOOL_STRINGS


def is_ip(value):
    if not isinstance(value, str):
        return False
    try:
        ipaddress.ip_address(value.strip('[]'))
        return True
    except ValueError:
        return False


def is_cidr(value):
    if not isinstance(value, str) or not value.strip():
        return False
    try:
        ipaddress.ip_network(value.strip(), strict=True)
        return True
    except ValueError:
        return False


def bad_tokens(values):
    """Items of an argument list that systemd would not pass as exactly one argument."""
    if not isinstance(values, (list, tuple)):
        return [values]
    return [v for v in values
            if isinstance(v, bool) or not isinstance(v, (str, int, float)) or str(v) == ''
            or any(c.isspace() for c in str(v))]


def duplicates(values):
    seen, dups = set(), []
    for v in values or []:
        key = str(v)
        if key in seen and key not in [str(d) for d in dups]:
            dups.append(v)
        seen.add(key)
    return dups


def port_conflicts(entries, range_min=None, range_max=None, range_label='mooncake_rpc_port_min..mooncake_rpc_port_max'):
    """Collisions in one host's table of fixed ports.

    entries: list of [port, label] (label names the variable, e.g. "vllm_instances[prefill0].port").
    range_min/range_max: the transfer engine's RPC range on this host (None when no engine runs here);
    no fixed port may lie inside it, the engine takes random ports from it.
    Returns one message per problem; entries whose port is not an integer are ignored (checked elsewhere).
    """
    by_port = {}
    for entry in entries or []:
        port, label = entry[0], entry[1]
        if not is_intlike(port):
            continue
        by_port.setdefault(int(port), []).append(str(label))
    msgs = []
    for port in sorted(by_port):
        labels = by_port[port]
        if len(labels) > 1:
            msgs.append('port %d is used by %s' % (port, ' and '.join(labels)))
    if is_intlike(range_min) and is_intlike(range_max):
        lo, hi = int(range_min), int(range_max)
        for port in sorted(by_port):
            if lo <= port <= hi:
                msgs.append('port %d (%s) is inside the transfer engine range %s (%d-%d), where the engine binds random ports'
                            % (port, ' and '.join(by_port[port]), range_label, lo, hi))
    return msgs


def endpoint_conflicts(endpoints):
    """Fleet-wide duplicates of (ip, port).

    endpoints: list of dicts {host, label, ip, port}. Returns one message per duplicated address.
    """
    seen = {}
    for ep in endpoints or []:
        if not is_intlike(ep.get('port')):
            continue
        key = (str(ep.get('ip')), int(ep.get('port')))
        seen.setdefault(key, []).append('%s on %s' % (ep.get('label'), ep.get('host')))
    return ['%s:%d is claimed by %s' % (ip, port, ' and '.join(who))
            for (ip, port), who in sorted(seen.items()) if len(who) > 1]


def router_override_errors(prefill_urls, decode_urls, prefills, decodes):
    """Entries of the router's override lists that match no vLLM instance of the inventory.

    prefill_urls: vllm_router_prefill_urls ([{url, bootstrap_port}]); decode_urls: vllm_router_decode_urls ([url]).
    prefills: [{url, bootstrap_port, where}] of every prefill instance; decodes: [{url, where}].
    The types (a list of {url, bootstrap_port} dicts, a list of strings) are the vllm_router role's argument spec's;
    what has another type is skipped here. A string of decode URLs is refused: the spec's list type splits it on
    commas, but the role reads the value as written.
    """
    errs = []
    known_p = {str(p['url']).rstrip('/'): p for p in prefills or []}
    known_d = {str(d['url']).rstrip('/'): d for d in decodes or []}
    if isinstance(decode_urls, str):
        errs.append('vllm_router_decode_urls must be a YAML list of URLs, not the string %r' % (decode_urls,))
    prefill_urls = prefill_urls if isinstance(prefill_urls, list) else []
    decode_urls = decode_urls if isinstance(decode_urls, list) else []
    for i, entry in enumerate(prefill_urls):
        if not isinstance(entry, dict) or 'url' not in entry:
            continue  # the spec's (a dict with url and bootstrap_port)
        url = str(entry['url']).rstrip('/')
        if url not in known_p:
            errs.append('vllm_router_prefill_urls[%d].url=%s is not a prefill instance of the inventory (known: %s)'
                        % (i, url, ', '.join(sorted(known_p)) or 'none'))
            continue
        bp = entry.get('bootstrap_port')
        if not is_intlike(bp):
            continue  # the spec's (an integer)
        if not is_port(bp):
            errs.append('vllm_router_prefill_urls[%d].bootstrap_port=%r is not a port (1-65535)' % (i, bp))
        elif int(bp) != int(known_p[url]['bootstrap_port']):
            errs.append('vllm_router_prefill_urls[%d].bootstrap_port=%s but %s uses bootstrap port %s'
                        % (i, bp, known_p[url]['where'], known_p[url]['bootstrap_port']))
    for i, url in enumerate(decode_urls):
        if str(url).rstrip('/') not in known_d:
            errs.append('vllm_router_decode_urls[%d]=%s is not a decode instance of the inventory (known: %s)'
                        % (i, url, ', '.join(sorted(known_d)) or 'none'))
    return errs


def role_files(roles_dir):
    """Files preflight reads from every role under roles_dir (sorted, so the result is stable).

    Returns {'defaults': [paths of defaults/main.yml|yaml and defaults/main/*.yml|yaml],
             'specs': [{'role': name, 'path': meta/argument_specs.yml|yaml}]}.
    """
    defaults, specs = [], []
    for role in sorted(os.listdir(roles_dir)) if os.path.isdir(roles_dir) else []:
        base = os.path.join(roles_dir, role)
        if not os.path.isdir(base):
            continue
        for name in ('main.yml', 'main.yaml'):
            path = os.path.join(base, 'defaults', name)
            if os.path.isfile(path):
                defaults.append(path)
        defaults.extend(sorted(glob.glob(os.path.join(base, 'defaults', 'main', '*.yml'))
                               + glob.glob(os.path.join(base, 'defaults', 'main', '*.yaml'))))
        for name in ('argument_specs.yml', 'argument_specs.yaml'):
            path = os.path.join(base, 'meta', name)
            if os.path.isfile(path):
                specs.append({'role': role, 'path': path})
                break
    # Data, never templates: a default such as "{{ common_host_ip }}" stays text. ansible-core 2.19 trusts no string a
    # filter returns; 2.18 templates a variable's strings each time the variable is read, and would resolve (or fail
    # on) the roles' own defaults here. wrap_var (public, ansible.utils.unsafe_proxy) marks them as data on both.
    return wrap_var({'defaults': defaults, 'specs': specs})


class _Loader(yaml.SafeLoader):
    """Plain YAML; Ansible's own tags (!unsafe, !vault) keep their scalar text."""


_Loader.add_multi_constructor('!', lambda loader, suffix, node: loader.construct_scalar(node)
                              if isinstance(node, yaml.ScalarNode) else None)


def _read_yaml(path):
    with open(path) as fh:
        return yaml.load(fh, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def load_roles(roles_dir, role_groups=None):
    """Every role's defaults (merged, in role order) and main argument spec, read as plain YAML.

    Returns {'defaults': {...}, 'specs': [{'role', 'file' (relative to the roles directory's parent),
    'groups' (role_groups[role], else ['all']), 'options' (the entry point main's options)}]}.
    """
    files = role_files(roles_dir)
    defaults = {}
    for path in files['defaults']:
        defaults.update(_read_yaml(path) or {})
    specs = []
    for entry in files['specs']:
        doc = _read_yaml(entry['path']) or {}
        main = (doc.get('argument_specs') or {}).get('main') or {}
        specs.append({'role': entry['role'],
                      'file': os.path.join(os.path.basename(os.path.normpath(roles_dir)), entry['role'], 'meta',
                                           os.path.basename(entry['path'])),
                      'groups': list((role_groups or {}).get(entry['role']) or ['all']),
                      'options': main.get('options') or {}})
    # Data, never templates: a default such as "{{ common_host_ip }}" stays text. ansible-core 2.19 trusts no string a
    # filter returns; 2.18 templates a variable's strings each time the variable is read, and would resolve (or fail
    # on) the roles' own defaults here. wrap_var (public, ansible.utils.unsafe_proxy) marks them as data on both.
    return wrap_var({'defaults': defaults, 'specs': specs})


# How a spec failure names the declared type and its fix (types themselves live only in the specs).
_TYPE_WORDS = {'int': 'an integer', 'float': 'a number', 'bool': 'a boolean', 'str': 'a string', 'path': 'a path',
               'list': 'a list', 'dict': 'a dict (mapping)'}
_PLURALS = {'int': 'integers', 'float': 'numbers', 'bool': 'booleans', 'str': 'strings', 'path': 'paths',
            'dict': 'dicts'}
_TYPE_FIXES = {'bool': 'true or false (unquoted)', 'dict': 'a YAML mapping (name: value)',
               'list': 'a YAML list (one item per entry, e.g. [a, b])'}


def _spec_errors(opt, value):
    """The errors of Ansible's own argument spec validator (what validate_argument_spec runs) for value."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    return ArgumentSpecValidator({'value': copy.deepcopy(dict(opt))}).validate({'value': value}).error_messages


def _declared(opt):
    parts = ['type: %s' % opt.get('type', 'str')]
    parts += ['elements: %s' % opt['elements']] if opt.get('elements') else []
    parts += ['choices: [%s]' % ', '.join(str(c) for c in opt['choices'])] if 'choices' in opt else []
    return ', '.join(parts)


def _type_fix(opt):
    kind = opt.get('type', 'str')
    if kind == 'list' and opt.get('elements'):
        return 'a YAML list of %s (one item per entry)' % _PLURALS.get(opt['elements'], opt['elements'])
    fix = _TYPE_FIXES.get(kind, _TYPE_WORDS.get(kind, kind))
    default = opt.get('default')
    if kind in ('int', 'float', 'str') and default is not None and not _is_template(default):
        fix += ', e.g. %s' % json.dumps(default)
    return fix


def _option_failures(label, opt, value, host, where):
    """Friendly messages for value of one spec option that the spec refuses: the variable (an instance's key as
    var[name].key), the host, what the spec declares and the fix; [] when the spec takes the value."""
    if not _spec_errors(opt, value):
        return []
    shown = '(value not shown)' if opt.get('no_log') else json.dumps(value, default=str)
    subs, kind = opt.get('options'), opt.get('type')
    items = value if kind == 'list' else [value] if kind == 'dict' else None
    if subs and isinstance(items, list) and items and all(isinstance(i, dict) for i in items):
        out = []
        for n, item in enumerate(items):
            at = '%s[%s]' % (label, item.get('name', n)) if kind == 'list' else label
            unknown = [str(k) for k in item if k not in subs]
            missing = [k for k, o in subs.items() if o.get('required') and item.get(k) is None]
            if unknown:
                out.append('%s on %s has unknown key(s) %s (%s declares the keys %s). Fix: correct the key\'s name, '
                           'or remove it.' % (at, host, ', '.join(unknown), where, ', '.join(subs)))
            if missing:
                out.append('%s on %s lacks the required key(s) %s (%s). Fix: add %s to it.'
                           % (at, host, ', '.join(missing), where, ', '.join(missing)))
            out += [m for k, o in subs.items() if k in item
                    for m in _option_failures('%s.%s' % (at, k), o, item[k], host, where)]
        if out:
            return out
    if 'choices' in opt and not _spec_errors({k: v for k, v in opt.items() if k != 'choices'}, value):
        choices = ', '.join(str(c) for c in opt['choices'])
        desc = opt.get('description') or ''
        desc = ' '.join(str(d) for d in desc) if isinstance(desc, list) else str(desc)
        return ['%s=%s on %s is not one of: %s (%s declares %s). Fix: set %s to one of: %s.%s'
                % (label, shown, host, choices, where, _declared(opt), label, choices, ' ' + desc if desc else '')]
    what = _TYPE_WORDS.get(kind or 'str', kind)
    if kind == 'list' and opt.get('elements'):
        what = 'a list of %s' % _PLURALS.get(opt['elements'], opt['elements'])
    return ['%s=%s on %s is not %s (%s declares %s). Fix: set %s to %s.'
            % (label, shown, host, what, where, _declared(opt), label, _type_fix(opt))]


def spec_failures(failed_result, host=None, host_vars=None):
    """Messages for the failed items (or items with argument_errors) of a validate_argument_spec loop over
    load_roles' specs.

    With the host and its variables (hostvars[inventory_hostname]) each refused variable is named with its
    value, the host, what the spec declares (type, elements, choices, an instance's keys) and the fix, from the
    spec itself and Ansible's own validator; otherwise (or for what that cannot place) 'role R (FILE): errors.'.
    """
    failed_result = failed_result or {}
    results = failed_result.get('results') if 'results' in failed_result else [failed_result]
    out = []
    for res in results or []:
        if not (res.get('failed') or res.get('argument_errors')):  # failed_when: false keeps the errors
            continue
        item = res.get('item') or {}
        where = item.get('file', '?')
        named = []
        for var, opt in (item.get('options') or {}).items() if host_vars is not None else []:
            try:
                if not isinstance(opt, dict) or var not in host_vars:
                    continue
                named += _option_failures(var, opt, host_vars[var], host or '?', where)
            except Exception:  # noqa: BLE001 - no validator, or a value that cannot be templated: the raw errors
                continue
        errors = res.get('argument_errors') or [res.get('msg', '')]
        out += named or ['role %s (%s)%s: %s. Fix: give each named variable what the spec declares (docs/variables.md '
                         'lists every variable).' % (item.get('role', '?'), where, ' on %s' % host if host else '',
                                                           '; '.join(str(e) for e in errors))]
    return out


def _plain(value):
    """value with every mapping a dict and every list a list (no lazy container of the templating engine left)."""
    if isinstance(value, dict) or hasattr(value, 'items'):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _runs(spec, group_names):
    groups = list(spec.get('groups') or [])
    return 'all' in groups or any(g in group_names for g in groups)


def spec_errors(hostvars, hosts, specs, own='preflight'):
    """Every host's inventory values checked against the main argument spec of each role it runs (a spec's groups;
    'all': every host), except the preflight role's own (checked as the role starts): the values the spec names that
    the host sets, by ansible-core's ArgumentSpecValidator (the public class validate_argument_spec runs). One
    message per refused variable (spec_failures). One run-once task, where a validate_argument_spec loop cost one
    worker per host and role."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    # Plain copies, once: a fact's containers are lazy templates under ansible-core 2.19, and deep-copying one per
    # host and role cost minutes (the messages copy a refused option's spec too: spec_failures gets the plain one).
    specs = [dict(role=spec.get('role'), file=spec.get('file'), groups=_plain(spec.get('groups') or []),
                  options=_plain(spec.get('options') or {})) for spec in specs or [] if spec.get('role') != own]
    out = []
    for host in hosts or []:
        hv = hostvars[host]
        group_names = list(hv.get('group_names') or [])
        for spec in specs:
            if not _runs(spec, group_names):
                continue
            options, values, errors = spec['options'], {}, []
            for k in options:
                if k not in hv:
                    continue
                try:
                    values[k] = _plain(hv[k])
                except Exception as exc:  # noqa: BLE001 - a template of the inventory that cannot be resolved
                    errors.append('%s cannot be templated (%s)' % (k, exc))
            if errors:  # validate_argument_spec failed on the same templating: the role's errors, raw
                out += spec_failures({'failed': True, 'argument_errors': errors, 'item': spec}, host, None)
                continue
            errors = ArgumentSpecValidator(copy.deepcopy(options)).validate(values).error_messages
            if errors:
                out += spec_failures({'failed': True, 'argument_errors': errors, 'item': spec}, host, hv)
    return out


_REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
# The passwords this repository ships (its example secrets are public): never good for a real cluster.
EXAMPLE_VAULT_PASSWORDS = ('tests/fixtures/vault-pass-TEST-ONLY', 'molecule/*/vault-pass-LAB-ONLY')
_VAULT_BLOCK = re.compile(r'^(?P<indent>[ \t]*)(?:- )?(?P<key>[A-Za-z_][A-Za-z0-9_]*):[ \t]*!vault[ \t]*\|[^\n]*\n'
                          r'(?P<body>(?:(?P=indent)[ \t]+\S[^\n]*\n?)+)', re.M)


def _vault_items(path):
    """(label, ciphertext) for a whole-file vault and for each inline !vault value of a YAML file."""
    try:
        with open(path) as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError):
        return []
    if text.lstrip().startswith('$ANSIBLE_VAULT;'):
        return [(None, text.strip())]
    return [(m.group('key'), '\n'.join(line.strip() for line in m.group('body').splitlines()))
            for m in _VAULT_BLOCK.finditer(text)]


def _inventory_files(sources):
    for src in sources or []:
        src = str(src)
        if os.path.isfile(src):
            yield src
        for root, dirs, files in os.walk(src) if os.path.isdir(src) else []:
            dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
            for name in sorted(files):
                if not name.startswith('.'):
                    yield os.path.join(root, name)


def example_secrets(inventory_sources, password_files=None, repo=_REPO):
    """Messages for every vault value in the inventory sources that a password shipped in this repo decrypts."""
    try:
        from ansible.parsing.vault import VaultLib, VaultSecret
    except ImportError:  # pragma: no cover - ansible is there whenever this runs as a filter
        return []
    pw_files = password_files if password_files is not None else sorted(
        f for pattern in EXAMPLE_VAULT_PASSWORDS for f in glob.glob(os.path.join(repo, pattern)))
    libs = []
    for f in pw_files:
        with open(f, 'rb') as fh:
            libs.append((os.path.relpath(f, repo), VaultLib([('default', VaultSecret(fh.read().strip()))])))
    out = []
    for path in _inventory_files(inventory_sources):
        for key, blob in _vault_items(path):
            for name, lib in libs:
                try:
                    plain = lib.decrypt(blob.encode())
                except Exception:  # another password: what a real inventory has
                    continue
                if key is None:
                    try:
                        keys = sorted((yaml.safe_load(plain) or {}).keys())
                    except Exception:
                        keys = []
                    what = 'the variables %s in %s decrypt' % (', '.join(keys) or '(none)', path)
                else:
                    what = 'the variable %s in %s decrypts' % (key, path)
                out.append('%s with this repository\'s example vault password (%s): that secret is public. '
                           'Fix: make your own secret (e.g. openssl rand -hex 32) and encrypt it with your own vault password '
                           '(ansible-vault encrypt_string --vault-password-file YOUR_FILE); a lab may set '
                           'preflight_example_secrets_allowed: true.' % (what, name))
                break
    return out


class FilterModule(object):
    def filters(self):
        return {
            'preflight_effective': effective,
            'preflight_effective_all': effective_all,
            'preflight_spec_errors': spec_errors,
            'preflight_port_conflicts': port_conflicts,
            'preflight_endpoint_conflicts': endpoint_conflicts,
            'preflight_router_override_errors': router_override_errors,
            'preflight_duplicates': duplicates,
            'preflight_is_ip': is_ip,
            'preflight_is_cidr': is_cidr,
            'preflight_is_port': is_port,
            'preflight_is_intlike': is_intlike,
            'preflight_is_boollike': is_boollike,
            'preflight_bad_tokens': bad_tokens,
            'preflight_role_files': role_files,
            'preflight_load_roles': load_roles,
            'preflight_example_secrets': example_secrets,
            'preflight_spec_failures': spec_failures,
        }
