# nvc-py build, test and demo entry points. `make demo` and `make test` work on a stock Debian 12
# or Ubuntu 24.04 machine as root: both install what they need (apt, then pip into nvc-py's own
# virtual environment) through `deps`, one line per long step (tools/deps.sh; logs in $(LOGDIR)).

# The interpreter nvc-py's environment is made from: the distribution's own (PEP 668 forbids pip
# installs into it, so nvc-py and its dependencies live in $(VENV), made from it). A PYTHON that
# already is a virtual environment's interpreter (bench/gpu-env.sh's /tmp/site) is used as the
# environment itself: no new one is made and pip-deps installs nothing into it, it only checks.
PYTHON ?= /usr/bin/python3
# As native/client/hook_client.c's PROGRAM_DIR and hook/setup/engines.py's LIBDIR.
LIBDIR := /usr/lib/nvc-py
CODE_CACHE := $(LIBDIR)/code-cache
VENV := $(LIBDIR)/venv
# Where users find the commands (links to the programs in $(LIBDIR)).
BINDIR ?= /usr/local/bin
GIVEN_VENV := $(shell $(PYTHON) -c 'import sys; print(int(sys.prefix != sys.base_prefix))' 2>/dev/null)
# The interpreter nvc-py runs with, installs into and tests with.
ENV_PYTHON := $(if $(filter 1,$(GIVEN_VENV)),$(PYTHON),$(VENV)/bin/python)
PIP := $(ENV_PYTHON) -m pip
# sys.path entries the site module adds for an isolated interpreter (-I without -S), as a Python list.
SITE_PATH = $(shell $(ENV_PYTHON) -I -c 'import subprocess, sys; bare = subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; print(sys.path)"], capture_output=True, text=True, check=True).stdout; print([p for p in sys.path if repr(p) not in bare])')
SCRIPTS_DIR = $(shell [ -x $(ENV_PYTHON) ] && $(ENV_PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
PYTEST_FLAGS ?=
# From tests/, so the installed package (with nvc.rpc and nvc.hook) is imported, not the source tree.
PYTEST := cd tests && $(ENV_PYTHON) -m pytest -c ../setup.cfg --rootdir ..
# python3-venv and python3-dev: nvc-py's environment, and python-prctl (no wheel) built into it.
# prometheus: the exporter's acceptance test runs a server of its own (tests/test_exporter_collector.py).
# clang and libclang-rt-dev: the shim's libFuzzer target (make fuzz, tests/test_fuzz.py).
# systemd-container: systemd-nspawn boots the package's Debian root with systemd (tests/test_deb_systemd.py).
APT_PACKAGES := build-essential gcc-multilib libcap-dev libseccomp-dev libseccomp2 python3-venv python3-dev \
	runc crun podman containerd docker.io busybox-static iproute2 uidmap kmod debootstrap prometheus lintian \
	clang libclang-rt-dev clang-format systemd-container
# Installed where the distribution has them as packages of their own (Debian's bpftool; Ubuntu has it
# only in its kernel-versioned linux-tools): the tests that use them skip without them.
APT_OPTIONAL := bpftool
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_ROOT_USER_ACTION := ignore
# The steps' logs, and pip's download cache (not root's home: `make uninstall` leaves the host as it
# was, `make clean` removes these).
LOGDIR := .make
export PIP_CACHE_DIR := $(CURDIR)/$(LOGDIR)/pip-cache
STEP := LOGDIR=$(LOGDIR) sh tools/deps.sh step
# The test suite's own directories on the host (tests/hostcheck.py): caches kept between runs (the
# debootstrap roots, the package tests' downloads) and the running session's temporary files.
TEST_DIRS := /var/cache/nvc-py-test /var/tmp/nvc-py-test
# make install's record, in LIBDIR, of the files it installed from this tree: `make test`, `demo` and
# `try` install again only when one of them changed or went since, or the environment's nvc-py is not
# this tree's (pip's direct_url.json names where it was installed from: another clone since, or none;
# -I: not an egg-info in the working directory).
INSTALL_STAMP := $(LIBDIR)/.installed
# The one-node Kubernetes cluster's programs (tests/harness/k8scluster.py), built from their Go modules at
# pinned releases by tools/k8s-cluster-bin.sh: kept between runs and checkouts (a directory per set of
# versions), not removed by make clean.
K8S_CLUSTER_CACHE := /var/cache/nvc-py-k8s
INSTALLED_FROM := $(shell $(ENV_PYTHON) -I -c 'import importlib.metadata as m, json; \
	print(json.loads(m.distribution("nvc-py").read_text("direct_url.json"))["url"])' 2>/dev/null)
INSTALL_INPUTS := $(shell find nvc hook rpc -name __pycache__ -prune -o -type f -print) setup.cfg pyproject.toml \
	README.md Makefile native/libnvc-share.so native/nvc-py-hook-client native/nvc-py-driver-snapshot
INSTALL_CURRENT := $(and $(filter file://$(CURDIR),$(INSTALLED_FROM)),\
	$(if $(filter-out $(INSTALL_INPUTS),$(shell cat $(INSTALL_STAMP) 2>/dev/null)),,current))
# What the hooks, their server and the device plugin leave in RUN_DIR beside the containers' sharing
# state (share/, gpu-sched/), for `make uninstall` (driver-files: a directory of kept discoveries).
RUN_DIR := /run/nvc-py
RUN_FILES := config-cache.json runtime-cache driver-guess ldconfig-seccomp.bpf elf-links.json mig-minors driver-files hook.sock \
	server.lock server.log device-plugin.json
# The Debian package's state where it is installed (dpkg-query: installed, unpacked, ...): its files are
# $(LIBDIR), which this tree's install would overwrite. Then install, uninstall and what needs this tree
# installed (build, test, fuzz) refuse in one line, and try and demo use the package as installed.
PACKAGED := $(filter-out not-installed config-files,$(shell dpkg-query -W -f='$${db:Status-Status}' nvc-py 2>/dev/null))
PACKAGED_REFUSAL := $(LIBDIR) is the Debian package nvc-py's: this tree is not installed over it nor removed \
	from it; apt remove nvc-py first (make try and make demo use the package as installed)
# `make try CMD="nvc-py list"` runs CMD in the try shell instead of an interactive shell.
CMD ?=
# `make uninstall PURGE=1` also removes the log and /etc/nvc-py.
PURGE ?=

# The Debian package (make deb): its version (DEB_VERSION=... builds another: the tests build a lower
# one to upgrade from), where it is built, and what building it needs besides make (and git in a
# clone, none in a release tarball): the compiler and headers for the native code and python-prctl
# (no wheel), the venv module, dpkg-dev. DEB_XZ_LEVEL: xz's level for the package's data (default: dpkg-deb's).
DEB_VERSION ?= $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' nvc/__init__.py)
DEB_DIR ?= dist
DEB_PIP_CACHE ?= $(DEB_DIR)/pip-cache
DEB_XZ_LEVEL ?=
DEB_BUILD_PACKAGES := build-essential dpkg-dev libcap-dev python3-dev python3-venv

.PHONY: all deps apt-deps env pip-deps build native install fronts code-cache test test-gpu fuzz demo demo-plan try uninstall \
	print-test-python dev lint lint-python lint-c lint-c-format format-c sanitize sanitize-tests clean k8s-api k8s-cluster-bin deb deb-deps deb-lock unpackaged FORCE

all: build

## deps: everything a stock Debian 12 or Ubuntu 24.04 needs (idempotent: installs only what is missing)
deps: unpackaged apt-deps pip-deps

apt-deps:
	@APT_PACKAGES="$(APT_PACKAGES)" APT_OPTIONAL="$(APT_OPTIONAL)" LOGDIR=$(LOGDIR) sh tools/deps.sh apt-install

## env: nvc-py's virtual environment, made from $(PYTHON) where missing (not for a given venv)
env: unpackaged
	@[ -x $(ENV_PYTHON) ] || $(STEP) venv "pip: making $(VENV) from $(PYTHON)" $(PYTHON) -m venv $(VENV)

## pip-deps: the requirements the environment lacks (tools/missing_deps.py, which reads them with packaging:
## installed first where missing; nothing built to find out)
pip-deps: env
	@if [ "$(GIVEN_VENV)" != 1 ] && ! $(ENV_PYTHON) -c 'import packaging' 2>/dev/null; then \
		$(STEP) pip-packaging "pip: packaging, to read the requirements with" $(PIP) install packaging || exit 1; \
	fi; \
	missing=$$($(ENV_PYTHON) tools/missing_deps.py) || exit 1; \
	if [ -n "$$missing" ] && [ "$(GIVEN_VENV)" = 1 ]; then \
		echo "$(PYTHON)'s environment lacks: $$missing (install them there; this make installs nothing into it)" >&2; exit 1; \
	elif [ -n "$$missing" ]; then \
		$(STEP) pip "pip: installing $$(echo $$missing | wc -w) requirements into $(VENV)" $(PIP) install $$missing \
			|| exit 1; \
		echo "pip: $$(grep '^Successfully installed' $(LOGDIR)/pip.log | wc -w | awk '{print $$1 - 2}') distributions" \
			"installed (log: $(LOGDIR)/pip.log)"; \
	fi

## dev: a development environment in the checkout (.venv, editable: nvc.rpc and nvc.hook are rpc/ and hook/
## through setup.cfg's package_dir), to run `.venv/bin/python -m nvc` and the pure tests from the source tree
dev:
	@[ -x .venv/bin/python ] || $(PYTHON) -m venv .venv
	@.venv/bin/python -m pip install -q -e '.[test,lint]'
	@echo "dev: .venv/bin/python -m nvc runs this checkout's code (nvc.rpc from rpc/, nvc.hook from hook/)"

## lint: the Python checks (ruff lint and format check, mypy strict on the pure layers: pyproject.toml) and the
## C ones (lint-c); the lint tools are setup.cfg's lint extra, installed into the environment where missing
lint: lint-python lint-c

lint-python: pip-deps
	@missing=$$($(ENV_PYTHON) tools/missing_deps.py --extra lint) || exit 1; \
	if [ -n "$$missing" ]; then $(STEP) pip-lint "pip: the lint tools" $(PIP) install $$missing || exit 1; fi
	$(ENV_PYTHON) -m ruff check --no-cache .
	$(ENV_PYTHON) -m ruff format --no-cache --check .
	$(ENV_PYTHON) -m mypy --no-incremental

# The C files kept in clang-format's style: .clang-format, and tests/.clang-format for the test doubles' (the
# generated client/unsafe_env.h and version.h aside).
C_FILES = $(shell find native tests/fakedriver/src tests/share_programs -name '*.[ch]' ! -name unsafe_env.h ! -name version.h | sort)

## lint-c: the C checks: every C file in clang-format's style (make format-c applies it), and the shim and the
## hook client compiled with warnings as errors (native/Makefile's WARNINGS)
lint-c: lint-c-format
	@$(MAKE) -s --no-print-directory -C native warnings

lint-c-format:
	@command -v clang-format >/dev/null || { echo "lint-c: no clang-format (make apt-deps installs it)" >&2; exit 1; }
	clang-format --dry-run --Werror $(C_FILES)

## format-c: clang-format over the C files lint-c checks
format-c:
	clang-format -i $(C_FILES)

## print-test-python: the interpreter the tests run with (/work/bin/nvc-test asks)
print-test-python:
	@echo $(ENV_PYTHON)

## build: native code, then the package (non-editable, as users get it)
build: unpackaged native install

native:
	@$(MAKE) -s -q -C native 2>/dev/null || \
		$(STEP) native "build: native/ (the sharing shim, the hook client, the driver helper)" $(MAKE) -C native

# Every installed program lives in $(LIBDIR), which pip never writes, and the hooks.d, CDI, runtime
# and systemd entries name it there (hook/setup/engines.py): a later `pip install -U` rewrites its console
# scripts in the scripts directory, which only makes a typed `nvc-py` start an interpreter again.
# $(call launcher,NAME,MODULE): $(LIBDIR)/NAME runs MODULE's run() in an isolated interpreter (-I:
# no PYTHONPATH, PYTHONHOME, PYTHONSTARTUP or user site from the caller's environment) that skips
# the site module (-S: it costs every start several ms, more with .pth files that run code); the
# launcher puts back the directories site would have added (SITE_PATH, taken at install time),
# so nvc-py and its dependencies are found as under plain -I; then it maps the code cache that install
# writes beside it (nvc/system/codecache.py: the compiled modules of a call, without a search per module).
define launcher
	printf '#!%s -IS\nimport sys\nsys.path.extend(%s)\nfrom nvc.system.codecache import use\nuse(%s)\nfrom $(2) import run\nrun()\n' \
		"$$($(ENV_PYTHON) -c 'import sys; print(sys.executable)')" "$(SITE_PATH)" "'$(CODE_CACHE)'" > $(LIBDIR)/$(1).new
	chmod 0755 $(LIBDIR)/$(1).new && mv $(LIBDIR)/$(1).new $(LIBDIR)/$(1)
endef

# $(call front,NAME,MODULE): $(LIBDIR)/NAME is the native front (native/client/hook_client.c), which drops the
# caller's unsafe variables (nvc/system/unsafe-environment.list), hands a call of nvc-py or nvc-py-hook to the hook server
# (starting one for a hook call where none runs) and otherwise runs $(LIBDIR)/NAME-python, the Python program;
# the NAME console script and $(BINDIR)/NAME become links to the front.
define front
	$(call launcher,$(1)-python,$(2))
	install -m 0755 native/nvc-py-hook-client $(LIBDIR)/$(1).new && mv $(LIBDIR)/$(1).new $(LIBDIR)/$(1)
	$(call link,$(1))
endef

# $(call link,NAME): the console script NAME in the environment, and $(BINDIR)/NAME, link to $(LIBDIR)/NAME.
define link
	ln -sfn $(LIBDIR)/$(1) "$(SCRIPTS_DIR)/$(1)"
	mkdir -p $(BINDIR) && ln -sfn $(LIBDIR)/$(1) $(BINDIR)/$(1)
endef

install: unpackaged pip-deps $(INSTALL_STAMP)

# build/ goes first: setuptools would copy what an earlier build left there (a moved module) again.
$(INSTALL_STAMP): $(INSTALL_INPUTS) $(if $(INSTALL_CURRENT),,FORCE)
	@rm -rf build
	@$(STEP) install "install: nvc-py from $(CURDIR) into $(LIBDIR)" \
		$(PIP) install --no-cache-dir --no-deps --no-index --no-build-isolation .
	@install -D -m 0644 native/libnvc-share.so $(LIBDIR)/libnvc-share.so
	@install -D -m 0755 native/nvc-py-hook-client $(LIBDIR)/nvc-py-hook-client
	@install -D -m 0755 native/nvc-py-driver-snapshot $(LIBDIR)/nvc-py-driver-snapshot
	@$(MAKE) -s --no-print-directory fronts
	@$(MAKE) -s --no-print-directory code-cache
	@echo "install: $(LIBDIR)/nvc-py, nvc-py-hook and nvc-py-runtime, linked from $(BINDIR)"
	@printf '%s\n' $(INSTALL_INPUTS) > $@

FORCE:

# unpackaged: refuses where the Debian package owns $(LIBDIR) (what env, install and uninstall would change),
# before anything else of a target that installs this tree (deps, build, test) is done.
unpackaged:
	@if [ -n "$(PACKAGED)" ]; then echo "make $(or $(MAKECMDGOALS),all): $(PACKAGED_REFUSAL)" >&2; exit 1; fi

## fronts: the programs in $(LIBDIR) and the console-script links (part of install)
fronts:
	$(call front,nvc-py,nvc.__main__)
	$(call front,nvc-py-hook,nvc.hook.program)
	$(call front,nvc-py-runtime,nvc.hook.oci.runtime)

## code-cache: the launchers' code cache ($(CODE_CACHE)) of the modules installed now (part of install;
## again after anything rewrote them, such as a pip reinstall)
code-cache:
	@$(ENV_PYTHON) -I -m nvc.hook.setup.maintainer code-cache $(CODE_CACHE) >/dev/null

## test: the whole suite (GPU tests are deselected by setup.cfg's addopts)
test: unpackaged deps build k8s-cluster-bin
	@echo "test: pytest $(PYTEST_FLAGS) (the suite's files: $(TEST_DIRS); make clean removes them)"
	$(PYTEST) $(PYTEST_FLAGS)

## fuzz: every fuzz target for FUZZ_SECONDS each over its seed corpus (tests/fuzz/; FUZZ_TARGETS=... for some);
## what they find goes to $(LOGDIR)/fuzz (docs/development.md)
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: unpackaged deps build
	cd tests && $(ENV_PYTHON) -m harness.fuzzing --seconds $(FUZZ_SECONDS) --work $(CURDIR)/$(LOGDIR)/fuzz $(FUZZ_TARGETS)

## sanitize: the shim, the hook client and the driver helper built with AddressSanitizer and UndefinedBehaviorSanitizer
## (native/sanitize/), and the native tests (SANITIZE_TESTS) run with them (tests/harness/native.py; the shim is
## preloaded behind the ASan runtime); `make test` runs it (tests/test_sanitize.py). Not the compute share's tests:
## they time the fake GPU against the shim's work, which the sanitizers slow down
SANITIZE_TESTS ?= test_share_native.py test_share_native_memory.py test_share_native_graphmem.py \
	test_hook_server_protocol.py test_hook_server_wedged.py test_hook_server_clients.py test_driver_snapshot.py
sanitize: unpackaged deps build
	@$(MAKE) --no-print-directory sanitize-tests

sanitize-tests:
	@$(MAKE) -s --no-print-directory -C native sanitize
	export NVC_TEST_SANITIZE=1; $(PYTEST) -p no:cacheprovider $(SANITIZE_TESTS) $(PYTEST_FLAGS)

## test-gpu: only @pytest.mark.gpu tests, on a GPU machine; installs nothing from the network
## (docs/development.md: carry wheels and .deb files there)
test-gpu: unpackaged build
	$(PYTEST) -m gpu -p no:cacheprovider $(PYTEST_FLAGS)

## demo: say what it will install and change, install it, build everything, then show the GPUs nvc-py
## sees (real driver if present, else the fake one)
demo: demo-plan $(if $(PACKAGED),apt-deps,deps build)
	@$(ENV_PYTHON) demo/run.py

demo-plan:
	@echo "== make demo: what it installs and changes on this host (as root) =="
	@APT_PACKAGES="$(APT_PACKAGES)" APT_OPTIONAL="$(APT_OPTIONAL)" LOGDIR=$(LOGDIR) sh tools/deps.sh apt-plan
	@if [ -n "$(PACKAGED)" ]; then echo "  pip, install: nothing (the Debian package nvc-py in $(LIBDIR) is used as installed)"; \
	elif [ ! -x $(ENV_PYTHON) ]; then echo "  pip: makes $(VENV) and installs nvc-py's Python requirements there"; \
	elif ! $(ENV_PYTHON) -c 'import packaging' 2>/dev/null; then \
		echo "  pip: installs packaging, then what $(VENV) lacks"; \
	else missing=$$($(ENV_PYTHON) tools/missing_deps.py); \
		echo "  pip: $${missing:-nothing to install}$${missing:+ into $(VENV)}"; fi
	@if [ -n "$(INSTALL_CURRENT)" ] && [ -e $(INSTALL_STAMP) ] && [ -e native/libnvc-share.so ] && \
		[ -e native/nvc-py-hook-client ] && [ -e native/nvc-py-driver-snapshot ] && \
		[ -z "$$(find $(INSTALL_INPUTS) -newer $(INSTALL_STAMP) -print -quit 2>/dev/null)" ]; then \
		echo "  install: nothing (nvc-py in $(LIBDIR) is this tree's)"; \
	elif [ -z "$(PACKAGED)" ]; then \
		echo "  install: builds native/ and installs nvc-py into $(LIBDIR), with links in $(BINDIR)"; fi
	@echo "  then: podman containers through nvc-py's hook, in a private store and mount namespace (a fake GPU"
	@echo "        driver where there is no NVIDIA one); nothing else on the host changes"
	@echo "  $(if $(PACKAGED),apt remove nvc-py removes the package,make uninstall removes the install) (apt's packages stay)"

## try: a shell (or CMD) in a private mount namespace where nvc-py answers from the fake driver (test double)
try: $(if $(PACKAGED),,build)
	$(ENV_PYTHON) demo/try.py $(if $(CMD),--command '$(value CMD)')

## uninstall: what make install, `nvc-py setup ...` and `cdi generate --output` put on the host (hook/setup/maintainer.py's
## unregister, as the Debian package's removal; PURGE=1: the log and /etc/nvc-py too)
uninstall: unpackaged
	-@[ -x $(LIBDIR)/nvc-py-python ] && $(ENV_PYTHON) -I -m nvc.hook.setup.maintainer stop-servers; \
		[ -x $(LIBDIR)/nvc-py-python ] && $(ENV_PYTHON) -I -m nvc.hook.setup.maintainer unregister; \
		[ -x $(LIBDIR)/nvc-py-python ] && $(LIBDIR)/nvc-py-python setup server --remove
	@for name in nvc-py nvc-py-hook nvc-py-runtime; do \
		for link in $(BINDIR)/$$name "$(SCRIPTS_DIR)/$$name"; do \
			[ "$$(readlink "$$link")" = $(LIBDIR)/$$name ] && rm -v "$$link"; done; done; true
	$(if $(filter 1,$(GIVEN_VENV)),-$(PIP) uninstall -y -q nvc-py)
	@rm -rf $(LIBDIR) && echo "removed $(LIBDIR)"
	@# A sharing directory is removed only without a container's state in it (gpu-sched: root's .granted
	@# directory aside), gpu-sched's tmpfs unmounted first; the run directory and /etc/nvc-py only when empty.
	@for dir in $(RUN_DIR)/share $(RUN_DIR)/gpu-sched; do \
		[ -d $$dir ] || continue; \
		if [ -n "$$(find $$dir -mindepth 1 ! -type d -print -quit; find $$dir -mindepth 1 -maxdepth 1 ! -name .granted)" ]; \
		then echo "kept $$dir: it holds containers' GPU-sharing state (remove it once they have stopped)"; continue; fi; \
		if mountpoint -q $$dir; then umount $$dir; fi; rm -rv $$dir; \
	done
	@for name in $(RUN_FILES); do rm -rfv $(RUN_DIR)/$$name; done
	@for dir in $(RUN_DIR) $(if $(PURGE),,/etc/nvc-py); do \
		[ ! -d $$dir ] || rmdir -v --ignore-fail-on-non-empty $$dir; done
	$(if $(PURGE),@rm -rfv /var/log/nvc-py.log /var/log/nvc-py.log.[0-9]* /etc/nvc-py)

## deb: $(DEB_DIR)/nvc-py_$(DEB_VERSION)_ARCH.deb for the distribution this runs on, as root (tools/debpkg.py;
## docs/install.md); the host's /usr/lib/nvc-py is left as it is
deb: deb-deps
	/usr/bin/python3 tools/debpkg.py build --version '$(DEB_VERSION)' --out $(DEB_DIR) --pip-cache $(DEB_PIP_CACHE) \
		$(if $(DEB_XZ_LEVEL),--xz-level $(DEB_XZ_LEVEL))

deb-deps:
	@$(MAKE) --no-print-directory apt-deps APT_PACKAGES="$(DEB_BUILD_PACKAGES)" APT_OPTIONAL=

## deb-lock: deploy/debian/python-lock.txt again, from the newest releases that satisfy setup.cfg
deb-lock:
	/usr/bin/python3 tools/debpkg.py lock

## k8s-api: regenerate nvc/k8s/api_pb2*.py and nvc/k8s/dra/*_pb2*.py from their .proto (grpcio-tools, a test requirement)
k8s-api:
	$(ENV_PYTHON) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. nvc/k8s/api.proto
	$(ENV_PYTHON) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. nvc/k8s/dra/dra.proto \
		nvc/k8s/dra/registration.proto

## k8s-cluster-bin: the test cluster's Kubernetes, etcd, containerd and CNI programs into $(K8S_CLUSTER_CACHE)
## (Go and its module proxy; about 10 minutes on two cores when cold); not built, the cluster tests skip
k8s-cluster-bin:
	@sh tools/k8s-cluster-bin.sh --check $(K8S_CLUSTER_CACHE) >/dev/null || \
		$(STEP) k8s-cluster-bin "k8s-cluster-bin: building the test cluster's programs" \
			nice sh tools/k8s-cluster-bin.sh $(K8S_CLUSTER_CACHE) || \
		echo "k8s-cluster-bin: not built, the cluster tests will skip (make k8s-cluster-bin to retry)" >&2

clean:
	$(MAKE) -C native clean
	rm -rf build *.egg-info .pytest_cache $(DEB_DIR) $(LOGDIR) $(TEST_DIRS)
