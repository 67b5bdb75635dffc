#!/usr/bin/env bash
# The GPU check, in two halves.
#   scripts/gpu-check.sh build    here: release build into dist/ (the pinned nvcc 13.0 compiles the
#                                 kernels to PTX), stripped so dist/ fits the 64 MiB carry.
#   scripts/gpu-check.sh device   on the GPU machine (device tool, carry dist): the plugin listing,
#                                 then every op of each runnable CUDA bundle against cpu-scalar on
#                                 fresh random inputs (outputs poisoned before each run).
# Full logs go to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  build)
    cargo xtask dist
    strip --strip-debug dist/bloomery dist/plugins/*.so
    du -sh dist
    ;;
  device)
    out=${OUT:-/tmp}
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
    dist/bloomery --plugin-dir dist/plugins plugins | tee "$out/plugins.txt"
    status=0
    for b in cuda-sm90 cuda-sm86; do
      for seed in 1 2; do
        dist/bloomery --plugin-dir dist/plugins opcheck --plugin "$b" --seed "$seed" | tee "$out/opcheck-$b-$seed.txt" || status=1
      done
    done
    exit $status
    ;;
  *)
    echo "usage: scripts/gpu-check.sh build|device" >&2
    exit 2
    ;;
esac
