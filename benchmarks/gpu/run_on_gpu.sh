#!/usr/bin/env bash
# Runs the GPU checks from the repository root on a machine with an NVIDIA GPU and no network:
#   OUT=$OUT bash benchmarks/gpu/run_on_gpu.sh
# (README.md beside this: the wheels to carry, what comes back, a dry run without a GPU).
#
# Needs Python 3.12 with torch (a CUDA build), numpy, scipy, pytest, matplotlib and
# nvidia-ml-py; no nox. Installs the four packages from their folders and the wheels in
# benchmarks/gpu/wheels (fetch_wheels.sh) into a scratch folder with pip --no-deps, then
# runs, each part under its own time limit and whether or not the parts before it passed:
#   env, env-nvidia-smi  what the machine has (env-nvidia-smi skipped where there is no
#                        nvidia-smi)
#   install              the packages and the carried wheels
#   devices, devices-processes, devices-plan  marquardt-devices: the table, the GPU
#                        processes, and its plan for P=49921 N=10000
#   gpu-tests-<package>  each package's gpu-marked tests (first: they are what needs the GPU)
#   integration          integration_tests/test_gpu.py
#   bench-<name>         benchmarks/run_all.py <name> --device cuda:0 for each benchmark of
#                        BENCH_PARTS, each a part with its own time limit and budget, in the
#                        order of the targets they decide: the same benchmarks as on the CPU,
#                        each on its device path (LM steps at every shape with GPU memory and
#                        host synchronisations, many fits, small fits, a new model's first
#                        call against the eager one with compile=True's Triton build and the
#                        kept kernels' load in a second process, time to quality, curve_fit,
#                        PINN with PinnStep's compiled and eager step, the kernels' compile
#                        time, matrix-free); each rewrites RESULTS-gpu.md, keeping the
#                        others' latest figures
#   tests-<package>      each package's other tests, spread over the cores with pytest-xdist
#                        where it is installed (XDIST workers, 8); not in the default PARTS:
#                        they need no GPU, CI runs them, and they do not fit the 9 minutes
# The whole run stays within TOTAL seconds (README.md: the arithmetic of the limits). Results
# go to $OUT, four files at most (a device machine returns eight): summary.txt (one line per
# part), RESULTS-gpu.md, summary-gpu.json, and gpu-run.tar.gz with every part's output
# (<part>.txt), the tests' JUnit XML (<part>.xml) and each benchmark's <name>-gpu.json and
# plots. They are rewritten after each part, so whatever ran is there even if the run is
# cut short.
#
# Environment: OUT (required), PYTHON (python3), WHEELS (benchmarks/gpu/wheels), SITE
# (/tmp/marquardt-site), TOTAL (530 s), BENCH_PARTS (name:limit[:budget] each, in seconds;
# the budget is run_all.py's --budget for that benchmark: its time budget, or for first_call
# and compile_time the most seconds one of their processes may take),
# GPU_TEST_CAP (60 s per package), TEST_CAP (60 s per package), XDIST (8; 0 runs the suites in
# one process), PARTS (the parts to run, by name or prefix: "env install devices gpu-tests
# integration bench" by default; add "tests" for the other tests), PYTEST_ARGS (added to every pytest command, e.g. "-x" or "--collect-only -q"),
# BENCH_ARGS (added to run_all.py's, e.g. "--device cpu --quick" for a dry run without GPU).
#
# set -e is left out on purpose: a failing part is recorded and the next one still runs.
set -uo pipefail

OUT="${OUT:?set OUT to the folder the results go to}"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-benchmarks/gpu/wheels}"
SITE="${SITE:-/tmp/marquardt-site}"
TOTAL="${TOTAL:-530}"
BENCH_PARTS="${BENCH_PARTS:-scale:90:60 batch_fit:45 small_fit:30 first_call:65:40 quality:45:30 curve_fit:35 pinn:75:2 compile_time:40:18 matrix_free:20:5}"
GPU_TEST_CAP="${GPU_TEST_CAP:-60}"
TEST_CAP="${TEST_CAP:-60}"
XDIST="${XDIST:-8}"
PARTS="${PARTS:-env install devices gpu-tests integration bench}"
PACKAGES=(core-devices core-jacobian core-solver trainer)
read -r -a EXTRA_PYTEST <<<"${PYTEST_ARGS:-}"
read -r -a EXTRA_BENCH <<<"${BENCH_ARGS:-}"

if [[ ! -d packages/core-devices || ! -f benchmarks/run_all.py ]]; then
    echo "run_on_gpu: run this from the repository root (found no packages/core-devices here)" >&2
    exit 2
fi
mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/marquardt-gpu.XXXXXX")"
SUMMARY="$WORK/summary.txt"
export PYTHONUNBUFFERED=1

log() {
    printf '%s\n' "$*" | tee -a "$SUMMARY"
}

# Copies the summary and the benchmarks' report and summary to $OUT and packs every output
# (each benchmark's JSON and plots among them) into gpu-run.tar.gz there.
bundle() {
    cp "$SUMMARY" "$OUT/summary.txt"
    local f
    for f in "$WORK"/RESULTS*.md "$WORK"/summary*.json; do
        if [[ -f "$f" ]]; then
            cp "$f" "$OUT/"
        fi
    done
    tar -czf "$OUT/gpu-run.tar.gz" -C "$WORK" . || log "bundle: tar failed"
    local size
    size="$(stat -c %s "$OUT/gpu-run.tar.gz" 2>/dev/null || echo 0)"
    if ((size > 16 * 1024 * 1024)); then
        log "bundle: gpu-run.tar.gz holds $size bytes, over the 16 MiB a file may have to come back"
    fi
}

# Whether a part is asked for: its name, or its prefix before "-", is in PARTS.
wanted() {
    local part
    for part in $PARTS; do
        if [[ "$1" == "$part" || "$1" == "$part"-* ]]; then
            return 0
        fi
    done
    return 1
}

# run_part NAME CAP COMMAND...: COMMAND's output goes to $WORK/NAME.txt; it is stopped after
# CAP seconds, or when the run's TOTAL is spent, whichever comes first. LAST_RC is its exit
# status (-1 when it was not run).
LAST_RC=-1
run_part() {
    local name="$1" cap="$2"
    shift 2
    LAST_RC=-1
    if ! wanted "$name"; then
        return 0
    fi
    local left=$((TOTAL - SECONDS))
    local limit=$((cap < left ? cap : left))
    if ((limit < 5)); then
        log "$name: skipped, ${left} s of the ${TOTAL} s left"
        return 0
    fi
    local start=$SECONDS rc=0
    timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.txt" 2>&1 || rc=$?
    LAST_RC=$rc
    local verdict="passed"
    if ((rc == 124 || rc == 137)); then
        verdict="stopped at its ${limit} s limit"
    elif ((rc != 0)); then
        verdict="failed (exit code $rc)"
    fi
    log "$name: $verdict after $((SECONDS - start)) s (see $name.txt)"
    bundle
}

log "run_on_gpu: $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname); TOTAL ${TOTAL} s; parts: $PARTS"
SOURCE=""
if [[ -f "$WHEELS/SOURCE" ]]; then
    SOURCE="$(cat "$WHEELS/SOURCE")"
fi
log "source: ${SOURCE:-unknown (no $WHEELS/SOURCE; run benchmarks/gpu/fetch_wheels.sh)}"

# -- the machine ------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
    run_part env-nvidia-smi 30 nvidia-smi
elif wanted env-nvidia-smi; then
    log "env-nvidia-smi: skipped, no nvidia-smi here"
fi
run_part env 60 "$PYTHON" - <<'PY'
import importlib.metadata as metadata
import platform
import sys

print("python", sys.version.replace("\n", " "), "on", platform.platform())
for name in (
    "torch", "triton", "numpy", "scipy", "matplotlib", "pytest", "pytest-timeout", "nvidia-ml-py",
    "setuptools", "cupy-cuda13x", "cupy-cuda12x", "legate", "pytorch-lightning",
    "torchmetrics", "lightning-utilities", "tqdm", "torch-levenberg-marquardt", "torchimize",
):
    try:
        print(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name} not installed")
import torch

print("torch.cuda.is_available()", torch.cuda.is_available(), "CUDA", torch.version.cuda)
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i}", torch.cuda.get_device_name(i))
PY

# -- install ------------------------------------------------------------------------------------
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
shopt -u nullglob
if ((${#wheels[@]} == 0)); then
    log "install: no wheels in $WHEELS: the peer will be missing (run benchmarks/gpu/fetch_wheels.sh here and carry that folder)"
fi
# Built from a copy, so that the build leaves nothing (build/, *.egg-info) in the tree.
TESTING_PLUGIN=()
BUILD="$(mktemp -d "${TMPDIR:-/tmp}/marquardt-build.XXXXXX")"
sources=()
# marquardt-testing: the suites' helpers and pytest plugin (their markers), never published.
for pkg in "${PACKAGES[@]}" testing; do
    cp -r "packages/$pkg" "$BUILD/$pkg"
    # A build/ left by an earlier local build would put its stale modules (a file since
    # moved or deleted) into the wheel beside the current ones.
    rm -rf "$BUILD/$pkg/build" "$BUILD/$pkg"/src/*.egg-info
    sources+=("$BUILD/$pkg")
done
run_part install 120 "$PYTHON" -m pip install --no-index --no-deps --no-build-isolation \
    --no-compile --no-cache-dir --upgrade --target "$SITE" "${sources[@]}" "${wheels[@]}"
if wanted install && ((LAST_RC != 0)); then
    # The sources themselves, where no wheel could be built (PEP 420 namespace: the four
    # src folders on the path make one `marquardt` package); the carried wheels go alone.
    log "install: falling back to the packages' src folders on PYTHONPATH"
    run_part install-wheels 120 "$PYTHON" -m pip install --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
    for pkg in "${PACKAGES[@]}" testing; do
        PYTHONPATH="$PWD/packages/$pkg/src${PYTHONPATH:+:$PYTHONPATH}"
    done
    # Not installed, its pytest plugin has no entry point: name it on every pytest command.
    TESTING_PLUGIN=(-p marquardt.testing.plugin)
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# -- the planner ----------------------------------------------------------------------------------
run_part devices 60 "$PYTHON" -m marquardt.devices
run_part devices-processes 60 "$PYTHON" -m marquardt.devices --processes
run_part devices-plan 60 "$PYTHON" -m marquardt.devices --params 49921 --batch 10000

# -- the gpu-marked tests, one pytest per package (each has its own pytest settings) -------------
# -p no:benchmark: pytest-benchmark, where installed, warns under xdist, and our warnings are errors.
pytest_args=(-p no:cacheprovider -p no:benchmark -ra "${TESTING_PLUGIN[@]}")
if "$PYTHON" -c "import pytest_timeout" >/dev/null 2>&1; then
    pytest_args+=(--timeout 120)
fi
legate_marker="not legate"
if timeout 60 "$PYTHON" -c "import legate" >/dev/null 2>&1; then
    legate_marker=""
elif wanted tests || wanted gpu-tests; then
    # Legate and cuPyNumeric are not installed here: their tests cannot run.
    log "tests: Legate is not installed here, so legate-marked tests are deselected"
fi
gpu_marker="gpu${legate_marker:+ and $legate_marker}"
for pkg in "${PACKAGES[@]}"; do
    run_part "gpu-tests-$pkg" "$GPU_TEST_CAP" "$PYTHON" -m pytest "packages/$pkg/tests" \
        "${pytest_args[@]}" -m "$gpu_marker" --junitxml "$WORK/gpu-tests-$pkg.xml" \
        "${EXTRA_PYTEST[@]}"
done
run_part integration 120 "$PYTHON" -m pytest integration_tests/test_gpu.py "${pytest_args[@]}" \
    -m "$gpu_marker" --junitxml "$WORK/integration.xml" "${EXTRA_PYTEST[@]}"

# -- the benchmarks ---------------------------------------------------------------------------
source_args=()
if [[ -n "$SOURCE" ]]; then
    source_args=(--source "$SOURCE")
fi
# Each part writes benchmarks/results/<name>-gpu* and RESULTS-gpu.md (-quick in the names for
# a quick run); the files written in this run (newer than the stamp) are copied to $WORK.
touch "$WORK/bench.stamp"
for part in $BENCH_PARTS; do
    IFS=: read -r name limit budget <<<"$part"
    budget_args=()
    if [[ -n "$budget" ]]; then
        budget_args=(--budget "$budget")
    fi
    run_part "bench-$name" "$limit" "$PYTHON" benchmarks/run_all.py "$name" --device cuda:0 \
        "${budget_args[@]}" "${source_args[@]}" "${EXTRA_BENCH[@]}"
    find benchmarks -maxdepth 2 -newer "$WORK/bench.stamp" -type f \
        \( -name 'RESULTS*.md' -o -name '*.json' -o -name '*.png' \) -exec cp {} "$WORK/" \;
    bundle
done

# -- the other tests -----------------------------------------------------------------------------
spread=()
if ((XDIST > 0)) && "$PYTHON" -c "import xdist" >/dev/null 2>&1; then
    spread=(-n "$XDIST" --dist loadfile)
fi
other_marker="not gpu${legate_marker:+ and $legate_marker}"
for pkg in "${PACKAGES[@]}"; do
    run_part "tests-$pkg" "$TEST_CAP" "$PYTHON" -m pytest "packages/$pkg/tests" \
        "${pytest_args[@]}" "${spread[@]}" -m "$other_marker" --junitxml "$WORK/tests-$pkg.xml" \
        "${EXTRA_PYTEST[@]}"
done

# The tests' counts, from their JUnit XML.
"$PYTHON" - "$WORK" <<'PY' | tee -a "$SUMMARY"
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("*.xml")):
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as error:
        print(f"counts {path.stem}: unreadable JUnit XML ({error})")
        continue
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    print(f"counts {path.stem}: {passed} passed, {n['failures']} failed, {n['errors']} errors, "
          f"{n['skipped']} skipped")
PY
log "run_on_gpu: done after ${SECONDS} s"
bundle
for out in "$WORK"/bench-*.txt; do
    [[ -f "$out" ]] || continue
    echo "--- $(basename "$out" .txt) (last lines) ---"
    tail -n 12 "$out"
done
echo "--- summary ---"
cat "$SUMMARY"
