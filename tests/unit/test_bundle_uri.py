"""plugins/action/bundle_uri.py: the uri module without a remote temporary directory, on public interfaces only.

Run for real through ansible-playbook (local connection, pipelining as ansible.cfg sets it) against a local HTTP
server: bundle_uri gets the page without the temporary directory's mkdir; ansible.builtin.uri, run the same way,
makes one (so the check of the log can fail).
"""
import http.server
import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('bundle_uri_under_test', REPO / 'plugins' / 'action' / 'bundle_uri.py')
bu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bu)

# What ansible-core runs to make a remote temporary directory (ShellBase.mkdtemp), shown at -vvv.
MKDTEMP = 'mkdir -p "` echo'


def test_a_task_that_sends_a_file_is_refused_others_pass():
    assert not bu.sends_file({'url': 'http://10.0.0.5:8000/health', 'return_content': True})
    assert not bu.sends_file({'url': 'http://x/', 'src': '/etc/host-file', 'remote_src': True})
    assert not bu.sends_file({'url': 'http://x/', 'body_format': 'json', 'body': {'a': 1}})
    assert bu.sends_file({'url': 'http://x/', 'src': 'body.json'})
    assert bu.sends_file({'url': 'http://x/', 'src': 'body.json', 'remote_src': 'no'})
    assert bu.sends_file({'url': 'http://x/', 'body_format': 'form-multipart', 'body': {}})
    assert bu.ActionModule.TRANSFERS_FILES is False


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope='module')
def server():
    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Ok)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield 'http://127.0.0.1:%d/health' % srv.server_address[1]
    srv.shutdown()


def _run(tmp_path, action, url, extra=''):
    play = tmp_path / ('play-%s.yml' % action.replace('.', '-'))
    play.write_text(
        '- hosts: localhost\n  gather_facts: false\n  tasks:\n'
        '    - name: Get\n      %s:\n        url: %s\n        return_content: true\n%s'
        '      register: got\n    - name: Show\n      ansible.builtin.debug:\n        msg: "BODY={{ got.json.status }}"\n'
        % (action, url, extra))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0',
               ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0',
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, PD_BUNDLE_SPEEDUPS='off')
    return subprocess.run([str(Path(sys.executable).parent / 'ansible-playbook'), '-i', 'localhost,', '-c', 'local',
                           '-vvv', str(play)], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=180)


def test_bundle_uri_gets_the_page_without_a_remote_temporary_directory(tmp_path, server):
    res = _run(tmp_path, 'pd_bundle.serving.bundle_uri', server)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert 'BODY=ok' in res.stdout
    assert MKDTEMP not in res.stdout + res.stderr


def test_stock_uri_makes_one_so_the_check_can_fail(tmp_path, server):
    res = _run(tmp_path, 'ansible.builtin.uri', server)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert 'BODY=ok' in res.stdout
    assert MKDTEMP in res.stdout + res.stderr


def test_bundle_uri_refuses_a_file_to_send(tmp_path, server):
    res = _run(tmp_path, 'pd_bundle.serving.bundle_uri', server, '        src: body.json\n')
    assert res.returncode != 0
    assert 'Fix: use ansible.builtin.uri' in res.stdout
