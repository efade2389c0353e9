# Entry points. On a fresh Debian 12 machine (root):
#   make lab    - the main job: build what is missing, create the lab, converge, print the entry URL and a curl
#   make test   - the whole test suite (what CI runs through .ci/run)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export ANSIBLE_CONFIG := $(abspath ansible.cfg)
export PD_LAB_CACHE ?= $(HOME)/.cache/pd-lab

.PHONY: venv lab-caches lint unit render-test render-manifest preflight-test core-range-test static test lab lab-verify lab-destroy lab-status lab-bench lab-bench-reuse lab-drills lab-monitoring lab-reuse lab-store-tier lab-rolling lab-proof lab-scale lab-pools lab-partition lab-heal lab-gray lab-store-mode lab-router-move molecule-test rdma-test clean

$(VENV)/.done: requirements.txt
	scripts/install-deps.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

venv: $(VENV)/.done

# $(call timed,NAME,COMMAND): run COMMAND, print how long it took (the static tier's per-part times).
timed = @t=$$(date +%s); $(2); rc=$$?; echo "[static] $(1): $$(( $$(date +%s) - t )) s, rc=$$rc"; exit $$rc

# --offline: no requirements install or schema refresh over the network (the venv has every collection; the
# clone finds the bundle's own through collections/). Measured: 88 s against 111 s, 110 CPU-s against 142.
lint: venv
	$(call timed,lint,ansible-playbook --syntax-check -i inventory/prod site.yml >/dev/null && ansible-lint --offline --profile production)

# Every skip is printed with its reason (-rs). CI (CI=true) runs as root with this venv (requirements.txt pins the
# Mooncake wheel the netns test needs): there a skip that tests/conftest.py EXPECTED_SKIPS does not list fails the run.
PD_FAIL_ON_SKIP ?= $(filter true 1,$(CI))
UNIT_SKIP_GATE = $(if $(PD_FAIL_ON_SKIP),--fail-on-skip)
unit: venv
	$(call timed,unit,$(PY) -m pytest -q -rs $(UNIT_SKIP_GATE) tests/unit tests/integration)

render-test: venv
	$(call timed,render-test,$(PY) -m pytest -q tests/render)

# Record what inventory/prod renders (tests/render/prod-render.sha256); commit it with the change.
render-manifest: venv
	$(PY) tests/render/make_manifest.py

preflight-test: venv
	$(call timed,preflight-test,$(PY) -m pytest -q tests/preflight)

# Both ends of meta/runtime.yml's ansible-core range, each in a clean venv of its own (ansible-core and pytest only):
# the collection built, installed and inventory/prod rendered through pd_bundle.serving.render from a directory
# without ansible.cfg, byte-identical to the manifest (tests/core_range). The oldest end also runs the legal
# preflight cases from the clone; the newest runs every case in preflight-test. The Galaxy collections the roles
# use come from the project venv's `ansible` package (PD_GALAXY_DEPS).
OLDEST_VENV := .venv-oldest-core
NEWEST_VENV := .venv-newest-core
$(OLDEST_VENV)/.done: requirements-oldest-core.txt
	python3 -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q -r requirements-oldest-core.txt
	touch $@

# The newest end is requirements.txt's own ansible-core pin (and pytest), read from there.
$(NEWEST_VENV)/.done: requirements.txt
	python3 -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/python -m pip install -q $$(grep -E '^(ansible-core|pytest)[=<>]' requirements.txt | sed 's/ *#.*//')
	touch $@

# Each end: the installed collection renders inventory/prod byte for byte (tests/core_range). The legal preflight
# variations (tests/preflight/legal.yml) run on the pinned end only, in preflight-test (CI time: ten vLLM renders on
# the oldest end cost about 100 s of the tier).
GALAXY_DEPS = $$($(PY) -c 'import ansible_collections,os;print(os.path.dirname(ansible_collections.__path__[0]))')
core-range-test: venv $(OLDEST_VENV)/.done $(NEWEST_VENV)/.done
	$(call timed,core-range-test,export PD_GALAXY_DEPS=$(GALAXY_DEPS); \
		PD_CORE_END=oldest PATH=$(abspath $(OLDEST_VENV))/bin:$$PATH ANSIBLE_COLLECTIONS_PATH=$(CURDIR)/collections:$$PD_GALAXY_DEPS \
			$(OLDEST_VENV)/bin/python -m pytest -q tests/core_range \
		&& PD_CORE_END=newest PATH=$(abspath $(NEWEST_VENV))/bin:$$PATH $(NEWEST_VENV)/bin/python -m pytest -q tests/core_range)

# Tier 1: no hosts needed, a quarter of an hour on 2 cores. `make test` runs its parts two at a time
# (-j2): each part is mostly one process, so one alone leaves a core idle. Longest first (make starts them in this
# order): preflight and render side by side, then core-range beside the short ones.
static: preflight-test render-test core-range-test unit lint

LAB := scripts/lab/molecule.sh
LAB_ENV := PD_LAB_VENV=$(abspath $(VENV))

# The main job: build what is missing, create the lab, converge site.yml, print the entry URL and a curl.
lab: venv
	$(LAB_ENV) $(LAB) create
	$(LAB_ENV) PD_LAB_SKIP_PREPARE=1 $(LAB) converge
	@scripts/lab/lab-info.sh

lab-verify: venv
	$(LAB_PLAY) playbooks/verify.yml
	$(LAB_ENV) PD_LAB_SKIP_PREPARE=1 $(LAB) verify

lab-destroy: venv
	$(LAB_ENV) PD_LAB_SKIP_PREPARE=1 $(LAB) destroy

# On a running lab (LAB ONLY vault password for the lab's router API key).
LAB_PLAY := ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(abspath $(VENV))/bin/ansible-playbook -i molecule/default/inventory

# playbooks/status.yml green, one unit stopped -> red and non-zero, unit back and serving.
lab-status: venv
	PD_LAB_VENV=$(abspath $(VENV)) scripts/lab/status-test.sh

# The benchmark with the tiny model and short lengths (a few minutes), then the router overhead.
# Lab numbers say nothing about GPUs.
# The 1.05 router-overhead goal is for real clusters: on the 2-core lab, four CPU vLLM servers and the
# client share the cores, and run-to-run noise is larger than the goal (docs/operations.md). The lab
# reports the ratio; its bound only catches a router that doubles latency.
LAB_RO_MAX_RATIO ?= 2.0
# The same for the entry (client -> VIP -> HAProxy -> router vs the router alone; goal 1.05 on real clusters).
LAB_RO_ENTRY_MAX_RATIO ?= 2.0
LAB_BENCH_VARS ?= {"benchmark_input_lens":[128,512,1536],"benchmark_num_prompts":6,"benchmark_max_concurrency":2,"benchmark_output_len":16}
lab-bench: venv
	$(LAB_PLAY) playbooks/benchmark.yml -e '$(LAB_BENCH_VARS)'
	$(LAB_PLAY) playbooks/router_overhead.yml -e router_overhead_requests=20 -e router_overhead_max_ratio=$(LAB_RO_MAX_RATIO) \
		-e router_overhead_entry_max_ratio=$(LAB_RO_ENTRY_MAX_RATIO)

# The reuse benchmark (issue 31): per router policy, with and without the store tier, CSV + PNG in benchmark-results/.
# Restarts the prefill instances twice (the tier off, then back). Not in CI (~8 min on the lab).
LAB_BENCH_REUSE_VARS ?= {"benchmark_workload":"reuse","benchmark_reuse_policies":["round_robin","cache_aware"],"benchmark_reuse_conversations":12,"benchmark_reuse_turns":3,"benchmark_reuse_max_tokens":16}
lab-bench-reuse: venv
	$(LAB_PLAY) playbooks/benchmark.yml -e '$(LAB_BENCH_REUSE_VARS)'

# Fault drills (kill -9 of every service kind, an etcd member down, master failover) and the rolling
# upgrade under load, on a lab from `make lab`.
lab-drills: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/drills.py --out lab-results/drills.json

# Prometheus on the lab's monitoring host: targets up, every rule/dashboard query has data, UnitDown fires; then the PNG.
lab-monitoring: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/monitoring-test.py --out lab-results/monitoring.json
	$(LAB_PLAY) playbooks/report.yml -e report_minutes=10 -e report_out=$(CURDIR)/lab-results/monitoring-report.png

lab-reuse: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/reuse.py --out lab-results/reuse.json

lab-store-tier: venv
	mkdir -p lab-results && $(PY) scripts/lab/store_tier.py --ssd --master-kill --out lab-results/store-tier.json

# Every bad input of scripts/lab/bad-input-proof.py, then site.yml --check --diff, against the running lab (the lab
# step runs four of the inputs and no --check run).
lab-proof: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/bad-input-proof.py --inventory $(abspath molecule/default/inventory) --out lab-results/bad-input-proof.json

# Issue 32: the spare host joins and leaves vllm_decode, then vllm_prefill, under load (playbooks/scale.yml), then
# the ratio advisor (playbooks/advisor.yml) on the traffic it saw.
lab-scale: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/scale-test.py --out lab-results/scale.json --advisor --max-overhead 200

# Issue 34: two model pools on the lab's four instances (molecule/default/pools.yml), proven through the entry; the lab
# stays in pools until the next converge without them (scripts/lab/molecule.sh converge). The entry's p50 with model routing against
# direct to the pool's router is a benchmark: scripts/lab/pools-test.py --p50 300 (--igw: vllm-router's multi-model mode beside it,
# docs/pools.md).
lab-pools: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/pools-test.py --converge --rolling --out lab-results/pools.json

# Issue 44's gray failure alone: one prefill's packets to one decode dropped for 40 s, healed by the canary.
lab-partition: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/partition.py --out lab-results/partition.json

# The heal drill (issue 44): one prefill instance's path to a decode cut for 40 s, healed by restart (not in CI's sequence).
lab-heal: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/drills.py --heal-only --out lab-results/heal.json

# Issue 44's gray failures, alone only (not in the drills step: docs/reliability.md): both masters down, etcd quorum lost,
# then the partition.
lab-gray: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/drills.py --gray-only --out lab-results/gray.json

# Issue 44: store mode (decode loads from the store) in a store outage, measured: both masters down, then etcd quorum
# lost, 60 s each; the router must serve again within 120 s of the return. Needs the lab in store mode: converge it with
# -e vllm_kv_connector=MooncakeStoreConnector first (make test's converge-store step leaves it so).
lab-store-mode: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/drills.py --store-mode --out lab-results/store-mode.json

# Issue 52 item 7: every router moves to smg and back to the inventory's program under the SDK load, 0 failed.
lab-router-move: venv
	mkdir -p lab-results && ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) $(PY) scripts/lab/router-move.py --out lab-results/router-move.json

lab-rolling: venv
	ANSIBLE_VAULT_PASSWORD_FILE=$(abspath molecule/default/vault-pass-LAB-ONLY) scripts/lab/rolling-test.sh $(CURDIR)/lab-results

# The full lab sequence (molecule.yml's test_sequence), each step timed.
molecule-test: venv
	$(LAB_ENV) scripts/lab/lab-test.sh default

# The RDMA lab: two QEMU (TCG) VMs with Soft-RoCE; the rdma role, NIC/GID auto selection, and a
# Mooncake transfer over verbs beside ib_write_bw.
rdma-test: venv
	$(LAB_ENV) scripts/lab/lab-test.sh rdma

# The lab caches (docker engine, lab image, wheelhouse, tiny model, RDMA VM image: mostly downloads on a
# fresh machine) fill while the static tier runs: the two overlap instead of adding up.
lab-caches: venv
	$(LAB_ENV) scripts/lab/prepare-caches.sh

# The two core-range venvs are built first, side by side, while the machine is still idle (about 15 s): inside the
# static tier they waited for a job slot and then took about 100 s on the loaded machine.
# The static tier runs alone, before the labs. Measured beside them instead (stop 49), even in a cgroup marked
# cpu.idle: beside the RDMA lab (QEMU TCG leaves no idle CPU) it saved nothing; beside the docker lab it slowed the
# converge from 583 s to 778 s and the re-run from 98 s to 149 s (the re-run bound, 0.20 of the converge, then held by
# 0.01) and still had not finished after 25 minutes. At the same priority both slowed down even more (static 29 min,
# converge 25 min).
test: venv
	@mkdir -p lab-results; start=$$(date +%s); \
	$(LAB_ENV) scripts/lab/prepare-caches.sh > lab-results/lab-caches.log 2>&1 & prep=$$!; \
	$(MAKE) --no-print-directory -j2 $(OLDEST_VENV)/.done $(NEWEST_VENV)/.done || exit $$?; \
	echo "[test] core-range venvs: $$(( $$(date +%s) - start )) s"; \
	st=0; $(MAKE) --no-print-directory -j2 --output-sync=target static || st=$$?; \
	echo "[test] static: $$(( $$(date +%s) - start )) s"; \
	pr=0; wait $$prep || pr=$$?; \
	echo "[test] static and lab caches (overlapped): $$(( $$(date +%s) - start )) s"; \
	if ((pr)); then tail -n 40 lab-results/lab-caches.log; echo "[test] lab caches failed (rc=$$pr)"; exit 1; fi; \
	((st == 0)) || exit $$st; \
	t=$$(date +%s); $(MAKE) --no-print-directory molecule-test || exit $$?; \
	echo "[test] molecule-test: $$(( $$(date +%s) - t )) s"; \
	t=$$(date +%s); $(MAKE) --no-print-directory rdma-test || exit $$?; \
	echo "[test] rdma-test: $$(( $$(date +%s) - t )) s; all: $$(( $$(date +%s) - start )) s"

clean:
	rm -rf .cache render
