#!/usr/bin/env python3
"""Start smg (the router, vllm_router_implementation: smg) with the workers' key kept off every command line.

smg 1.13.0 takes the key it sends to the workers (and demands of its own clients and worker API) only as the flag
`--api-key`, which /proc/<pid>/cmdline and `ps` would show to every user of the host. This launcher reads the key from
its environment (VLLM_ROUTER_API_KEY, from the router's 0600 env file, as for vllm-router), removes it from the
environment, and hands it to smg's own argument parser in process: `smg.launch_router.parse_router_args` and
`launch_router`, the functions `python -m smg.launch_router` runs (public: no underscore, in the module's usage text).

    vllm-router.service: ExecStart=<venv>/bin/python <this file> $VLLM_ROUTER_ARGS

The arguments are smg's own (plugins/filter/smg.py builds them); `--api-key` among them is refused. Tested with smg
1.13.0; on another version it still runs and says so once on stderr. The upstream change that would retire this file:
smg reading its key from a file or the environment (as vllm-router reads OPENAI_API_KEY).
"""
import os
import sys

TESTED = ('1.13.0',)
KEY_ENV = ('VLLM_ROUTER_API_KEY', 'OPENAI_API_KEY')


def router_argv(argv, environ):
    """smg's argv: argv plus --api-key from environ (VLLM_ROUTER_API_KEY), and environ without the key variables.
    Refuses (SystemExit) an argv that already carries a key: it would be on the command line."""
    if any(a == '--api-key' or a.startswith('--api-key=') for a in argv):
        raise SystemExit('pd_bundle_smg_launch: --api-key is on the command line; the key belongs in the router\'s '
                         'env file (vllm_router_api_key), which this launcher reads')
    key = ''
    for name in KEY_ENV:
        value = environ.pop(name, '')
        key = key or value
    return list(argv) + (['--api-key', key] if key else []), environ


def _version():
    try:
        from importlib import metadata
        return metadata.version('smg')
    except Exception:  # noqa: BLE001 - a missing distribution is reported by the import below
        return None


def main(argv=None):
    args, _ = router_argv(sys.argv[1:] if argv is None else argv, os.environ)
    version = _version()
    if version not in TESTED:
        sys.stderr.write('pd-bundle: smg %s is not a version this launcher was tested with (%s); starting it through '
                         'smg.launch_router all the same\n' % (version, ', '.join(TESTED)))
    try:
        from smg.launch_router import launch_router, parse_router_args
    except ImportError as e:
        raise SystemExit('pd_bundle_smg_launch: smg.launch_router.parse_router_args/launch_router not importable '
                         '(%s): smg %s changed its launcher; pin a tested version (%s)' % (e, version, ', '.join(TESTED)))
    launch_router(parse_router_args(args))


if __name__ == '__main__':
    main()
