# gpuops.k8s — every tier of tests, the lab, and the benchmarks.
# `make test` is what CI runs (.ci/run); it bootstraps its own tools on a fresh Debian 12 machine.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GPUOPS_CACHE ?= $(HOME)/.cache/gpuops
export GPUOPS_CACHE
# Every file requirements/test.txt includes is hashed with it, so that a changed pin makes a new environment
# (scripts/bootstrap.sh computes the same hash).
REQ_HASH := $(shell cat requirements/controller-oldest.txt requirements/test.txt requirements/mitogen.txt | sha256sum | cut -c1-12)
VENV := $(GPUOPS_CACHE)/venv-$(REQ_HASH)
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/.build
COLLECTION = $(CURDIR)/.build/ansible_collections/gpuops/k8s
# The ansible-core versions the collection supports, one per minor from the oldest to the newest, each with the
# Python its sanity and units run on (scripts/ansible-test-matrix.sh): the oldest is requirements/controller-oldest.txt's,
# the newest requirements/controller.txt's. README "Version matrix" says the same (tests/integration/test_agreements.py).
ANSIBLE_CORE_MATRIX := 2.19.14/3.11 2.20.10/3.13 2.21.5/3.13
# make test runs sanity and units on the newest, make test-full both on every minor of the range (README). The oldest
# is the controller every other tier but the lab's runs on (lint, integration, molecule, test-awx, EDA): its runtime
# runs the modules, filters and roles there, so a second units run on it (3.6 minutes warm, 5.7 cold on 2 cores) moved
# to make test-full with the oldest's sanity.
ANSIBLE_CORE_NEWEST := $(lastword $(ANSIBLE_CORE_MATRIX))
# Non-empty under make test-full (GPUOPS_TEST_FULL=1, which scripts/make-test.sh passes on).
FULL = $(filter 1,$(GPUOPS_TEST_FULL))
ANSIBLE_CORE_RUN = $(if $(FULL),$(ANSIBLE_CORE_MATRIX),$(ANSIBLE_CORE_NEWEST))
# The newest controller's environment (requirements/e2e.txt) on the CPython scripts/build-python.sh builds: the e2e
# tier and the demo run ansible-playbook from it. Every other tier runs on the oldest controller ($(VENV)).
NEWEST = venv=$$(scripts/e2e-env.sh) && export PATH="$$venv/bin:$$PATH"
PLUGIN_DIR := files/device_plugin

.PHONY: demo demo-clean demo-test demo-modules test test-full test-awx setup ee lint sanity units integration daemon daemon-py39 daemon-image molecule molecule-default molecule-runtimes e2e lab-up lab-down collection bench clean

# make test: setup first and alone, then two lanes side by side, each lane's tiers in order (scripts/make-test.sh).
# A tier waits much of its time (apt in molecule's containers, the lab's pods, the integration tier's API servers), so
# two lanes fill the two cores that one tier at a time leaves idle. The e2e tier (lab instance 0) and test-awx (lab
# instance 1) have labs of their own; molecule's scenarios are split between the lanes (default in lane 2, the runtime
# scenarios in lane 1, on containers and ports of their own). The integration tier's builds (scripts/build-early.sh,
# started with setup) run beside lane 1's first tiers, which need none of them; its tests wait each for its own build.
FIRST_TIERS := setup
LANE1_TIERS := lint sanity units molecule-runtimes daemon daemon-py39 daemon-image test-awx integration demo-modules
LANE2_TIERS := molecule-default e2e
TIERS := $(FIRST_TIERS) $(LANE1_TIERS) $(LANE2_TIERS)
# make test-full also runs the README's first command, after the e2e tier in its lane: the demo's lab is instance 0,
# the e2e tier's (which runs site.yml and validate.yml on the same lab nodes in make test).
FULL_TIERS := $(TIERS) demo-test

# The tiers in their lanes, then a table of each tier's lane, start and minutes (scripts/make-test.sh).
test:
	@MAKE="$(MAKE)" scripts/make-test.sh "$(FIRST_TIERS)" "$(LANE1_TIERS)" "$(LANE2_TIERS)"

# The same tiers with every exhaustive case as well (GPUOPS_TEST_FULL=1): each drift one by one, every MIG
# config name, the molecule cases one by one (README, "Test tiers"). Run before resolving an issue that touches them.
test-full:
	@GPUOPS_TEST_FULL=1 MAKE="$(MAKE)" scripts/make-test.sh "$(FIRST_TIERS)" "$(LANE1_TIERS)" "$(LANE2_TIERS) demo-test"

setup:
	@scripts/bootstrap.sh

collection:
	@scripts/collection-tree.sh >/dev/null

# The AWX execution environment: ansible-builder on a local Debian 12 base, cached by content in
# $(GPUOPS_CACHE) (scripts/build-ee.sh); prints the image reference.
ee: setup
	scripts/build-ee.sh

lint: setup
	ruff check .
	ruff format --check .
	yamllint -s .
	ansible-lint --profile production
	antsibull-changelog lint
	scripts/galaxy-importer.sh

sanity: setup collection
	scripts/ansible-test-matrix.sh sanity $(ANSIBLE_CORE_RUN)

units: setup collection
	scripts/ansible-test-matrix.sh units $(ANSIBLE_CORE_RUN)

# Its tests that need a build (Kubernetes, containerd, NVIDIA's binaries) run last, and each waits for its build
# (tests/integration/conftest.py), so the others run while scripts/build-early.sh is still building.
integration: setup
	python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=40 tests/integration

# make test type-checks the package here and runs its suite under daemon-py39 (the oldest Python, the dependencies'
# floors); the lab, molecule and daemon-image run the daemon on Debian 12's Python with the newest dependencies. The
# suite on the source tree and this environment's Python is make test-full's (GPUOPS_TEST_FULL=1 or make daemon).
# Non-empty under make test-full and outside make test (scripts/make-test.sh sets GPUOPS_MAKE_TEST=1 for its tiers).
DAEMON_SUITE = $(or $(FULL),$(if $(filter 1,$(GPUOPS_MAKE_TEST)),,1))
daemon: setup
	cd $(PLUGIN_DIR) && mypy --config-file pyproject.toml --cache-dir $(GPUOPS_CACHE)/mypy-device-plugin
	$(if $(DAEMON_SUITE),python -m pytest -q -p no:cacheprovider $(PLUGIN_DIR)/tests,@echo "make test: the daemon's suite runs under daemon-py39")

# The daemon's suite on Python 3.9 (the oldest it supports) against the package as pip installs it,
# its dependencies at their declared lower bounds; the environment is cached in $(GPUOPS_CACHE).
daemon-py39: setup
	venv=$$($(PLUGIN_DIR)/python39-env.sh) && \
	  GPU_DEVICE_PLUGIN_TEST_INSTALLED=1 "$$venv/bin/pytest" -q -p no:cacheprovider $(PLUGIN_DIR)/tests

# The device-plugin image built with podman from the local base image and run against the kubelet double.
daemon-image: setup
	python -m pytest -q -p no:cacheprovider $(PLUGIN_DIR)/image_tests

# The end-to-end tier: a real control plane and GPU node containers (tests/e2e/lab.py). The first
# run builds the Kubernetes binaries into $(GPUOPS_CACHE)/k8s-<version>-<hash> (see docs/lab.md).
LAB_NODES ?= 2
e2e: setup
	$(NEWEST) && python -m pytest -q -p no:cacheprovider --durations=30 tests/e2e

# The AWX path: the execution environment built (make ee), then site.yml run as AWX runs a job
# (ansible-runner transmit | the EE's ansible-runner worker | process) over SSH against a lab of its own
# (instance 1, two nodes), with Kubernetes reached only through the K8S_AUTH_* variables (tests/awx).
AWX_LAB_INSTANCE ?= 1
test-awx: setup collection ee
	GPUOPS_LAB_INSTANCE=$(AWX_LAB_INSTANCE) GPUOPS_LAB_NODES=2 python -m pytest -q -p no:cacheprovider tests/awx

lab-up: setup
	tests/e2e/lab.py up $(LAB_NODES)

lab-down:
	tests/e2e/lab.py down

# Every scenario under molecule/ (or MOLECULE_SCENARIOS="docker crio" for some of them).
MOLECULE_SCENARIOS ?=
molecule: setup
	scripts/molecule.sh $(MOLECULE_SCENARIOS)

# make test's two parts of it, one in each lane: the node scenario (make test-full: every scenario, the full-only
# ones after it), and the runtime scenarios, which make test-full runs in molecule-default's place.
MOLECULE_RUNTIMES := crio docker
molecule-default: setup
	$(if $(FULL),scripts/molecule.sh,scripts/molecule.sh default)

molecule-runtimes: setup
	$(if $(FULL),@echo "make test-full: molecule-default runs every scenario",scripts/molecule.sh $(MOLECULE_RUNTIMES))

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; python "$$b"; done

clean:
	rm -rf .build tests/output

# The README's first command: set up, bring the lab up, run site.yml on two simulated GPU nodes
# (8 x H100 and 1 x T4) and print validate.yml's table (docs/demo.md). GPUOPS_LAB_INSTANCE picks the lab.
demo: setup collection
	$(NEWEST) && python demo/lab_demo.py

demo-clean:
	tests/e2e/lab.py down

# make test-full's run of the demo: the lab is removed afterwards whether the demo passed or not.
demo-test: setup collection
	$(NEWEST) && rc=0; python demo/lab_demo.py --removed-after || rc=$$?; tests/e2e/lab.py down; exit $$rc

# The modules alone on sample configs, in check mode with diffs; changes nothing on this machine.
demo-modules: setup collection
	$(NEWEST) && ANSIBLE_STDOUT_CALLBACK=default ansible-playbook demo/modules.yml --diff
