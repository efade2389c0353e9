# Entry points. On a fresh Debian 12 machine (root):
#   make lab    - the main job: build what is missing, create the lab, converge, print the router URL
#   make test   - the whole test suite (what CI runs through .ci/run)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export ANSIBLE_CONFIG := $(abspath ansible.cfg)
export PD_LAB_CACHE ?= $(HOME)/.cache/pd-lab

.PHONY: venv lint unit render-test preflight-test static test lab lab-verify lab-destroy molecule-test clean

$(VENV)/.done: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

venv: $(VENV)/.done

lint: venv
	ansible-playbook --syntax-check -i inventory/prod site.yml
	ansible-lint --profile production

unit: venv
	$(PY) -m pytest -q tests/unit

render-test: venv
	$(PY) -m pytest -q tests/render

preflight-test: venv
	$(PY) -m pytest -q tests/preflight

# Tier 1: no hosts needed, a few minutes.
static: lint unit render-test preflight-test

test: static

clean:
	rm -rf .cache render
