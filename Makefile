# nvc-py build, test and demo entry points. `make demo` and `make test` work on a fresh
# Debian 12 machine as root: both install what they need (apt and pip) through `deps`.

PYTHON ?= python3
PIP := $(PYTHON) -m pip
# As native/hook_client.c's PROGRAM_DIR and hook/setup.py's HOOK_CLIENT.
LIBDIR := /usr/lib/nvc-py
# sys.path entries the site module adds for an isolated interpreter (-I without -S), as a Python list.
SITE_PATH = $(shell $(PYTHON) -I -c 'import subprocess, sys; bare = subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; print(sys.path)"], capture_output=True, text=True, check=True).stdout; print([p for p in sys.path if repr(p) not in bare])')
PYTEST_FLAGS ?=
# From tests/, so the installed package (with nvc.rpc and nvc.hook) is imported, not the source tree.
PYTEST := cd tests && $(PYTHON) -m pytest -c ../setup.cfg --rootdir ..
APT_PACKAGES := build-essential gcc-multilib libcap-dev libseccomp-dev libseccomp2 \
	runc crun podman containerd busybox-static iproute2 uidmap kmod bpftool
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_ROOT_USER_ACTION := ignore

.PHONY: all deps apt-deps pip-deps build native install fronts test test-gpu demo clean

all: build

## deps: everything a fresh Debian 12 needs (idempotent: installs only what is missing)
deps: apt-deps pip-deps

apt-deps:
	@missing=$$(for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

pip-deps:
	$(PIP) install -q --upgrade-strategy only-if-needed wheel ".[test]"

## build: native code, then the package (non-editable, as users get it)
build: native install

native:
	$(MAKE) -C native

# Every installed program lives in $(LIBDIR), which pip never writes, and the hooks.d, CDI, runtime
# and systemd entries name it there (hook/setup.py): a later `pip install -U` rewrites its console
# scripts in the scripts directory, which only makes a typed `nvc-py` start an interpreter again.
# $(call launcher,NAME,MODULE): $(LIBDIR)/NAME runs MODULE's run() in an isolated interpreter (-I:
# no PYTHONPATH, PYTHONHOME, PYTHONSTARTUP or user site from the caller's environment) that skips
# the site module (-S: it costs every start several ms, more with .pth files that run code); the
# launcher puts back the directories site would have added (SITE_PATH, taken at install time),
# so nvc-py and its dependencies are found as under plain -I.
define launcher
	printf '#!%s -IS\nimport sys\nsys.path.extend(%s)\nfrom $(2) import run\nrun()\n' \
		"$$($(PYTHON) -c 'import sys; print(sys.executable)')" "$(SITE_PATH)" > $(LIBDIR)/$(1).new
	chmod 0755 $(LIBDIR)/$(1).new && mv $(LIBDIR)/$(1).new $(LIBDIR)/$(1)
endef

# $(call front,NAME,MODULE): $(LIBDIR)/NAME is the native front (native/hook_client.c), which hands each
# call to the hook server (starting one for a hook call where none runs) and otherwise runs
# $(LIBDIR)/NAME-python, the Python program; the NAME console script becomes a link to the front.
define front
	$(call launcher,$(1)-python,$(2))
	install -m 0755 native/nvc-py-hook-client $(LIBDIR)/$(1).new && mv $(LIBDIR)/$(1).new $(LIBDIR)/$(1)
	ln -sfn $(LIBDIR)/$(1) "$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/$(1)"
endef

install:
	$(PIP) install -q --no-deps --no-index --no-build-isolation .
	install -D -m 0644 native/libnvc-share.so $(LIBDIR)/libnvc-share.so
	install -D -m 0755 native/nvc-py-hook-client $(LIBDIR)/nvc-py-hook-client
	$(MAKE) --no-print-directory fronts

## fronts: the programs in $(LIBDIR) and the console-script links (part of install)
fronts:
	$(call front,nvc-py,nvc.__main__)
	$(call front,nvc-py-hook,nvc.hook.program)
	$(call launcher,nvc-py-runtime,nvc.hook.runtime)
	ln -sfn $(LIBDIR)/nvc-py-runtime "$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/nvc-py-runtime"

## test: the whole suite (GPU tests are deselected by setup.cfg's addopts)
test: deps build
	$(PYTEST) $(PYTEST_FLAGS)

## test-gpu: only @pytest.mark.gpu tests, on a GPU machine; installs nothing from the network
## (see README: carry wheels and .deb files there)
test-gpu: build
	$(PYTEST) -m gpu -p no:cacheprovider $(PYTEST_FLAGS)

## demo: build everything, then show the GPUs nvc-py sees (real driver if present, else the fake one)
demo: deps build
	$(PYTHON) demo/run.py

clean:
	$(MAKE) -C native clean
	rm -rf build *.egg-info .pytest_cache
