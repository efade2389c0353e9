"""Every preflight check message is built by the one helper, preflight_checks.refuse, which enforces its shape:
the variable, the host and what to do ("Fix: ..."). The helper refuses a message without one of them; the checks
return nothing else (the source has no hand-formatted "Fix:" and every message of the bad-inventory fixtures of
tests/unit/test_preflight_checks.py and test_preflight_classes.py comes out of the helper)."""
import os
import re

import pytest

import test_preflight_classes as classes
from test_preflight_checks import FAILING, REPO, pc, run

CHECK_FILES = [os.path.join(REPO, 'plugins', 'filter', 'preflight_checks.py')]


def test_refuse_builds_the_shape():
    assert pc.refuse('vllm_model', 'gpu-p1', ': no model', 'set it.', value='') == \
        'vllm_model="" on gpu-p1: no model. Fix: set it.'
    assert pc.refuse('x', 'h', 'is bad', 'y.', shown=3) == 'x=3 on h is bad. Fix: y.'
    assert pc.refuse('x', 'h', 'is bad', 'y.', shown=None) == 'x=None on h is bad. Fix: y.'
    assert pc.refuse('x', 'h', 'is bad', 'y.') == 'x on h is bad. Fix: y.'
    assert pc.refuse('x', 'h', 'x differs on h and g', 'y.', whole=True) == 'x differs on h and g. Fix: y.'


@pytest.mark.parametrize('var, host, fix', [('', 'gpu-p1', 'set it.'), (None, 'gpu-p1', 'set it.'),
                                            ('vllm_model', '', 'set it.'), ('vllm_model', None, 'set it.'),
                                            ('vllm_model', 'gpu-p1', ''), ('vllm_model', 'gpu-p1', '  '),
                                            ('vllm_model', 'gpu-p1', None)])
def test_refuse_refuses_a_message_without_variable_host_or_fix(var, host, fix):
    with pytest.raises(ValueError):
        pc.refuse(var, host, 'is bad', fix, value=1)
    with pytest.raises(ValueError):
        pc.refuse(var, host, 'vllm_model on gpu-p1 is bad', fix, whole=True)


def test_refuse_refuses_a_sentence_that_does_not_name_its_variable_and_host():
    with pytest.raises(ValueError):
        pc.refuse('vllm_model', 'gpu-p1', 'something on gpu-p1 is bad', 'fix it.', whole=True)
    with pytest.raises(ValueError):
        pc.refuse('vllm_model', 'gpu-p1', 'vllm_model is bad somewhere', 'fix it.', whole=True)


def test_no_hand_formatted_fix_in_the_checks():
    """Only refuse writes "Fix:" (and the runner's message for a check that crashed, which names the check)."""
    for path in CHECK_FILES:
        src = open(path).read()
        body = re.sub(r'\ndef refuse\(.*?\n(?=\S)', '\n', src, flags=re.S)  # the helper itself
        body = re.sub(r'\ndef _run\(.*?\n(?=\S)', '\n', body, flags=re.S)  # the crash message
        assert 'Fix' not in body, '%s: a message formatted by hand (use refuse): %s' % (
            path, [line.strip() for line in body.splitlines() if 'Fix' in line])


@pytest.fixture
def built(monkeypatch):
    """The messages refuse built while the test ran."""
    made = []
    real = pc.refuse

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]
    monkeypatch.setattr(pc, 'refuse', recording)
    return made


def _assert_built(msgs, made):
    assert msgs
    for m in msgs:
        assert m in made, 'a message not built by refuse: %r' % m
        assert re.search(r'\. Fix: \S', m), m


@pytest.mark.parametrize('check_id', sorted(FAILING))
def test_every_failing_fixture_message_comes_from_refuse(check_id, built):
    host, inv, groups, _ = FAILING[check_id]
    msgs = run(check_id, inv, groups, host)
    _assert_built(msgs, built)
    assert host in ' '.join(msgs)


CLASS_CASES = [(skip, case) for skip, table in (('pd_consistency', classes.PD_REFUSED),
                                                ('managed', classes.MANAGED_REFUSED),
                                                ('values', classes.VALUES_REFUSED),
                                                ('sandbox', classes.SANDBOX_REFUSED),
                                                ('addresses', classes.ADDRESSES_REFUSED))
               for case in sorted(table)]


@pytest.mark.parametrize('skip, case', CLASS_CASES)
def test_every_class_fixture_message_comes_from_refuse(skip, case, built):
    table = {'pd_consistency': classes.PD_REFUSED, 'managed': classes.MANAGED_REFUSED, 'values': classes.VALUES_REFUSED,
             'sandbox': classes.SANDBOX_REFUSED, 'addresses': classes.ADDRESSES_REFUSED}[skip]
    changes, _ = table[case]
    _assert_built(classes.run_class(skip, classes.inv_with(changes)), built)


def test_a_hand_formatted_message_is_caught(built):
    """The fixture test above can fail: a check that formats its own message is reported."""
    fake = {'id': 'hand_made', 'skip': 'x', 'scope': 'host', 'phase': 'host', 'role': None,
            'fn': lambda cfg, host, groups, specs: ['x=1 on %s is bad. Fix: y.' % host]}
    msgs = pc._run([fake], ({}, 'h1', {}, []), 'h1')
    with pytest.raises(AssertionError):
        _assert_built(msgs, built)
