#!/usr/bin/env bash
# The GPU check, in two halves.
#   scripts/gpu-check.sh build    here: release build into dist/ (the pinned nvcc 13.0 compiles the
#                                 kernels to PTX), stripped so dist/ fits the 64 MiB carry.
#   scripts/gpu-check.sh device   on the GPU machine (device tool, carry dist): the plugin listing,
#                                 then every op of each runnable CUDA bundle against cpu-scalar on
#                                 fresh random inputs (outputs poisoned before each run), and tiny
#                                 qwen3moe files (F32, Q8_0, Q6_K and Q5_K weights) end to end, GPU
#                                 against CPU.
#   scripts/gpu-check.sh bench    on the GPU machine: writes the Qwen3-30B-A3B-shaped file (experts
#                                 Q4_K, attention/embeddings/output Q8_0) to /dev/shm and runs
#                                 `bloomery bench -p 512 -n 128 -ngl 99` on it, with device graphs
#                                 and without, then a per-op profile of one eager pass.
#   scripts/gpu-check.sh serve    on the GPU machine: `bloomery serve -ngl 99 -np 4` on that file
#                                 with scripts/prompt_cache_bench.py (a restored prefix gives the
#                                 slot-held tokens; time to first token), then
#                                 scripts/server_bench.py (tok/s for 1/2/4 streams, all on the card
#                                 and with every expert on the host).
#   scripts/gpu-check.sh tier     on the GPU machine: routed experts split between card and host
#                                 (greedy text against the CPU, plan and bench under budgets).
#   scripts/gpu-check.sh disk     on the GPU machine: the disk tier (host budget below the host
#                                 experts) reading ahead 0, 2, 4 or 8 guesses a row
#                                 (--disk-prefetch): greedy text against the unlimited run, then
#                                 sampled decode of the 30B-A3B file from /dev/shm (page cache: a
#                                 fast drive) and from the machine's disk (/tmp, caches dropped),
#                                 tok/s, reads and peak RSS.
#   scripts/gpu-check.sh hybrid   on the GPU machine: the Qwen3.5 hybrids' ops and tiny files
#                                 against the CPU (opcheck), greedy text on CPU, card and split.
#   scripts/gpu-check.sh host-experts  on the GPU machine: speed with routed experts on the host's
#                                 CPU (-cmoe, -ncmoe 36) on the 30B-A3B file and -cmoe on the
#                                 35B-A3B hybrid, a streamed prompt against the card bit for bit,
#                                 and where a -cmoe decode step spends its time.
#                                 PREV=dir (an earlier dist) alternates the benches with it.
#   scripts/gpu-check.sh hybrid-bench  on the GPU machine: the Qwen3.6-35B-A3B-shaped file's speed
#                                 on the card and with every expert on the host (llama-bench side
#                                 by side when LLAMA_BENCH names one), and a per-op profile.
#   scripts/gpu-check.sh hybrid-ab  on the GPU machine: opcheck, the tiny hybrids with Q8_0 weights,
#                                 the fused GDN step's launches and the 35B-A3B decode kernels
#                                 (ncu), greedy text, and the 35B-A3B's decode on the card and with
#                                 every expert on the host, alternating with PREV.
#   scripts/gpu-check.sh bus-share  on the GPU machine: host experts partly computed by the card
#                                 reading them in place over PCIe (--bus-experts): greedy text
#                                 against the CPU, -cmoe / -ncmoe 36 decode at several shares.
#   scripts/gpu-check.sh decode-ab  on the GPU machine: opcheck of every op and tiny files, greedy
#                                 text, ncu per decode layer, and tg/pp of the 30B-A3B and 35B-A3B
#                                 files alternating with PREV (plugins-only dist).
#   scripts/gpu-check.sh prompt-ab  on the GPU machine: opcheck, greedy text of a longer prompt, ncu
#                                 of a 512-row prompt pass, pp512/tg128 of both files and pp4096,
#                                 alternating with PREV.
#   scripts/gpu-check.sh long-decode  on the GPU machine: opcheck, then decode after 1,024, 4,096 and
#                                 16,384 tokens (bench -d) and pp512/tg128 of the 30B-A3B file, with
#                                 PREV.
#   scripts/gpu-check.sh streams  on the GPU machine: opcheck, the few-column products timed side by
#                                 side (dist/cols_bench, from `cols-bench-build` here), tg64 of 1,
#                                 2 and 4 sequences and the server's 1/2/4 streams, with PREV.
#   scripts/gpu-check.sh host-share  on the GPU machine: the CPU's read rate, host-to-card copies and
#                                 a card kernel reading page-locked memory in place, alone and at
#                                 once (dist/host_share_bench, from `cols-bench-build`).
#   scripts/gpu-check.sh serve-step  on the GPU machine: one stream's decode through `serve -ngl 99`
#                                 (forward time from /metrics against the whole step from the
#                                 request's timings) at -c 1024 and 8192, beside bench's tg128.
#   scripts/gpu-check.sh profile-layer  on the GPU machine: all of Nsight Compute's explaining sections
#                                 for the kernels of about one eager decode layer (30B-A3B file).
#   scripts/gpu-check.sh profile-prompt  on the GPU machine: per-kernel times of one 512-row prompt
#                                 pass (30B-A3B) and the explaining ncu sections of its largest kernels.
#   scripts/gpu-check.sh profile  on the GPU machine: per-kernel times (ncu) of decode and prompt
#                                 layers on the 30B-A3B file, and the graph-mode bench.
#   scripts/gpu-check.sh card-memory  on the GPU machine: the card memory nvidia-smi shows in use
#                                 (peak, sampled every 100 ms) and pp512/tg64 of the 30B-A3B file
#                                 under each of PLACEMENTS (bloomery flags, ';'-separated; default
#                                 --gpu-budget 5.8G and 6.3G), ROUNDS times (default 3), alternating
#                                 with llama-bench LLAMA_ARGS (default -ncmoe 36) when LLAMA_BENCH
#                                 names one (placements at equal memory).
#   scripts/gpu-check.sh host-equal  on the GPU machine: every expert on the host (-cmoe) with one
#                                 staging set filled in halves: greedy text of the tiny files against
#                                 the CPU and two sets, the 30B-A3B file's plans under BUDGETS
#                                 (default 1950M: one set, 2300M: two) and its greedy text in both
#                                 forms (the same tokens).
#   scripts/gpu-check.sh decode-staging  on the GPU machine: the staging sets lent to decode
#                                 (default) against --no-decode-staging: greedy text of the tiny
#                                 files and of the 30B-A3B file (a lent layer gives the tokens of
#                                 the same layer placed on the card), the plan, pp512, then tg64
#                                 under --gpu-budget 5.8G alternating ROUNDS times (default 8) with
#                                 llama-bench -ncmoe 36 when LLAMA_BENCH names one, and -cmoe.
# Full logs go to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."

# The benchmark files in /dev/shm, written on first use (the synth time to stderr); each prints
# its path. 30B: the Qwen3-30B-A3B shape, experts Q4_K and attention/embeddings/output Q8_0.
# 35B: the Qwen3.6-35B-A3B hybrid, experts Q4_K and the rest Q8_0.
file_30b() {
  local f=/dev/shm/q3-30b-a3b-q4k.gguf
  [ -f "$f" ] || /usr/bin/time -f "synth: %e s" dist/bloomery --plugin-dir dist/plugins synth \
    --arch qwen3moe --preset 30b-a3b --experts Q4_K --attn Q8_0 --embd Q8_0 --output-type Q8_0 \
    -o "$f" > /dev/null
  echo "$f"
}
file_35b() {
  local f=/dev/shm/q36-35b-a3b-q4k.gguf
  [ -f "$f" ] || /usr/bin/time -f "synth: %e s" dist/bloomery --plugin-dir dist/plugins synth \
    --arch qwen35moe --preset 35b-a3b --experts Q4_K --attn Q8_0 --embd Q8_0 --output-type Q8_0 \
    --dense Q8_0 -o "$f" > /dev/null
  echo "$f"
}
# The tiny files of the checks in /dev/shm/bloomery-gpu-check (f32: qwen3moe, q4k: qwen3moe with
# Q4_K experts and Q8_0 elsewhere, hf: qwen35moe, d: qwen35); prints the folder.
tiny_files() {
  local m=/dev/shm/bloomery-gpu-check b="dist/bloomery --plugin-dir dist/plugins"
  mkdir -p "$m"
  $b synth --arch qwen3moe --preset tiny --seed 7 -o "$m/f32.gguf" > /dev/null
  $b synth --arch qwen3moe --preset tiny --seed 7 --experts Q4_K --attn Q8_0 --embd Q8_0 \
    --output-type Q8_0 -o "$m/q4k.gguf" > /dev/null
  $b synth --arch qwen35moe --preset tiny --seed 7 -o "$m/hf.gguf" > /dev/null
  $b synth --arch qwen35 --preset tiny --seed 7 -o "$m/d.gguf" > /dev/null
  echo "$m"
}
# Every op of cuda-sm90 and the tiny f32, hf and d files against the CPU (seed 1; full log in
# $OUT/opcheck.txt), printing failures, the summary and the lines matching $1.
opcheck_tiny() {
  local m
  m=$(tiny_files)
  dist/bloomery --plugin-dir dist/plugins opcheck --plugin cuda-sm90 --seed 1 --model "$m/f32.gguf" \
    --model "$m/hf.gguf" --model "$m/d.gguf" 2>&1 | tee "${OUT:-/tmp}/opcheck.txt" \
    | grep -E "FAIL|cases|rror${1:+|$1}" || true
}
# The tiny Q4_K file (Q8_0 attention, Q4_K experts: the quantized single-row, few-column and
# tiled products, two-row decode steps) against the CPU with the plugins in $1 (default dist/plugins;
# seed 3, quantized activations' tolerance 1e-1; full log in $OUT/opcheck-q4k-<dir>.txt), printing
# failures, the summary and the prompt and decode-step-2 errors. tiny_files must have run.
opcheck_q4k() {
  local d=${1:-dist/plugins}
  dist/bloomery --plugin-dir "$d" opcheck --plugin cuda-sm90 --seed 3 \
    --model /dev/shm/bloomery-gpu-check/q4k.gguf --model-tol 1e-1 2>&1 \
    | tee "${OUT:-/tmp}/opcheck-q4k-$(basename "$(dirname "$d")").txt" \
    | grep -E "FAIL|model .*(prompt|decode step 2 )|cases|rror" | grep -v "bit for bit" || true
}
# The md5 of 24 greedy tokens after the prompt $2 from each tiny file named in $1 (space-separated
# names in tiny_files' folder, which must have run), under each flag set that follows.
greedy_md5() {
  local files=$1 text=$2 f flags
  shift 2
  for f in $files; do
    for flags in "$@"; do
      # shellcheck disable=SC2086
      echo "greedy $f $flags: $(dist/bloomery --plugin-dir dist/plugins run \
        -m "/dev/shm/bloomery-gpu-check/$f.gguf" -p "$text" -n 24 --temp 0 $flags 2> /dev/null | md5sum)"
    done
  done
}
# Waits until the server on port $1 (process $2, log $3) answers /health; if it exits first,
# prints its log and fails.
wait_ready() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" > /dev/null && return 0
    kill -0 "$2" 2>/dev/null || { cat "$3"; exit 1; }
    sleep 0.5
  done
  echo "the server on port $1 was not ready after 300 s" >&2
  exit 1
}
# pp512/tg128 of each file given, two rounds, each round this build after the PREV builds
# (plugins-only dists run under this build's host).
ab_benches() {
  local file round d
  for file in "$@"; do
    for round in 1 2; do
      for d in ${PREV:-} dist; do
        echo "== $(basename "$file") $d $round: $(dist/bloomery --plugin-dir "$d/plugins" bench -m "$file" \
          -p 512 -n 128 -r 3 -ngl 99 2>&1 | tail -2 | awk -F'|' '{printf "%s %s  ", $7, $8}')"
      done
    done
  done
}
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
    models=/dev/shm/bloomery-gpu-check
    mkdir -p "$models"
    b=dist/bloomery
    $b --plugin-dir dist/plugins synth --arch qwen3moe --preset tiny --seed 7 -o "$models/tiny-f32.gguf" >/dev/null
    $b --plugin-dir dist/plugins synth --arch qwen3moe --preset tiny --seed 7 --experts Q8_0 --attn Q8_0 \
      --embd Q8_0 --output-type Q8_0 -o "$models/tiny-q8_0.gguf" >/dev/null
    # K-quant experts, as in Q4_K_M files (down projections in Q6_K) and beyond.
    $b --plugin-dir dist/plugins synth --arch qwen3moe --preset tiny --seed 7 --experts Q6_K --attn Q5_K \
      --embd Q6_K --output-type Q6_K -o "$models/tiny-q6_k.gguf" >/dev/null
    $b --plugin-dir dist/plugins synth --arch qwen3moe --preset tiny --seed 7 --experts Q5_K --attn Q6_K \
      --embd Q5_K --output-type Q5_K -o "$models/tiny-q5_k.gguf" >/dev/null
    status=0
    for bundle in cuda-sm90 cuda-sm86; do
      for seed in 1 2; do
        $b --plugin-dir dist/plugins opcheck --plugin "$bundle" --seed "$seed" \
          --model "$models/tiny-f32.gguf" | tee "$out/opcheck-$bundle-$seed.txt" || status=1
      done
      # Quantized activations turn summation-order differences into rounding flips: the two CPU
      # plugins differ by up to 1e-2 on this file. With an F16 cache the card's and the CPU's
      # rounding of K/V to f16 adds about 1e-2 a pass (the F32 cache's decode steps agree to 1e-7),
      # and one pass (a decode row beside a prompt) reaches 4.06e-2: the same figure from every
      # build back to 6cb104e (2026-12-02), so this file's, not a kernel's. Band 5e-2; the op cases
      # above hold each kernel to cpu-scalar.
      $b --plugin-dir dist/plugins opcheck --plugin "$bundle" --model "$models/tiny-q8_0.gguf" \
        --model-tol 5e-2 | grep -E "model|cases" | tee "$out/model-q8_0-$bundle.txt" || status=1
      # K-quant products take Q8_K activations on the CPU and Q8_1 on the card (as llama.cpp's
      # two backends do), about 1e-2 apart per product (opcheck's MatMul/MoeExperts cases). These
      # random files amplify that: the Q5_K one sits at 9.5e-2 for its prompt and 1.14e-1 /
      # 1.18e-1 (F32 / F16 cache) at its third decode step, the same figures from every build back
      # to 6cb104e. Band 1.5e-1: it catches gross errors (a wrong scale or block gives ~1), the op
      # cases the fine ones.
      $b --plugin-dir dist/plugins opcheck --plugin "$bundle" --model "$models/tiny-q6_k.gguf" \
        --model "$models/tiny-q5_k.gguf" --model-tol 1.5e-1 | grep -E "model|cases" \
        | tee "$out/model-kquant-$bundle.txt" || status=1
    done
    # The dp4a form of the tiled products (BLOOMERY_CUDA_MMQ=dp4a) against the same references.
    BLOOMERY_CUDA_MMQ=dp4a $b --plugin-dir dist/plugins opcheck --plugin cuda-sm90 --seed 3 \
      | tee "$out/opcheck-dp4a.txt" | grep -E "FAIL|cases" || status=1
    exit $status
    ;;
  bench)
    out=${OUT:-/tmp}
    f=$(file_30b)
    b="dist/bloomery --plugin-dir dist/plugins"
    $b bench -m "$f" -p 512 -n 128 -r 3 -ngl 99 | tee "$out/bench-30b.txt"
    echo "op by op (no device graphs):"
    $b bench -m "$f" -p 512 -n 128 -r 3 -ngl 99 --no-graphs | tail -2 | tee -a "$out/bench-30b.txt"
    echo "batched products on dp4a instead of the int8 tensor cores:"
    BLOOMERY_CUDA_MMQ=dp4a $b bench -m "$f" -p 512 -n 0 -r 3 -ngl 99 | tail -1 | tee -a "$out/bench-30b.txt"
    echo "batched products untiled (one warp per row and column):"
    BLOOMERY_CUDA_MMQ=off $b bench -m "$f" -p 512 -n 0 -r 3 -ngl 99 | tail -1 | tee -a "$out/bench-30b.txt"
    # Per-op event timing of one eager pp512 and tg32 (BLOOMERY_CUDA_PROFILE).
    BLOOMERY_CUDA_PROFILE=1 $b bench -m "$f" -p 512 -n 32 -r 1 -ngl 99 --no-graphs 2>&1 \
      | tee "$out/profile-30b.txt" | sed -n '/per-op profile/,$p' | head -40
    ;;
  serve)
    # llama-server's API on the 30B-A3B file, wholly on the card with 4 slots: the prompt cache
    # (a restored 4,000-token prefix gives the same tokens as one the slot held; time to first
    # token restored vs not cached), then total tok/s for 1, 2 and 4 concurrent streams.
    out=${OUT:-/tmp}
    f=$(file_30b)
    port=18093
    dist/bloomery --plugin-dir dist/plugins serve -m "$f" -ngl 99 -np 4 -c 32768 --metrics \
      --port $port > "$out/serve-30b.log" 2>&1 &
    server=$!
    trap 'kill $server 2>/dev/null || true' EXIT
    wait_ready $port $server "$out/serve-30b.log"
    python3 scripts/prompt_cache_bench.py --url "http://127.0.0.1:$port" --slots 4 --vocab 151000 \
      --prefix 4000 | tee "$out/serve-30b.txt"
    curl -s "http://127.0.0.1:$port/metrics" | grep -E "prompt_cache|n_busy" | grep -v "^#"
    kill $server
    for place in "" "-cmoe"; do
      echo "streams, -ngl 99 $place:" | tee -a "$out/serve-30b.txt"
      python3 scripts/server_bench.py -n 128 --streams 1,2,4 --ctx 8192 --server-args="-ngl 99 $place" \
        "$f" | tee -a "$out/serve-30b.txt"
    done
    ;;
  tier)
    # Routed experts split between the card and the host's CPU: greedy text of a tiny file all
    # on the CPU, all on the card and split; then the 30B-A3B file's plan under a 6.3 GB card and
    # its speed with every expert on the host (-cmoe), -ncmoe 36 and a 6.3 GB card budget.
    out=${OUT:-/tmp}
    b="dist/bloomery --plugin-dir dist/plugins"
    models=/dev/shm/bloomery-gpu-check
    mkdir -p "$models"
    $b synth --arch qwen3moe --preset tiny --seed 7 -o "$models/tiny-f32.gguf" > /dev/null
    for flags in "-ngl 0" "-ngl 99" "-ngl 99 -ncmoe 2" "-ngl 99 -cmoe"; do
      # shellcheck disable=SC2086
      text=$($b run -m "$models/tiny-f32.gguf" -p "hello world" -n 24 --temp 0 $flags 2>/dev/null)
      echo "greedy, $flags: $text" | tee -a "$out/tier.txt"
    done
    f=$(file_30b)
    $b plan -m "$f" --gpu-budget 6.3G | tee -a "$out/tier.txt" | head -12
    for flags in "-cmoe" "-ncmoe 36" "--gpu-budget 6.3G"; do
      echo "bench -ngl 99 $flags:" | tee -a "$out/tier.txt"
      # shellcheck disable=SC2086
      $b bench -m "$f" -p 512 -n 64 -r 2 -ngl 99 $flags 2>&1 | tail -2 | tee -a "$out/tier.txt"
    done
    echo "a 6.3 GB card with residency off, then on (routed calls on the card, experts moved):" \
      | tee -a "$out/tier.txt"
    for flags in "--no-residency" ""; do
      # shellcheck disable=SC2086
      $b bench -m "$f" -p 0 -n 64 -r 2 -ngl 99 --gpu-budget 6.3G $flags 2>&1 | grep -E "routed|tg64" \
        | tee -a "$out/tier.txt"
    done
    port=18094
    $b serve -m "$f" -ngl 99 --gpu-budget 6.3G --metrics --port $port > "$out/serve-tier.log" 2>&1 &
    server=$!
    trap 'kill $server 2>/dev/null || true' EXIT
    wait_ready $port $server "$out/serve-tier.log"
    curl -s "http://127.0.0.1:$port/completion" -d '{"prompt": "one two three", "n_predict": 32}' > /dev/null
    curl -s "http://127.0.0.1:$port/metrics" | grep -E "routed_experts|residency_flips" | grep -v "^#" \
      | tee -a "$out/tier.txt"
    echo "POST /residency/reset: $(curl -s -X POST "http://127.0.0.1:$port/residency/reset")" \
      | tee -a "$out/tier.txt"
    kill $server
    echo "host RAM for 4 GB of the 11.7 GB of host experts (the disk tier), peak RSS in KiB:" \
      | tee -a "$out/tier.txt"
    /usr/bin/time -f "peak RSS %M KiB" $b bench -m "$f" -p 0 -n 32 -r 1 -ngl 99 -cmoe \
      --host-budget 4G 2>&1 | grep -E "tg32|peak RSS" | tee -a "$out/tier.txt"
    echo "where a decode step with every expert on the host spends its time:" | tee -a "$out/tier.txt"
    BLOOMERY_TIER_PROFILE=1 $b bench -m "$f" -p 0 -n 64 -r 1 -ngl 99 -cmoe 2>&1 \
      | grep -E "host-expert|tg64" | tee -a "$out/tier.txt"
    ;;
  card-memory)
    out=${OUT:-/tmp}
    f=$(file_30b)
    base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    # Runs "$@" while sampling the card's used memory; prints its pp/tg lines and the peak.
    peak() {
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$out/smi.txt" &
      local s=$!
      "$@" 2>&1 | tee -a "$out/card-memory.log" | grep -E "pp512|tg64|rror" \
        | awk -F'|' '{printf "%s %s; ", $(NF-2), $(NF-1)}'
      kill $s
      wait $s 2> /dev/null || true
      echo " peak $(($(sort -n "$out/smi.txt" | tail -1) - base)) MiB above idle"
    }
    IFS=';' read -r -a placements <<< "${PLACEMENTS:---gpu-budget 5.8G;--gpu-budget 6.3G}"
    for round in $(seq "${ROUNDS:-3}"); do
      if [ -n "${LLAMA_BENCH:-}" ]; then
        # shellcheck disable=SC2086
        echo "== llama-bench ${LLAMA_ARGS:--ncmoe 36} r$round: $(peak "$LLAMA_BENCH" -m "$f" -p 512 \
          -n 64 -r 3 -ngl 99 -fa 1 -t 16 ${LLAMA_ARGS:--ncmoe 36})" | tee -a "$out/card-memory.txt"
      fi
      for p in "${placements[@]}"; do
        # shellcheck disable=SC2086
        echo "== bloomery $p r$round: $(peak dist/bloomery --plugin-dir dist/plugins \
          bench -m "$f" -p 512 -n 64 -r 3 -ngl 99 $p)" | tee -a "$out/card-memory.txt"
      done
    done
    ;;
  host-equal)
    # Every expert on the host in little card memory: one staging set filled in halves.
    b="dist/bloomery --plugin-dir dist/plugins"
    m=$(tiny_files)
    long="one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen \
sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four"
    # The card budget of the -cmoe plan with one staging set: its total less half the staging.
    one_set() {
      $b plan -m "$1" -cmoe "${@:2}" 2>&1 | awk '
        function bytes(v, u) { return u ~ /GiB/ ? v * 1073741824 : v * 1048576 }
        /^  (dense weights|KV cache|scratch)/ { t += bytes($(NF-1), $NF) }
        /^  expert staging/ { t += bytes($3, $4) / 2 }
        END { printf "%d", t + 262144 }'
    }
    for f in f32 q4k; do
      budget=$(one_set "$m/$f.gguf")
      $b plan -m "$m/$f.gguf" -cmoe --gpu-budget "$budget" 2>&1 | grep staging
      greedy_md5 "$f" "$long" "-ngl 0" "-ngl 99 -cmoe" "-ngl 99 -cmoe --gpu-budget $budget"
    done
    f=$(file_30b)
    budgets=${BUDGETS:-1950M 2300M}
    for budget in $budgets; do
      $b plan -m "$f" -cmoe --gpu-budget "$budget" -c 512 2>&1 | grep -E "^  |budget" | sed -n 1,8p
    done
    for flags in "-cmoe" "-cmoe --gpu-budget ${budgets%% *}" "-ncmoe 46 --no-decode-staging"; do
      # shellcheck disable=SC2086
      echo "greedy 30b $flags: $($b run -m "$f" -c 512 -p "$long" -n 32 --temp 0 -ngl 99 \
        --bus-experts 0 $flags 2> /dev/null | md5sum)"
    done
    ;;
  decode-staging)
    b="dist/bloomery --plugin-dir dist/plugins"
    f=$(file_30b)
    tiny_files > /dev/null
    greedy_md5 "f32 q4k hf" "hello world" "-ngl 0" "-ngl 99 -cmoe" "-ngl 99 -cmoe --no-decode-staging" \
      "-ngl 99 -ncmoe 2" "-ngl 99 -ncmoe 2 --no-decode-staging"
    $b plan -m "$f" --gpu-budget 5.8G 2>&1 | grep -E "staging|blk.3[5-9]"
    # -cmoe lends blk.46 and blk.47: the same tokens as those two layers placed on the card.
    for flags in "-cmoe" "-cmoe --no-decode-staging" "-ncmoe 46 --no-decode-staging" \
      "--gpu-budget 5.8G" "--gpu-budget 5.8G --no-decode-staging"; do
      # shellcheck disable=SC2086
      echo "greedy 30b $flags: $($b run -m "$f" -p "one two three" -n 32 --temp 0 -ngl 99 \
        --bus-experts 0 $flags 2> /dev/null | md5sum)"
    done
    tg() {
      # shellcheck disable=SC2086
      echo "$1: $($b bench -m "$f" -p "$2" -n "$3" -r 3 -ngl 99 $4 2>&1 | grep -E "pp512|tg64" \
        | awk -F'|' '{printf "%s %s; ", $(NF-2), $(NF-1)}')"
    }
    tg "5.8G lent" 512 0 "--gpu-budget 5.8G"
    tg "5.8G not" 512 0 "--gpu-budget 5.8G --no-decode-staging"
    for round in $(seq "${ROUNDS:-8}"); do
      if [ -n "${LLAMA_BENCH:-}" ]; then
        echo "llama-bench -ncmoe 36 r$round: $("$LLAMA_BENCH" -m "$f" -p 0 -n 64 -r 3 -ngl 99 -fa 1 \
          -t 16 -ncmoe 36 2>&1 | grep tg64 | awk -F'|' '{printf "%s %s", $(NF-2), $(NF-1)}')"
      fi
      tg "5.8G lent r$round" 0 64 "--gpu-budget 5.8G"
      tg "5.8G not r$round" 0 64 "--gpu-budget 5.8G --no-decode-staging"
    done
    for round in 1 2; do
      tg "-cmoe lent r$round" 0 64 "-cmoe"
      tg "-cmoe not r$round" 0 64 "-cmoe --no-decode-staging"
    done
    ;;
  disk)
    out=${OUT:-/tmp}
    b="dist/bloomery --plugin-dir dist/plugins"
    m=$(tiny_files)
    status=0
    # The tiny Q4_K file's 4 layers of 8 experts (108 KiB each) in an arena of 9 or 18 slots,
    # with and without reading ahead: the same greedy text as every expert in RAM.
    want=$(greedy_md5 q4k "The disk tier" "-ngl 99 -cmoe --no-residency" | sed 's/.*: //')
    for flags in "--host-budget 1M" "--host-budget 1M --disk-prefetch 2" \
      "--host-budget 2M --disk-prefetch 8"; do
      got=$(greedy_md5 q4k "The disk tier" "-ngl 99 -cmoe --no-residency $flags" | sed 's/.*: //')
      echo "greedy q4k -cmoe $flags: $got (every expert in RAM: $want)" | tee -a "$out/disk.txt"
      [ "$got" = "$want" ] || status=1
    done
    $b run -m "$m/q4k.gguf" -p "The disk tier" -n 24 --temp 0 -ngl 99 -cmoe --no-residency \
      --host-budget 1M --disk-prefetch 2 2>&1 | grep "disk tier" | tee -a "$out/disk.txt"
    f=$(file_30b)
    prompt="The engine reads the experts it needs from the drive while the card computes."
    one() {
      # shellcheck disable=SC2086
      /usr/bin/time -f "peak RSS %M KiB" $b run -m "$1" -p "$prompt" -n "$2" --temp 1 -s 7 -ngl 99 \
        -cmoe --no-residency $3 2>&1 > /dev/null | grep -E "eval time|disk tier|peak RSS" \
        | grep -v prompt | sed "s|^|  |" | tee -a "$out/disk.txt"
    }
    for round in 1 2; do
      for pf in 0 2 4 8; do
        echo "/dev/shm, round $round, --host-budget 4G --disk-prefetch $pf:" | tee -a "$out/disk.txt"
        one "$f" 64 "--host-budget 4G --disk-prefetch $pf"
      done
    done
    echo "every expert in RAM:" | tee -a "$out/disk.txt"
    one "$f" 64 ""
    if [ "${DISK_FILE:-1}" = 1 ]; then
      cp "$f" /tmp/q3-30b-disk.gguf
      for pf in 0 2 8 0 2; do
        sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped)"
        echo "/tmp (the machine's disk), --host-budget 4G --disk-prefetch $pf:" | tee -a "$out/disk.txt"
        one /tmp/q3-30b-disk.gguf 16 "--host-budget 4G --disk-prefetch $pf"
      done
      rm -f /tmp/q3-30b-disk.gguf
    fi
    exit $status
    ;;
  hybrid)
    # The Qwen3.5 hybrids (Gated DeltaNet + gated attention): the recurrent ops against cpu-scalar,
    # the tiny qwen35moe and qwen35 files end to end (GPU against CPU, prompt and step forms).
    out=${OUT:-/tmp}
    b="dist/bloomery --plugin-dir dist/plugins"
    models=/dev/shm/bloomery-gpu-check
    mkdir -p "$models"
    status=0
    for bundle in cuda-sm90 cuda-sm86; do
      $b opcheck --plugin "$bundle" --seed 5 | tee "$out/opcheck-hybrid-$bundle.txt" \
        | grep -E "ConvCausal|DeltaRule|L2Norm|Copy|Unary|Add|Mul|FAIL|cases" || status=1
      for arch in qwen35moe qwen35; do
        $b synth --arch $arch --preset tiny --seed 7 -o "$models/$arch-f32.gguf" > /dev/null
        $b synth --arch $arch --preset tiny --seed 7 --experts Q8_0 --attn Q8_0 --embd Q8_0 \
          --output-type Q8_0 --dense Q8_0 -o "$models/$arch-q8_0.gguf" > /dev/null
        $b opcheck --plugin "$bundle" --model "$models/$arch-f32.gguf" | grep -E "model|FAIL" \
          | tee -a "$out/model-hybrid-$bundle.txt" || status=1
        $b opcheck --plugin "$bundle" --model "$models/$arch-q8_0.gguf" --model-tol 2e-2 \
          | grep -E "model|FAIL" | tee -a "$out/model-hybrid-$bundle.txt" || status=1
      done
    done
    for flags in "-ngl 0" "-ngl 99" "-ngl 99 -cmoe"; do
      # shellcheck disable=SC2086
      text=$($b run -m "$models/qwen35moe-f32.gguf" -p "hello world" -n 24 --temp 0 $flags 2>/dev/null)
      echo "greedy qwen35moe, $flags: $text" | tee -a "$out/hybrid.txt"
    done
    exit $status
    ;;
  hybrid-ab)
    # One call for a change to the hybrids' card path: every op and the tiny files against the
    # CPU (opcheck), the tiny qwen35moe/qwen35 files with Q8_0 weights (the fused GDN step's Q8_1
    # copy for the output product), the fused step's launches counted under ncu (tiny file and
    # 35B-A3B decode) with the per-token kernel times of the 35B-A3B decode, greedy text on CPU,
    # card and -cmoe, then tg128 on the card and tg64 with every expert on the host (35B-A3B),
    # this build alternating with PREV (whole dists: each runs its own binary and plugins).
    # SKIP_CHECK skips opcheck, SKIP_NCU the kernel counts; AB_30B adds the 30B-A3B's card tg128
    # to each round (decode kernels the two files share); ROUNDS sets the rounds (2).
    out=${OUT:-/tmp}
    b="dist/bloomery --plugin-dir dist/plugins"
    m=$(tiny_files)
    h=$(file_35b)
    if [ -z "${SKIP_CHECK:-}" ]; then
      opcheck_tiny
      # name, experts' type, tolerance: Q8_0 everywhere, and Q4_K experts with Q8_0 shared
      # experts (the 35B file's types, for the shared expert inside the routed kernels). The
      # Q4_K file's logits sit up to 2.6e-1 from the CPU's at decode step 2 with the shared
      # expert fused or not (the same figures to three digits, 2026-12-02), so its tolerance
      # catches only gross errors.
      for spec in "qwen35moe q8_0 Q8_0 2e-2" "qwen35 q8_0 Q8_0 2e-2" "qwen35moe q4k Q4_K 3e-1"; do
        set -- $spec
        $b synth --arch $1 --preset tiny --seed 7 --experts $3 --attn Q8_0 --embd Q8_0 \
          --output-type Q8_0 --dense Q8_0 -o "$m/$1-$2.gguf" > /dev/null
        $b opcheck --plugin cuda-sm90 --model "$m/$1-$2.gguf" --model-tol $4 2>&1 \
          | tee "$out/opcheck-$1-$2.txt" | grep -E "FAIL|cases|rror|worst" || true
      done
    fi
    for f in "$m/hf.gguf" "$m/qwen35moe-q8_0.gguf" "$h"; do
      [ -z "${SKIP_NCU:-}" ] || break
      ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip "${NCU_SKIP:-0}" \
        --launch-count 3000 $b bench -m "$f" -p 0 -n 2 -r 1 -ngl 99 --no-graphs \
        > "$out/ncu-$(basename "$f").csv" 2> /dev/null || true
      # Four decode passes under ncu (40 router launches a pass on the 35B file: 160 counted).
      echo "== $(basename "$f") decode kernels (per token: the four passes, so per = 4)"
      python3 scripts/ncu_summary.py "$out/ncu-$(basename "$f").csv" --per 4 > "$out/ncu-$(basename "$f").txt"
      head -n "${NCU_ROWS:-30}" "$out/ncu-$(basename "$f").txt"
    done
    greedy_md5 "hf d qwen35moe-q8_0 qwen35moe-q4k" "hello world" "-ngl 0" "-ngl 99" "-ngl 99 -cmoe"
    # tg128 on the card of dist $1 with file $2.
    tg128() {
      "$1/bloomery" --plugin-dir "$1/plugins" bench -m "$2" -p 0 -n 128 -r 3 -ngl 99 2>&1 \
        | tail -1 | awk -F'|' '{printf "%s", $8}'
    }
    t=""
    [ -z "${AB_30B:-}" ] || t=$(file_30b)
    for round in $(seq "${ROUNDS:-2}"); do
      for d in ${PREV:-} dist; do
        echo "== 35B $d $round: $(tg128 "$d" "$h") \
          -cmoe: $("$d/bloomery" --plugin-dir "$d/plugins" bench -m "$h" -p 0 -n 64 -r 2 -ngl 99 \
          -cmoe --bus-experts 3 2>&1 | grep tg64 | awk -F'|' '{printf "%s", $8}')"
        [ -z "$t" ] || echo "== 30B $d $round: $(tg128 "$d" "$t")"
      done
    done
    ;;
  hybrid-bench)
    # The Qwen3.6-35B-A3B-shaped file (experts Q4_K, the rest Q8_0) all on the card and with every
    # expert on the host. With LLAMA_BENCH naming a llama-bench build that serves qwen35moe, the
    # same file runs through it in the same call.
    out=${OUT:-/tmp}
    b="dist/bloomery --plugin-dir dist/plugins"
    f=$(file_35b)
    for flags in "" "-cmoe"; do
      echo "bench -ngl 99 $flags:" | tee -a "$out/hybrid.txt"
      # shellcheck disable=SC2086
      $b bench -m "$f" -p 512 -n 128 -r 3 -ngl 99 $flags 2>&1 | tail -3 | tee -a "$out/hybrid.txt"
    done
    if [ -n "${LLAMA_BENCH:-}" ]; then
      for flags in "" "-ncmoe 40"; do
        echo "llama-bench -ngl 99 -fa 1 $flags:" | tee -a "$out/hybrid.txt"
        # shellcheck disable=SC2086
        "$LLAMA_BENCH" -m "$f" -p 512 -n 128 -r 3 -ngl 99 -fa 1 -t 16 $flags 2>&1 | grep -E "^\|" \
          | tee -a "$out/hybrid.txt"
      done
    fi
    echo "per-op profile of one eager pass:" | tee -a "$out/hybrid.txt"
    BLOOMERY_CUDA_PROFILE=1 $b bench -m "$f" -p 512 -n 32 -r 1 -ngl 99 --no-graphs 2>&1 \
      | sed -n '/per-op profile/,$p' | head -40 | tee -a "$out/hybrid.txt"
    ;;
  host-experts)
    out=${OUT:-/tmp}
    b="dist/bloomery --plugin-dir dist/plugins"
    f=$(file_30b)
    h=$(file_35b)
    twice=dist once=dist
    [ -n "${PREV:-}" ] && twice="$PREV dist $PREV dist" once="$PREV dist"
    for case in "$f -cmoe" "$f -ncmoe 36" "$h -cmoe"; do
      set -- $case
      runs=$once
      [ "$*" = "$f -cmoe" ] && runs=$twice
      for d in $runs; do
        echo "$d: bench -m $(basename "$1") -ngl 99 ${*:2}" | tee -a "$out/host-experts.txt"
        # shellcheck disable=SC2068
        "$d/bloomery" --plugin-dir "$d/plugins" bench -m "$1" -p 512 -n 64 -r 2 -ngl 99 ${@:2} 2>&1 \
          | tail -2 | tee -a "$out/host-experts.txt"
      done
    done
    echo "a 64-row prompt streamed with every expert on the host against the card (30B-A3B):" \
      | tee -a "$out/host-experts.txt"
    $b opcheck --plugin cuda-sm90 --model "$f" --model-tol 1e-1 2>&1 | grep -E "streamed|^FAIL|cases" \
      | tee -a "$out/host-experts.txt" || true
    echo "where a -cmoe decode step spends its time (30B-A3B):" | tee -a "$out/host-experts.txt"
    BLOOMERY_TIER_PROFILE=1 $b bench -m "$f" -p 0 -n 64 -r 1 -ngl 99 -cmoe 2>&1 \
      | grep -E "host|card|tg64" | tee -a "$out/host-experts.txt"
    ;;
  bus-share)
    # The card's share of decode's host experts read in place over PCIe (issue 6): opcheck of the
    # CUDA bundle (SKIP_CHECK skips it), greedy text of the tiny files on the CPU, the card and
    # -cmoe with no, the default and a full bus share; then tg64 with every expert on the host at
    # --bus-experts 0, 2 and 3 (30B-A3B, two rounds), -ncmoe 36 and the 35B-A3B hybrid at the
    # same shares, each alternating with PREV (whole dist dirs) when given; 4 sequences at 2 and 3;
    # and where a -cmoe step spends its time at 0 and 2.
    b="dist/bloomery --plugin-dir dist/plugins"
    tiny_files > /dev/null
    if [ -z "${SKIP_CHECK:-}" ]; then
      opcheck_tiny
      opcheck_q4k
    fi
    greedy_md5 "f32 q4k hf" "hello world" "-ngl 0" "-ngl 99" "-ngl 99 -cmoe --bus-experts 0" \
      "-ngl 99 -cmoe" "-ngl 99 -cmoe --bus-experts 8"
    f=$(file_30b)
    h=$(file_35b)
    tg() {
      local d=$1
      shift
      # shellcheck disable=SC2068
      echo "== $d $*: $("$d/bloomery" --plugin-dir "$d/plugins" bench -p 0 -n 64 -ngl 99 $@ \
        2>&1 | grep -E "tg64|bus" \
        | sed -E 's/.*\| (tg64[^|]*) \|/\1/; s/routed calls of layers with host experts: //' \
        | tr '\n' ' ')"
    }
    for round in 1 2; do
      for n in 0 2 3; do
        for d in ${PREV:-} dist; do tg $d -r 3 -m "$f" -cmoe --bus-experts $n; done
      done
    done
    for n in 0 2 3; do
      for d in ${PREV:-} dist; do
        tg $d -r 2 -m "$f" -ncmoe 36 --bus-experts $n
        tg $d -r 2 -m "$h" -cmoe --bus-experts $n
      done
    done
    for n in 2 3; do tg dist -r 2 -m "$f" -cmoe -np 4 --bus-experts $n; done
    for n in 0 2; do
      BLOOMERY_TIER_PROFILE=1 $b bench -m "$f" -p 0 -n 64 -r 1 -ngl 99 -cmoe --bus-experts $n 2>&1 \
        | grep -E "host-expert|tg64"
    done
    ;;
  decode-ab)
    # One call for a decode change: every op and the tiny qwen3moe/qwen35moe/qwen35 files against
    # the CPU (opcheck; graph replay against op by op), greedy text on CPU, card and -cmoe, the
    # per-layer kernel times of 30B-A3B decode (ncu), then `bench -p 512 -n 128` of the 30B-A3B
    # file and the 35B-A3B hybrid, this build alternating with PREV (a plugins-only dist).
    out=${OUT:-/tmp}
    b=dist/bloomery
    p="--plugin-dir dist/plugins"
    tiny_files > /dev/null
    opcheck_tiny
    opcheck_q4k
    greedy_md5 "f32 hf" "hello world" "-ngl 0" "-ngl 99" "-ngl 99 -cmoe"
    f=$(file_30b)
    h=$(file_35b)
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 2400 \
      --launch-count 200 $b $p bench -m "$f" -p 0 -n 5 -r 1 -ngl 99 --no-graphs \
      > "$out/ncu-tg.csv" 2> /dev/null || true
    echo "== 30B-A3B decode kernels (per layer = total / 20)"
    python3 scripts/ncu_summary.py "$out/ncu-tg.csv" --per 20
    ab_benches "$f" "$h"
    ;;
  prompt-ab)
    # One call for a prompt-path change: every op and the tiny files against the CPU (opcheck,
    # whose model passes include a 20-row prompt), greedy text of a 30-token prompt on CPU and
    # card, the per-kernel times of a 512-row prompt pass (ncu), then pp512/tg128 of the 30B-A3B
    # and 35B-A3B files and pp4096 of the 30B-A3B file, alternating with PREV (plugins-only dist).
    out=${OUT:-/tmp}
    b=dist/bloomery
    p="--plugin-dir dist/plugins"
    tiny_files > /dev/null
    [ -n "${SKIP_CHECK:-}" ] || opcheck_tiny Attention
    # The tiny file with quantized weights through the tiled products against the CPU (earlier
    # builds too when CHECK_PREV names them).
    for d in ${CHECK_PREV:-} dist; do
      echo "== q4k opcheck $d"
      opcheck_q4k "$d/plugins"
    done
    text="The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire all night"
    greedy_md5 "f32 hf" "$text" "-ngl 0" "-ngl 99"
    f=$(file_30b)
    h=$(file_35b)
    ncu --clock-control none --metrics gpu__time_duration.sum --csv $b $p bench -m "$f" -p 512 -n 0 \
      -r 1 -ngl 99 --no-graphs > "$out/ncu-pp.csv" 2> /dev/null || true
    echo "== 30B-A3B 512-row prompt kernels (two passes; per layer = total / 96)"
    python3 scripts/ncu_summary.py "$out/ncu-pp.csv" --per 96 > "$out/ncu-pp.txt"
    head -14 "$out/ncu-pp.txt"
    ab_benches "$f" "$h"
    for d in ${PREV:-} dist; do
      echo "== pp4096 $d: $($b --plugin-dir "$d/plugins" bench -m "$f" -p 4096 -n 0 -r 1 -ngl 99 \
        2>&1 | tail -1 | awk -F'|' '{printf "%s %s", $7, $8}')"
    done
    ;;
  long-decode)
    # Decode over a long context: every op and the tiny files against the CPU (opcheck; SKIP_CHECK
    # skips it), then decode after 1,024, 4,096 and 16,384 tokens of context (`bench -d`) and pp512/tg128
    # of the 30B-A3B file, alternating with PREV.
    b=dist/bloomery
    [ -n "${SKIP_CHECK:-}" ] || opcheck_tiny "long cache"
    f=$(file_30b)
    for d in ${PREV:-} dist; do
      for p in "-p 0 -n 64 -d 1024" "-p 0 -n 64 -d 4096" "-p 0 -n 64 -d 16384" "-p 512 -n 128"; do
        # shellcheck disable=SC2086
        echo "== $d $p: $($b --plugin-dir "$d/plugins" bench -m "$f" $p -r 2 -ngl 99 2>&1 \
          | grep -E "(pp|tg)[0-9]" | awk -F'|' '{printf "%s %s  ", $7, $8}')"
      done
    done
    ;;
  streams)
    # Several sequences decoded together: every op and the tiny files (the Q4_K file's two-row
    # decode steps too) against the CPU (SKIP_CHECK skips it), the few-column products side by side
    # (kernels/cuda/bench/cols_bench.cu; dist/cols_bench, built here with
    # `scripts/gpu-check.sh cols-bench-build`), then tg64 with 1, 2 and 4 sequences (`bench -np`)
    # and the server's total tok/s for 1, 2 and 4 streams, each alternating with PREV.
    out=${OUT:-/tmp}
    if [ -z "${SKIP_CHECK:-}" ]; then
      opcheck_tiny
      opcheck_q4k
    fi
    [ ! -x dist/cols_bench ] || dist/cols_bench > "$out/cols_bench.txt" \
      || { grep WRONG "$out/cols_bench.txt"; exit 1; }
    [ ! -f "$out/cols_bench.txt" ] || grep -E "m=(2|4) .*(q_cols|pick)" "$out/cols_bench.txt"
    f=$(file_30b)
    if [ -n "${NCU:-}" ]; then
      # Per-kernel times of about 10 eager decode layers with 1 and with 2 sequences.
      for np in 1 2; do
        ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 2400 \
          --launch-count 240 dist/bloomery --plugin-dir dist/plugins bench -m "$f" -p 0 -n 5 -np $np \
          -r 1 -ngl 99 --no-graphs > "$out/ncu-np$np.csv" 2> /dev/null || true
        echo "== decode kernels, $np sequences (per layer = total / 10)"
        python3 scripts/ncu_summary.py "$out/ncu-np$np.csv" --per 10
      done
    fi
    for round in 1 2; do
      # Alternate which build goes first.
      order="${PREV:-} dist"
      [ $round = 1 ] || order="dist ${PREV:-}"
      for d in $order; do
        for np in 1 2 4; do
          echo "== $d round $round -np $np: $(dist/bloomery --plugin-dir "$d/plugins" bench -m "$f" -p 0 \
            -n 64 -np $np -r 2 -ngl 99 2>&1 | grep -E "tg[0-9]" | awk -F'|' '{printf "%s %s", $7, $8}')"
        done
      done
    done
    for d in ${PREV:-} dist; do
      echo "== server streams, $d:"
      python3 scripts/server_bench.py --plugins "$d/plugins" -n 128 --streams 1,2,4 --ctx 8192 \
        --rounds 3 --server-args="-ngl 99" "$f" | tee -a "$out/streams.txt"
    done
    ;;
  cols-bench-build)
    # Here: builds the programs of kernels/cuda/bench (cols_bench.cu, host_share_bench.cu) into
    # dist/ with the pinned nvcc (its static CUDA runtime), for the `streams` and `host-share` modes.
    cu=target/cuda-tools/.venv/lib/python3.11/site-packages/nvidia/cu13
    "$cu/bin/nvcc" -O3 -arch=sm_90 -L"$cu/lib" -o dist/cols_bench kernels/cuda/bench/cols_bench.cu
    "$cu/bin/nvcc" -O3 -arch=sm_90 -Xcompiler -O3,-mavx2 -L"$cu/lib" -o dist/host_share_bench \
      kernels/cuda/bench/host_share_bench.cu
    strip dist/cols_bench dist/host_share_bench
    ;;
  host-share)
    # On the GPU machine: whether the host's memory serves the CPU's reads and page-locked
    # host-to-card copies (or the card's in-place reads of mapped memory) at once
    # (dist/host_share_bench, from `cols-bench-build` here).
    dist/host_share_bench | tee "${OUT:-/tmp}/host-share.txt"
    ;;
  serve-step)
    # Where a served decode step goes beyond bench's: /metrics' predicted time counts forward
    # passes only, the request's timings the whole step (sampling, detokenizing, events).
    f=$(file_30b)
    port=18094
    dist/bloomery --plugin-dir dist/plugins bench -m "$f" -p 0 -n 128 -r 2 -ngl 99 | tail -1
    for ctx in 1024 8192; do
      dist/bloomery --plugin-dir dist/plugins serve -m "$f" -ngl 99 -np 1 -c $ctx --metrics \
        --port $port > "${OUT:-/tmp}/serve-step-$ctx.log" 2>&1 &
      server=$!
      wait_ready $port $server "${OUT:-/tmp}/serve-step-$ctx.log"
      for _ in 1 2; do
        curl -s "http://127.0.0.1:$port/completion" -d '{"prompt":"Once upon a time","n_predict":256,
          "temperature":0,"ignore_eos":true}' | python3 -c "import json,sys; t=json.load(sys.stdin)['timings']
print('-c $ctx step: %.3f ms/token' % t['predicted_per_token_ms'])"
      done
      curl -s "http://127.0.0.1:$port/metrics" | grep -E "predicted_seconds_total|tokens_predicted_total"
      kill $server; wait $server 2>/dev/null || true
    done
    ;;
  profile-layer)
    # Every Nsight Compute section that explains a kernel's time (throughput, occupancy, warp
    # stall reasons, memory traffic, scheduler) for the launches of about one eager decode layer
    # of the 30B-A3B file: NCU_SKIP launches skipped (default 2412), NCU_COUNT taken (default 14).
    out=${OUT:-/tmp}
    f=$(file_30b)
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
      --section ComputeWorkloadAnalysis --launch-skip "${NCU_SKIP:-2412}" --launch-count "${NCU_COUNT:-14}" \
      dist/bloomery --plugin-dir dist/plugins bench -m "$f" -p 0 -n 5 -r 1 -ngl 99 --no-graphs \
      > "$out/ncu-layer.txt" 2> "$out/ncu-layer.err" || true
    grep -E "^  bl_|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" \
      "$out/ncu-layer.txt" | head -120
    ;;
  profile-prompt)
    # Where a 512-row prompt pass of the 30B-A3B file spends its time: every kernel of one eager
    # pass (ncu durations, summed per kernel name; per layer = total / 48), then the explaining
    # sections (throughput, occupancy, stalls) of the largest prompt kernels.
    out=${OUT:-/tmp}
    f=$(file_30b)
    b="dist/bloomery --plugin-dir dist/plugins"
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip "${NCU_SKIP:-0}" \
      --launch-count "${NCU_COUNT:-3000}" $b bench -m "$f" -p 512 -n 0 -r 1 -ngl 99 --no-graphs \
      > "$out/ncu-pp.csv" 2> /dev/null || true
    echo "== 512-row prompt kernels (per layer = total / 48)"
    python3 scripts/ncu_summary.py "$out/ncu-pp.csv" --per 48
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --kernel-name "regex:${NCU_DETAIL:-bl_mmq|bl_attention|bl_moe}" --launch-skip 40 --launch-count 10 \
      $b bench -m "$f" -p 512 -n 0 -r 1 -ngl 99 --no-graphs > "$out/ncu-pp-detail.txt" 2> /dev/null || true
    grep -E "^  bl_|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Waves Per SM|Stall|Warp Cycles Per Issued|Shared Memory Configuration Size|Dynamic Shared" \
      "$out/ncu-pp-detail.txt" | head -160
    ;;
  profile)
    # Per-kernel times (Nsight Compute, clocks left alone) of eager decode layers and a 512-row
    # prompt on the 30B-A3B file, summed per layer by scripts/ncu_summary.py, with throughput and
    # occupancy of the largest decode kernels; then `bench` with device graphs, so the time
    # between kernels is the token time less the kernels' sum. PREV=dir (an earlier dist) is
    # benched too, alternating with this one.
    out=${OUT:-/tmp}
    f=$(file_30b)
    b="dist/bloomery --plugin-dir dist/plugins"
    # Decode: skip the load and the first tokens, then about 10 layers of one token.
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 2400 \
      --launch-count "${NCU_COUNT:-240}" $b bench -m "$f" -p 0 -n 5 -r 1 -ngl 99 --no-graphs \
      > "$out/ncu-tg.csv" 2> /dev/null || true
    echo "== decode kernels (per layer = total / ${NCU_LAYERS:-10})"
    python3 scripts/ncu_summary.py "$out/ncu-tg.csv" --per "${NCU_LAYERS:-10}"
    if [ -n "${NCU_PROMPT:-}" ]; then
      ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 300 \
        --launch-count 120 $b bench -m "$f" -p 512 -n 0 -r 1 -ngl 99 --no-graphs \
        > "$out/ncu-pp.csv" 2> /dev/null || true
      echo "== 512-row prompt kernels (per layer = total / 4)"
      python3 scripts/ncu_summary.py "$out/ncu-pp.csv" --per 4
    fi
    # Throughput and occupancy of the largest decode kernels, two launches each.
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
      --kernel-name "regex:${NCU_DETAIL:-bl_moe_gate_up|bl_moe_down|bl_matmul_q|bl_router}" \
      --launch-skip 400 --launch-count 8 $b bench -m "$f" -p 0 -n 4 -r 1 -ngl 99 --no-graphs \
      > "$out/ncu-detail.txt" 2> /dev/null || true
    grep -E "^  bl_|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Waves Per SM" \
      "$out/ncu-detail.txt" | head -90
    for round in 1 2; do
      for d in ${PREV:-} dist; do
        echo "== $d, round $round"
        # A plugins-only earlier dist runs under this build's host.
        bin="$d/bloomery"
        [ -x "$bin" ] || bin=dist/bloomery
        "$bin" --plugin-dir "$d/plugins" bench -m "$f" -p 512 -n 128 -r 3 -ngl 99 2>&1 | tail -2
      done
    done
    ;;
  *)
    echo "usage: scripts/gpu-check.sh build|device|bench|serve|tier|disk|host-experts|hybrid|hybrid-bench|profile" >&2
    exit 2
    ;;
esac
