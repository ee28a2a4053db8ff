# Shared by scripts/setup.sh and scripts/setup_frontend_venv.sh (sourced, not run).
# The caller sets VENV and SETUP_NAME; this defines say, make_py311_venv and pip_install, and
# sets VPY to the venv's python once make_py311_venv has run.

say() { echo "radixserve ${SETUP_NAME}: $*" >&2; }

is_py311() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; }

# Create $VENV with Python 3.11 unless it already is one. $1: a note for the progress line.
make_py311_venv() {
    if ! is_py311 "$VENV/bin/python"; then
        local py="" candidate
        for candidate in python3.11 python3; do
            if command -v "$candidate" >/dev/null 2>&1 && is_py311 "$candidate"; then
                py="$candidate"
                break
            fi
        done
        if [[ -z "$py" ]]; then
            say "Python 3.11 is required: put python3.11 (or a python3 that is 3.11) on PATH"
            exit 1
        fi
        say "creating $VENV with $("$py" --version 2>&1)${1:+ ($1)}"
        "$py" -m venv --clear "$VENV"
    fi
    VPY="$VENV/bin/python"
}

# Quiet pip, errors visible. The filter drops one harmless warning that this machine's pip config
# (file:// extra indexes without every package) prints for each lookup.
pip_install() {
    "$VPY" -m pip install -q --disable-pip-version-check "$@" \
        2> >(grep -v --line-buffered "is ignored: it is neither a file nor a directory" >&2)
}
