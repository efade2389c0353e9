"""scripts/ci_times.py: the few lines with every step's seconds that .ci/run prints at the end of a CI run."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location('ci_times', REPO / 'scripts' / 'ci_times.py')
ci_times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci_times)

RUN = """[test] core-range venvs: 20 s
[static] lint: 181 s, rc=0
[static] unit: 260 s, rc=1
[test] static: 1175 s
  \x1b[2mdependency          0 s
  converge          940 s
  proof             358 s  FAILED
  destroy        102 s
  peak memory used on this machine: 12292 MiB
[lab-test] scenario default: FAILED
  create            101 s
[test] rdma-test: 640 s; all: 4900 s
"""


def test_every_tier_part_and_step_in_a_few_lines():
    out = ci_times.summarize(RUN.splitlines(True), ['[lab-caches] RDMA VM image: 88 s\n'])
    assert out[0] == '=== CI times (s): core-range venvs 20; static 1175; rdma-test 640 (all 4900)'
    assert out[1] == '=== static parts: lint 181, unit 260 rc=1'
    assert out[2] == '=== lab caches: RDMA VM image 88'
    assert out[3] == ('=== default lab (FAILED): dependency 0, converge 940, proof 358 FAILED, destroy 102; '
                      'peak memory 12292 MiB')
    # A lab that ended before its last line: its steps so far are still shown.
    assert out[4] == '=== unfinished lab: create 101'


def test_a_run_that_printed_nothing_says_so():
    assert ci_times.summarize(['boom\n']) == ['=== CI times (s): no tier finished']
