#!/usr/bin/env bash
# The GPU check of issue 20 in one run: the `cuda` tests (every kernel
# against its CPU reference) and bench/gpu_bench (the kernels against the
# device copy bandwidth, the end-to-end encode and decode + apply), with
# one table at the end. Under 8 minutes on one H200.
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
    "$build/bench/gpu_bench")
  for b in "${bins[@]}"; do
    [[ -x $b ]] || { echo "gpu_check: $b not built (cmake --build $build --target cuda_kernels_test cuda_ipc_peer gpu_bench)" >&2; exit 2; }
  done
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
  cp "${bins[@]}" "$dir/bin/"
  # Every shared library but the C library and the loader, which the other
  # image has (newer); libcuda comes from that machine's driver.
  ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    xargs -r cp -L -t "$dir/lib/"
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
"$dir/bin/cuda_kernels_test" --gtest_brief=0 2>&1 | tee "$out/cuda_tests.log" |
  grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|^GPU|Failure|error' | head -60
tests_rc=${PIPESTATUS[0]}
tests_s=$((SECONDS - start))
# One line per test with its time; the summary lists them again without.
count() { grep -cE "^\[ *$1 *\] .* \([0-9]+ ms\)$" "$out/cuda_tests.log"; }
passed=$(count OK) failed=$(count FAILED) skipped=$(count SKIPPED)
[[ $tests_rc -eq 0 && $failed -eq 0 ]] || status=1

# compute-sanitizer's memcheck over the small kernel tests, where the
# machine's runtime lets it (it refuses the device under gVisor).
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
    *) sanitize="could not run (rc $rc): $(grep -m1 -iE 'error|not supported' "$out/memcheck.log")" ;;
  esac
  echo "$sanitize"
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
