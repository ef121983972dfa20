# Source from the repository root on the GPU machine:  . bench/gpu-env.sh
#
# That machine has no network. What nvc-py needs travels with the working tree (both folders
# are in .git/info/exclude, so name them in the device tool's carry):
#   .whl/   cp312 wheels: click pyelftools pyyaml pyseccomp nvidia-ml-py pytest iniconfig pluggy
#           packaging pygments tomlkit grpcio protobuf grpcio-tools typing-extensions prometheus-client bcrypt atheris, plus pip setuptools wheel to install nvc-py itself, and
#           python-prctl's sdist (PyPI has no wheel: it is built there, once, against libcap-dev's
#           headers from .debs and the machine's own libcap.so.2)
#   .debs/  Debian 12 runc crun busybox-static libyajl2 (crun's JSON library) libcap-dev
# Fetch them here with:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 --platform any -d .whl click pyelftools pyyaml pyseccomp \
#       nvidia-ml-py pytest iniconfig pluggy packaging pygments tomlkit grpcio protobuf grpcio-tools \
#       typing-extensions prometheus-client bcrypt atheris pip setuptools wheel
#   pip download --no-deps --no-binary=:all: -d .whl python-prctl
#   (pip runs the sdist's setup.py for its metadata, which wants libcap-dev's headers: `make deps` first)
#   (cd .debs && apt-get download runc crun busybox-static libyajl2 libcap-dev)
#
# It makes a clean virtual environment at /tmp/site (from the base interpreter, so none of the
# machine's big site-packages load at each start: nvc-py runs at every container start),
# installs the wheels into it, unpacks the .debs under /tmp/debs (never over /), builds the
# native shim and installs nvc-py, and exports PATH, PYTHONPATH and LD_LIBRARY_PATH so that
# `nvc-py`, `bench/discovery.py` and `make test-gpu` work. PYTHON=/tmp/site/bin/python is a virtual
# environment's interpreter: the Makefile installs nvc-py into that environment as it is (no
# /usr/lib/nvc-py/venv, nothing from the network; `make pip-deps` only checks that it lacks nothing).

# python-prctl from its sdist: headers from the carried libcap-dev, linked against the machine's
# libcap.so.2 (the .deb's libcap.so development link points at a file it does not ship).
_nvc_build_prctl() {
    local repo=$1 sdist lib
    sdist=$(ls "$repo"/.whl/python-prctl-*.tar.gz 2>/dev/null | head -n1)
    [ -n "$sdist" ] || { echo "gpu-env: no python-prctl wheel or sdist in .whl" >&2; return 1; }
    lib=$(ls /usr/lib/x86_64-linux-gnu/libcap.so.2 /lib/x86_64-linux-gnu/libcap.so.2 2>/dev/null | head -n1)
    [ -n "$lib" ] || { echo "gpu-env: no libcap.so.2 on this machine" >&2; return 1; }
    mkdir -p /tmp/caplink && ln -sf "$lib" /tmp/caplink/libcap.so
    CPATH=/tmp/debs/usr/include LIBRARY_PATH=/tmp/caplink /tmp/site/bin/python -m pip install -q \
        --no-index --no-deps --no-build-isolation "$sdist"
}

nvc_gpu_env() {
    local repo base pywheel f
    repo=$(pwd)
    [ -d "$repo/.whl" ] && [ -d "$repo/.debs" ] || { echo "gpu-env: run from the repo root with .whl and .debs carried" >&2; return 1; }
    base=python3
    [ -x /opt/torch/.venv/bin/python3 ] && base=/opt/torch/.venv/bin/python3
    # venv made from inside a venv uses that venv's base interpreter: a clean environment.
    if [ ! -x /tmp/site/bin/python ]; then
        "$base" -m venv --without-pip /tmp/site || return 1
    fi
    pywheel=$(ls "$repo"/.whl/pip-*.whl | head -n1)
    # pip runs from its own wheel; byte-compiled on install so every start finds .pyc files.
    /tmp/site/bin/python "$pywheel/pip" install -q --no-index --no-deps --disable-pip-version-check \
        "$repo"/.whl/*.whl || return 1
    mkdir -p /tmp/debs
    for f in "$repo"/.debs/*.deb; do dpkg -x "$f" /tmp/debs || return 1; done
    if ! /tmp/site/bin/python -c 'import prctl' 2>/dev/null; then
        _nvc_build_prctl "$repo" || return 1
    fi
    export PATH="/tmp/site/bin:/tmp/debs/usr/sbin:/tmp/debs/usr/bin:/tmp/debs/bin:$PATH"
    export LD_LIBRARY_PATH="/tmp/debs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONPATH=/tmp/site/lib/python3.12/site-packages
    export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
    make -s -C "$repo" build PYTHON=/tmp/site/bin/python || return 1
    echo "gpu-env: $(command -v nvc-py) ($(/tmp/site/bin/python -V)), runc $(runc --version | head -n1 | cut -d' ' -f3)," \
         "crun $(crun --version | head -n1 | cut -d' ' -f3)"
}
nvc_gpu_env
