#!/usr/bin/env bash
# Downloads the wheels that run_on_gpu.sh installs on a GPU machine without a network.
#
# The peer, torch-levenberg-marquardt, and its pure-Python dependencies pytorch-lightning,
# torchmetrics and lightning-utilities, and the many-fits peer torchimize (whose other
# dependencies the GPU image has or it does not import), at the versions pinned in
# benchmarks/requirements.txt,
# as wheels for Python 3.12 (the GPU image's), into benchmarks/gpu/wheels/ (ignored by git;
# the run carries it). Old wheels there are removed first: two versions of one package
# would stop the install. Also writes wheels/SOURCE, the commit the working tree is at, which
# the run reports (the copy of the tree on the GPU machine has no git history): run this
# again right before each GPU run.
#
# Environment: PYTHON (python3) runs pip; DEST (benchmarks/gpu/wheels) is the folder.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
DEST="${DEST:-$ROOT/benchmarks/gpu/wheels}"
REQUIREMENTS="$ROOT/benchmarks/requirements.txt"
NAMES=(torch-levenberg-marquardt pytorch-lightning torchmetrics lightning-utilities torchimize)

specs=()
for name in "${NAMES[@]}"; do
    spec="$(grep -E "^${name}==[^[:space:]#]+" -o "$REQUIREMENTS" || true)"
    if [[ -z "$spec" ]]; then
        echo "fetch_wheels: no pin ${name}==VERSION in $REQUIREMENTS. HINT: pin it there" >&2
        exit 1
    fi
    specs+=("$spec")
done

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    -d "$DEST" "${specs[@]}"

commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
edited="$(git -C "$ROOT" status --porcelain -- packages 2>/dev/null | grep -c '/src/' || true)"
if [[ "$edited" -gt 0 ]]; then
    echo "commit $commit with uncommitted edits in $edited package source files" >"$DEST/SOURCE"
else
    echo "commit $commit" >"$DEST/SOURCE"
fi

echo "fetch_wheels: $(cat "$DEST/SOURCE"); wheels in $DEST:"
ls -1 "$DEST"/*.whl
