# Sourced by the GPU scripts of tests/experiments/: makes the offline GPU image ready for kloop (README: On a GPU
# machine without network).
# The image lacks langgraph, anthropic, sqlite-utils: installed from the carried .whl/ (../shared/gpu/wheels.sh);
# bubblewrap comes from a carried .debs/bubblewrap_*.deb where the machine has none.
# A second script in the same machine finds them already in /tmp/site.
if ! PYTHONPATH=/tmp/site python3 -c "import langgraph, sqlite_utils" 2>/dev/null; then
    [ -d .whl ] || { echo "error: no .whl/ to install langgraph and sqlite-utils from (../shared/gpu/wheels.sh)"; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 2
fi
if [ -d /tmp/site ]; then export PYTHONPATH=/tmp/site:$PWD; fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
if ! command -v bwrap >/dev/null && [ -z "${KLOOP_BWRAP:-}" ] && compgen -G ".debs/bubblewrap_*.deb" >/dev/null; then
    dpkg -x .debs/bubblewrap_*.deb /tmp/bw && export KLOOP_BWRAP=/tmp/bw/usr/bin/bwrap
fi
