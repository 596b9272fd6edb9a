#!/usr/bin/env bash
# Builds Cpufit (the CPU half of Gpufit, https://github.com/gpufit/Gpufit) as two shared
# libraries, float and double, from a source checkout, with the system g++ at -O3.
# Gpufit's CMake build asks for CUDA, so the five Cpufit sources are compiled directly.
#
#   benchmarks/cpufit/build_cpufit.sh SOURCE [OUT]
#
# SOURCE: a Gpufit checkout (holding Cpufit/ and Gpufit/); OUT: where the libraries go
# (default /tmp/cpufit-build; never inside this repository). Prints the float library's
# path, for CPUFIT_LIB; the double one lies beside it (libcpufit_double.so).
set -euo pipefail
source_dir=${1:?usage: build_cpufit.sh SOURCE [OUT] (SOURCE: a Gpufit checkout)}
out_dir=${2:-/tmp/cpufit-build}
cxx=${CXX:-g++}
if [[ ! -f "$source_dir/Cpufit/cpufit.h" || ! -f "$source_dir/Gpufit/constants.h" ]]; then
    echo "error: $source_dir holds no Cpufit/cpufit.h and Gpufit/constants.h." \
        "HINT: pass the root of a Gpufit checkout (git clone https://github.com/gpufit/Gpufit)" >&2
    exit 2
fi
repo_root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
case "$out_dir/" in
    "$repo_root"/*)
        echo "error: OUT=$out_dir is inside the repository. HINT: build into /tmp" >&2
        exit 2
        ;;
esac
sources=(cpufit.cpp info.cpp lm_fit.cpp lm_fit_cpp.cpp interface.cpp)
paths=()
for s in "${sources[@]}"; do paths+=("$source_dir/Cpufit/$s"); done
"$cxx" -O3 -std=c++11 -fPIC -shared -o "$out_dir/libcpufit_float.so" "${paths[@]}"
# Gpufit a0bd66c binds a `float&` to a REAL parameter in project_parameters_to_box, which
# does not compile with REAL = double: the double build compiles a copy of that one file
# (in OUT) with that reference typed REAL&, and is otherwise the same sources.
patched="$out_dir/lm_fit_cpp_double.cpp"
sed 's/float& parameter = parameters_\[/REAL\& parameter = parameters_[/' \
    "$source_dir/Cpufit/lm_fit_cpp.cpp" > "$patched"
double_paths=()
for s in "${sources[@]}"; do
    if [[ $s == lm_fit_cpp.cpp ]]; then double_paths+=("$patched"); else double_paths+=("$source_dir/Cpufit/$s"); fi
done
"$cxx" -O3 -std=c++11 -fPIC -shared -DGPUFIT_DOUBLE -I"$source_dir/Cpufit" \
    -o "$out_dir/libcpufit_double.so" "${double_paths[@]}"
echo "$out_dir/libcpufit_float.so"
