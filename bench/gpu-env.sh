# Source from the repository root on the GPU machine:  . bench/gpu-env.sh
#
# That machine has no network. What nvc-py needs travels with the working tree (both folders
# are in .git/info/exclude, so name them in the device tool's carry):
#   .whl/   cp312 wheels: click pyelftools pyyaml pyseccomp python-prctl (built here, no PyPI
#           wheel exists) nvidia-ml-py pytest iniconfig pluggy packaging pygments tomlkit,
#           plus pip setuptools wheel to install nvc-py itself
#   .debs/  Debian 12 runc crun busybox-static libyajl2 (crun's JSON library)
#
# It makes a clean virtual environment at /tmp/site (from the base interpreter, so none of the
# machine's big site-packages load at each start: nvc-py runs at every container start),
# installs the wheels into it, unpacks the .debs under /tmp/debs (never over /), builds the
# native shim and installs nvc-py, and exports PATH, PYTHONPATH and LD_LIBRARY_PATH so that
# `nvc-py`, `bench/discovery` and `make test-gpu` work.

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
    export PATH="/tmp/site/bin:/tmp/debs/usr/sbin:/tmp/debs/usr/bin:/tmp/debs/bin:$PATH"
    export LD_LIBRARY_PATH="/tmp/debs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONPATH=/tmp/site/lib/python3.12/site-packages
    export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
    make -s -C "$repo" build PYTHON=/tmp/site/bin/python || return 1
    echo "gpu-env: $(command -v nvc-py) ($(/tmp/site/bin/python -V)), runc $(runc --version | head -n1 | cut -d' ' -f3)," \
         "crun $(crun --version | head -n1 | cut -d' ' -f3)"
}
nvc_gpu_env
