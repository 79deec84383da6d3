#!/usr/bin/env bash
# Everything kstrata checks on an NVIDIA GPU, in one run; results under OUT (default: gpu-results/).
#
#   tools/gpu_check.sh [OUT] [STEP ...]      steps: tests planted passes (default: all three)
#
#   tests    the GPU tests (pytest -m gpu): suite kernels, launching, verify's differential runs and
#            compute-sanitizer, run-passes --measure, planted bugs the GPU must catch, eval, torch backend
#   planted  the planted-bug suite through kstrata verify on this GPU (dated results file)
#   passes   tools/gpu_pass_bench.py: a torch.compile'd program and suite kernels recorded, run-passes with
#            several pipelines, per-kernel timing, overrides re-run (dated results file)
#
# Each step's log is kept in OUT; the script goes on after a failing step and exits non-zero at the end.
set -u
OUT=${1:-gpu-results}
shift || true
STEPS=${*:-tests planted passes}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
status=0
for step in $STEPS; do
  start=$(date +%s)
  case $step in
    # serially: tests that time kernels or measure the roofline read wrong figures when others share the GPU
    tests) $PY -m pytest -q -p no:benchmark -p no:cacheprovider -m gpu testsuite/tests >"$OUT/tests.log" 2>&1 ;;
    planted) $PY -m kstrata.testsuite.planted.run --device cuda --jobs 4 --results "$OUT" >"$OUT/planted.log" 2>&1 ;;
    passes) $PY -m kstrata.tools.gpu_pass_bench --work /tmp/kstrata-gpb --results "$OUT" --jobs 12 >"$OUT/passes.log" 2>&1 ;;
    *) echo "unknown step $step (tests, planted, passes)"; status=2; continue ;;
  esac
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $step: exit $rc in $(( $(date +%s) - start )) s"
  tail -n 6 "$OUT/$step.log"
done
exit $status
