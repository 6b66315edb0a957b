#!/usr/bin/env bash
# The GPU check of issue 20 in one run: the `cuda` tests (every kernel
# against its CPU reference, the chunk applier, CUDA IPC into another
# process, a relay keeping a server's exported buffers at each commit, a
# producer whose shards live on the GPU against the host producer),
# memcheck over the small ones, the dcr_cuda Python module built
# here and run with torch CUDA tensors, and bench/gpu_bench (the kernels
# against the device copy bandwidth, the end-to-end encode and decode +
# apply), with one table at the end. About 2 minutes on one H200.
#
# A GPU machine is another image (other libraries, no -dev packages, no
# package registry), so the binaries are built where dcr builds and carried:
#
#   bench/gpu_check.sh --pack DIR   # here: copy the test and benchmark
#                                   # binaries (sm_90 + PTX, CUDA runtime
#                                   # static) and the non-system libraries
#                                   # ldd shows into DIR
#   bench/gpu_check.sh DIR [OUT]    # there: run them; logs and
#                                   # gpu.json go to OUT (default DIR/out)
#
# Exit status: 0 all passed, 1 a test or a comparison failed, 77 no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ ${1:-} == --pack ]]; then
  dir=${2:?usage: bench/gpu_check.sh --pack DIR}
  build=${DCR_BUILD_DIR:-build}
  bins=("$build/tests/cuda/cuda_kernels_test" "$build/tests/cuda/cuda_ipc_peer"
    "$build/tests/cuda/cuda_serving_peer" "$build/bench/gpu_bench")
  compgen -G "$build/python/dcr_cuda.*.so" >/dev/null ||
    { echo "gpu_check: the dcr_cuda Python module is not built (cmake --build $build --target dcr_cuda_python)" >&2; exit 2; }
  for b in "${bins[@]}"; do
    [[ -x $b ]] || { echo "gpu_check: $b not built (cmake --build $build --target cuda_kernels_test cuda_ipc_peer cuda_serving_peer gpu_bench dcr_cuda_python)" >&2; exit 2; }
  done
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
  cp "${bins[@]}" "$dir/bin/"
  # Every shared library but the C library and the loader, which the other
  # image has (newer); libcuda comes from that machine's driver.
  ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    xargs -r cp -L -t "$dir/lib/"
  # The Python module is built there, against that machine's Python and
  # torch: carry its static libraries (debug info stripped) and the shared
  # ones it needs, without the C++ runtime (that machine's compiler brings
  # a newer one).
  mkdir -p "$dir/pylib/so"
  for a in cuda/libdcr_cuda.a src/placement/libdcr_placement.a \
    src/codec/libdcr_codec.a src/format/libdcr_format.a \
    src/common/libdcr_common.a src/common/libdcr_yaml_doc.a; do
    strip --strip-debug -o "$dir/pylib/$(basename "$a")" "$build/$a"
  done
  cp "$(dirname "$(command -v nvcc)")/../lib64/libcudart_static.a" "$dir/pylib/"
  ldd "$build"/python/dcr_cuda.*.so | awk '/=> \// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    xargs -r cp -L -t "$dir/pylib/so/"
  du -sh "$dir"
  exit 0
fi

dir=${1:?usage: bench/gpu_check.sh DIR [OUT] (or --pack DIR)}
out=${2:-$dir/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
  --format=csv 2>&1 | tee "$out/nvidia-smi.txt"

status=0
echo "== cuda tests"
start=$SECONDS
"$dir/bin/cuda_kernels_test" --gtest_brief=0 >"$out/cuda_tests.log" 2>&1
tests_rc=$?
grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|^GPU|Failure|error' \
  "$out/cuda_tests.log" | head -60
tests_s=$((SECONDS - start))
# One line per test with its time; the summary lists them again without.
count() { grep -cE "^\[ *$1 *\] .* \([0-9]+ ms\)$" "$out/cuda_tests.log"; }
passed=$(count OK) failed=$(count FAILED) skipped=$(count SKIPPED)
[[ $tests_rc -eq 0 && $failed -eq 0 ]] || status=1

# compute-sanitizer's memcheck over the small kernel tests, where the
# machine's runtime lets it (it refuses the device under gVisor). Of the
# GPU producer's tests only the one with default pieces (*Refuses*): the
# other launches kernels per 5-element piece, minutes under memcheck.
sanitize="not run"
if [[ ${GPU_CHECK_SANITIZE:-1} == 1 ]] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck"
  timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$dir/bin/cuda_kernels_test" \
    --gtest_filter='*Refuses*:*Outside*:*RoundTrip*:*ChunkApplier*:*Fp8*' >"$out/memcheck.log" 2>&1
  rc=$?
  case $rc in
    0) sanitize="clean" ;;
    9) sanitize="ERRORS (memcheck.log)"; status=1 ;;
    1) sanitize="a test FAILED under memcheck (memcheck.log)"; status=1 ;;
    *) sanitize="could not run (rc $rc): $(grep -m1 -iE 'error|not supported' "$out/memcheck.log")" ;;
  esac
  echo "$sanitize"
fi

# The Python module (dcr_cuda) built here against this machine's Python,
# pybind11 and torch, then tests/cuda/cuda_tensors_test.py with torch CUDA
# tensors. Its own library path: not the carried C++ runtime.
python="not run"
if [[ -d $dir/pylib ]]; then
  echo "== python: dcr_cuda with torch CUDA tensors"
  cxx=$(command -v g++ || command -v c++ || true)
  inc=$(python3 -m pybind11 --includes 2>/dev/null || true)
  ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  pymod=$(mktemp -d)
  if [[ -z $cxx ]]; then
    python="untested: no C++ compiler on this machine"
  elif [[ -z $inc ]]; then
    python="untested: no pybind11 for $(python3 --version 2>&1)"
  elif ! "$cxx" -O2 -shared -fPIC -std=c++20 $inc -Iinclude -Isrc \
      src/python/cuda_module.cc -o "$pymod/dcr_cuda$ext" \
      -Wl,--start-group "$dir"/pylib/*.a -Wl,--end-group "$dir"/pylib/so/*.so* \
      -ldl -lrt -lpthread >"$out/python_build.log" 2>&1; then
    python="FAILED to build (python_build.log)"; status=1
    tail -5 "$out/python_build.log"
  else
    LD_LIBRARY_PATH=$PWD/$dir/pylib/so PYTHONPATH=$pymod \
      python3 tests/cuda/cuda_tensors_test.py "$dir/bin/cuda_ipc_peer" 2>&1 |
      tee "$out/python.log"
    case ${PIPESTATUS[0]} in
      0) python="passed ($(python3 -c 'import torch; print("torch", torch.__version__)'))" ;;
      77) python="skipped: $(tail -1 "$out/python.log")" ;;
      *) python="FAILED (python.log)"; status=1 ;;
    esac
  fi
  echo "$python"
fi

echo "== gpu_bench"
start=$SECONDS
"$dir/bin/gpu_bench" --gib "${GPU_CHECK_GIB:-1}" --reps "${GPU_CHECK_REPS:-5}" \
  --out "$out/gpu.json" 2>&1 | tee "$out/gpu_bench.log"
bench_rc=${PIPESTATUS[0]}
bench_s=$((SECONDS - start))
# No GPU: the tests skipped and the benchmark said so. Not a pass.
if [[ $bench_rc -eq 77 || $skipped -gt 0 ]]; then
  [[ $status -eq 0 ]] && status=77
elif [[ $bench_rc -ne 0 ]]; then
  status=1
fi

echo
echo "== summary"
printf '%-22s %s\n' "cuda tests" \
  "rc $tests_rc: $passed passed, $failed failed, $skipped skipped (${tests_s} s)"
printf '%-22s %s\n' "gpu_bench" "rc $bench_rc (${bench_s} s)"
printf '%-22s %s\n' "memcheck" "$sanitize"
printf '%-22s %s\n' "python (CUDA tensors)" "$python"
if [[ -f $out/gpu.json ]]; then
  python3 - "$out/gpu.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
c = j["copy_gbps"]
print(f"{'GPU':22} {j['gpu']}; copy {c:.0f} GB/s")
print(f"{'density':>8} {'diff x copy':>12} {'apply x copy':>13} {'dense x copy':>13} {'digest x copy':>14}")
for k in j["kernels"]:
    print(f"{k['density']:8.3f} {k['diff_gbps']/c:12.2f} {k['apply_gbps']/c:13.2f} "
          f"{k['dense_apply_gbps']/c:13.2f} {k['digest_gbps']/c:14.2f}")
e = j["e2e"]
print(f"encode e2e: GPU {e['encode_gpu_gbps']:.2f} GB/s vs CPU {e['encode_cpu_gbps']:.2f}, "
      f"chunks identical: {e['chunks_identical']}; decode+apply: GPU "
      f"{e['decode_apply_gpu_gbps']:.2f} vs CPU {e['decode_apply_cpu_gbps']:.2f} GB/s")
f = j.get("fp8_requant")
if f:
    print(f"FP8 requant (all blocks): GPU {f['gpu_gbps']:.0f} GB/s ({f['gpu_gbps']/c:.2f} x copy) vs CPU {f['cpu_gbps']:.2f}; identical: {f['identical']}")
print("decode+apply pipelined (ChunkApplier): " + ", ".join(
    f"{p['threads']} thr {p['gbps']:.2f} GB/s" for p in e["decode_apply_pipelined"]))
PY
fi
exit $status
