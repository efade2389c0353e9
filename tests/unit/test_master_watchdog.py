"""plugins/tools/mooncake_master_watchdog.py: when a stuck HA election gets its master restarted."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    'watchdog', Path(__file__).resolve().parents[2] / 'plugins' / 'tools' / 'mooncake_master_watchdog.py')
wd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wd)

ME = '10.0.0.12:50051'
STUCK = {'status': 'ok', 'role': 'standby', 'leader_address': ME}


def test_stuck_is_standby_named_leader():
    assert wd.stuck(STUCK, ME)
    assert not wd.stuck(dict(STUCK, role='leader'), ME)
    assert not wd.stuck(dict(STUCK, leader_address='10.0.0.11:50051'), ME)  # a healthy standby
    assert not wd.stuck(None, ME)  # down: systemd's business


def test_restart_after_stuck_seconds_then_grace():
    w = wd.Watch(ME, stuck_seconds=30, grace=60)
    assert [w.step(STUCK, t) for t in (0, 10, 29)] == [False, False, False]
    assert w.step(STUCK, 30) is True
    assert not any(w.step(STUCK, t) for t in (35, 60, 89))  # grace: the restart needs time
    assert [w.step(STUCK, t) for t in (90, 119, 120)] == [False, False, True]


def test_a_recovery_resets_the_clock():
    w = wd.Watch(ME, stuck_seconds=30, grace=60)
    w.step(STUCK, 0)
    w.step(dict(STUCK, role='leader'), 20)
    assert w.step(STUCK, 40) is False and w.step(STUCK, 69) is False and w.step(STUCK, 70) is True


def test_leader_gauge_for_the_textfile_collector(tmp_path):
    """1 only when /health says leader; 0 for standby and for no answer (down, or the watchdog stopping)."""
    path = tmp_path / 'pd_mooncake_master.prom'
    for health, want in ((dict(STUCK, role='leader'), 1), (STUCK, 0), (None, 0)):
        assert wd.write_leader(str(path), health) is bool(want)
        text = path.read_text()
        assert text.endswith('\npd_mooncake_master_leader %d\n' % want)
        assert '# TYPE pd_mooncake_master_leader gauge' in text
        assert oct(path.stat().st_mode & 0o777) == '0o644'  # the exporter runs as another user
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
