#!/usr/bin/env bash
# The GPU check: a few named suites. Each ends with one line: what passed, or (exit status 1) what
# failed. Full logs go to a new folder under /tmp, packed into $OUT/gpu-check-SUITE.tar.gz on the
# way out when OUT is set (the device tool returns at most 8 files from $OUT), tables beside it.
#
#   scripts/gpu-check.sh build    here (no GPU): `cargo xtask dist` (the pinned nvcc compiles the
#                                 kernels), stripped; fails when dist/ outgrows the 64 MiB carry.
#   scripts/gpu-check.sh check    on the GPU machine (carry dist/), about 5 minutes: every op of each
#                                 runnable CUDA bundle against cpu-scalar (GLM-5.3's latent, sparse
#                                 and wide-headed attention, per-head products and hyper-connection
#                                 ops among them) and the tiny model files (GLM-5.3's among them)
#                                 end to end against the CPU (graph replay against op by op, bit
#                                 for bit); greedy text of the tiny files the same on the CPU, the
#                                 card and the tiered placements (-cmoe, one staging set in halves,
#                                 the disk tier); the 30B-A3B file's lent staging sets and halves
#                                 against the same layers placed on the card; the server's prompt
#                                 cache on the card (GLM-5.3's restored to its checkpoints); the
#                                 tiny clef file's /v1/systemone answers with -ngl 99 and the
#                                 decision head on the card and on the CPU against the CPU run
#                                 (probabilities within 1e-4).
#   scripts/gpu-check.sh bench    on the GPU machine: `bloomery bench -p 512 -n 128 -r 3` of the
#                                 30B-A3B and 35B-A3B files under four placements, ROUNDS rounds,
#                                 alternating with the dists in PREV; a table at the end.
#   scripts/gpu-check.sh compare  on the GPU machine: bench's runs beside llama-bench (LLAMA_BENCH,
#                                 required) at llama.cpp's placements, alternating, with each run's
#                                 peak card memory (nvidia-smi every 100 ms).
#   scripts/gpu-check.sh kvdepth  on the GPU machine: decode after 16,384 tokens of context (tg64
#                                 @ d16384) of the 30B-A3B file all on the card under each K/V cache
#                                 type of KV_TYPES, beside llama-bench (LLAMA_BENCH, required) with
#                                 the same -ctk/-ctv, engines alternating by round.
#   scripts/gpu-check.sh serve    on the GPU machine: the server on the 30B-A3B file: the prompt
#                                 cache and time to first token (scripts/prompt_cache_bench.py),
#                                 then total tok/s of 1, 2 and 4 streams (scripts/server_bench.py)
#                                 on the card and with every expert on the host, with PREV.
#   scripts/gpu-check.sh solar2speed  on the GPU machine: `bloomery bench -p 512 -n 64 -d
#                                 512,16384 -r 2` of Solar-Open2 at its real widths, 12 layers (3
#                                 gated GQA + 9 KDA), 320 Q4_K experts a layer, the rest Q8_0
#                                 (about 35 GB, written to /dev/shm on first use), all on the card
#                                 and with every expert on the host; the tables at the end.
#   scripts/gpu-check.sh glm5speed  on the GPU machine: `bloomery bench -p 512 -n 64 -d 512,8192
#                                 -r 2` of GLM-5.3-Flash at its real widths, 12 layers (3 dense;
#                                 MLA at 3, 7, 11, the rest KDA) and NextN, 288 experts a layer
#                                 (gate/up Q4_K, down Q5_K), the rest Q8_0 (about 45 GiB, written
#                                 to /dev/shm on first use), all on the card and with every expert
#                                 on the host; with LLAMA_BENCH, llama-bench on the same file and
#                                 depths, engines alternating by round; the tables at the end.
#   scripts/gpu-check.sh mtpspeed  on the GPU machine: MTP drafting's decode (issue 48):
#                                 `bloomery bench -p 0 -n 128 -r 2 --spec-type none,draft-mtp
#                                 --spec-synth-len LENS` of Qwen3.6-35B-A3B with its MTP block
#                                 (experts Q4_K, the rest Q8_0, about 20 GB in /dev/shm) under each
#                                 placement, then of the glm5 file (NextN, one draft a step) with
#                                 GLM_LENS; drafting off and on at each fixed acceptance length in
#                                 one bench, at each of STREAMS (`-np`); the tables at the end,
#                                 each drafting line with the pass shapes its timed runs prepared
#                                 (0 when the warm-up prepared them all) and the passes that ran
#                                 kept tokens again after refused drafts (0 when verify passes
#                                 keep each row's recurrent state); then the same without
#                                 --spec-synth-len: drafting gated (the default) at the random
#                                 weights' own acceptance, with the gate's switch lines; and
#                                 each placement's prompts (`-p 512,2048 -n 0`) with drafting
#                                 off and on.
#
# Settings (environment):
#   OUT         folder that receives the packed logs and the tables.
#   BUNDLES     check: the kernel plugins checked (default: the runnable GPU ones in `bloomery
#               plugins`; `BUNDLES=cpu-avx2` runs the suite on a machine without a GPU).
#   SKIP_30B    check: leave out the 30B-A3B file's greedy text (its synth takes a while).
#   ONLY        check: a regular expression: only the tiny files and greedy labels it matches
#               (ONLY=glm5 runs GLM-5.3's; the 30B-A3B file is `30b`); op cases run with the
#               opcheck calls whose files remain.
#   FILES       bench, compare, serve: 30b, 35b and/or solar100 (default 30b 35b; serve: 30b).
#   SOLAR_LAYERS  the solar100 file's depth (default 48, the whole model).
#   PLACEMENTS  bench, compare, solar2speed, glm5speed, mtpspeed: bloomery's flags, ';'-separated
#               (default below; solar2speed, glm5speed and mtpspeed: "-ngl 99;-ngl 99 -cmoe").
#   LENS        mtpspeed: --spec-synth-len values for the 35b-mtp file: mean tokens a verify step
#               keeps, the target's own included, as llama-server's (default 1.2,1.7,2.2,2.4,2.8).
#   GLM_LENS    mtpspeed: the same for the glm5 file (default 1.7; "" leaves the glm5 file out).
#   STREAMS     mtpspeed: bench's -np values, space-separated (default 1; issue 48 asks 1 2 4).
#   DEPTHS      solar2speed, glm5speed: bench's (and llama-bench's) -d list (default
#               512,16384; glm5speed 512,8192).
#   LLAMA_PLACEMENTS  compare, glm5speed: llama-bench's flags, ';'-separated (default below;
#               glm5speed: "-ngl 99;-ngl 99 -ncmoe 13").
#   LLAMA_BENCH compare, kvdepth (required), glm5speed (optional): a llama-bench binary.
#   ROUNDS      bench, compare, kvdepth: rounds (default 2); solar2speed, glm5speed (default 1);
#               builds and engines alternate which goes first.
#   KV_TYPES    kvdepth: the cache types, K and V alike (default "f16 q8_0 q4_0").
#   PREV        bench, serve: earlier dists (space-separated) run beside this one; a dist holding
#               only plugins/ runs under this build's binary. dist/ and PREV share the 64 MiB
#               carry: leave out of both the bundles the card does not run (cuda-sm121, cuda-sm86).
# A call holds 10 minutes: with PREV or LLAMA_BENCH, name one file (FILES=30b); glm5speed writes
# its file on the first call, and PLACEMENTS, LLAMA_PLACEMENTS and DEPTHS split its runs across
# calls.
#
# Experiments (profiles, ncu, one-off A/B modes) are not kept here: docs/performance.md quotes the
# commands each entry ran, and the modes named in entries before 2026-12-06 are in this file's
# history (`git show fd971ca:scripts/gpu-check.sh`).
set -Eeuo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

suite=${1:-}
case $suite in
  build | check | bench | compare | kvdepth | serve | solar2speed | glm5speed | mtpspeed) ;;
  *)
    echo "usage: scripts/gpu-check.sh build|check|bench|compare|kvdepth|serve|solar2speed|glm5speed|mtpspeed (see the top of the file)" >&2
    exit 2
    ;;
esac
out=$(mktemp -d "/tmp/gpu-check-$suite.XXXXXX")
where="logs in $out${OUT:+, packed into \$OUT/gpu-check-$suite.tar.gz}"
# Names the command that stopped the suite (set -e), its status and the checks failed before it.
on_error() {
  local rc=$? cmd=${BASH_COMMAND%%$'\n'*} before=""
  if [ ${#failures[@]} -gt 0 ]; then
    printf -v before '%s; ' "${failures[@]}"
    before="; failed before it: ${before%; }"
  fi
  echo "gpu-check $suite: FAILED: \`$cmd\` exited $rc (line ${BASH_LINENO[0]}; $where)$before" >&2
}
failures=()
trap on_error ERR
# A server started in the background, stopped on the way out whatever happens.
server=""
# On the way out: the server stopped, the logs packed into $OUT and the tables copied there.
on_exit() {
  [ -z "$server" ] || kill "$server" 2> /dev/null || :
  if [ -n "${OUT:-}" ]; then
    tar -C "$out" -czf "$OUT/gpu-check-$suite.tar.gz" .
    [ ! -f "$out/table.md" ] || cp "$out/table.md" "$OUT/table-$suite.md"
  fi
}
trap on_exit EXIT

default_placements="-ngl 99;-ngl 99 -cmoe;-ngl 99 --gpu-budget 5850M;-ngl 99 -cmoe --gpu-budget 1950M"
# llama.cpp's flags for the same card memory on the 30B-A3B file: all on the card, every expert on
# the host (-ncmoe 48: 2,355 MiB against `-cmoe --gpu-budget 1950M`'s 2,337) and -ncmoe 36 (6,281
# MiB against `--gpu-budget 5850M`'s 6,261), measured in docs/performance.md (2026-12-04).
default_llama_placements="-ngl 99;-ngl 99 -ncmoe 48;-ngl 99 -ncmoe 36"
tiny=/dev/shm/bloomery-gpu-check

bl() { dist/bloomery --plugin-dir dist/plugins "$@"; }

# Records a failed check ($*): printed now, and named again in the closing line.
fail() {
  echo "FAIL $*" >&2
  failures+=("$*")
}
# The closing line: every failure (exit status 1), or that all passed.
finish() {
  if [ ${#failures[@]} -gt 0 ]; then
    local all
    printf -v all '%s; ' "${failures[@]}"
    echo "gpu-check $suite: ${#failures[@]} FAILED: ${all%; } ($where)" >&2
    exit 1
  fi
  echo "gpu-check $suite: all passed in ${SECONDS} s ($where)"
}
# The line of log $1 that says why a command failed: its last error line, else its last line.
why() { { grep -iE "error|panic" "$1" || tail -1 "$1"; } | tail -1; }
# A file name for flags: "-ngl 99 -cmoe" gives "ngl_99_cmoe".
slug() { echo "$*" | sed -E 's/(^| )-+/\1/g; s/ +/_/g; s/[^A-Za-z0-9._]/-/g'; }

# The benchmark files in /dev/shm, written on first use (to FILE.part, renamed when complete, so
# an interrupted synth is never taken for the file); each prints its path. 30b: the Qwen3-30B-A3B shape, experts Q4_K
# and attention/embeddings/output Q8_0; 35b: the Qwen3.6-35B-A3B hybrid, experts Q4_K, the rest
# Q8_0; 35b-mtp: the same with its MTP block; solar100: Solar-Open-100B (glm4moe) at SOLAR_LAYERS of its 48 layers (default 48, about
# 61 GB), experts Q4_K, the rest Q8_0; solar2: Solar-Open2-250B's first 12 layers (every fourth
# from layer 0 gated GQA, the others KDA), 320 experts a layer in Q4_K, the rest Q8_0; glm5:
# GLM-5.3-Flash's first 12 layers (3 dense; MLA at 3, 7 and 11, the others KDA) and its NextN
# layer, 288 experts a layer with gate and up in Q4_K and down in Q5_K, the rest Q8_0. Written
# with explicit returns: callers may test it (errexit off).
big_file() {
  local f start=$SECONDS
  case $1 in
    30b) f=/dev/shm/q3-30b-a3b-q4k.gguf ;;
    35b) f=/dev/shm/q36-35b-a3b-q4k.gguf ;;
    35b-mtp) f=/dev/shm/q36-35b-a3b-mtp-q4k.gguf ;;
    solar100) f=/dev/shm/solar-open-100b-L${SOLAR_LAYERS:-48}-q4k.gguf ;;
    solar2) f=/dev/shm/solar-open2-250b-12l-q4k.gguf ;;
    glm5) f=/dev/shm/glm5-next-flash-12l-q4k-q5k.gguf ;;
    *) echo "gpu-check: unknown file '$1' (30b, 35b, 35b-mtp, solar100, solar2 or glm5)" >&2; return 2 ;;
  esac
  if [ ! -f "$f" ]; then
    local q8="--attn Q8_0 --embd Q8_0 --output-type Q8_0"
    # shellcheck disable=SC2086
    case $1 in
      30b) bl synth --arch qwen3moe --preset 30b-a3b --experts Q4_K $q8 -o "$f.part" > /dev/null ;;
      35b) bl synth --arch qwen35moe --preset 35b-a3b --experts Q4_K $q8 --dense Q8_0 \
        -o "$f.part" > /dev/null ;;
      35b-mtp) bl synth --arch qwen35moe --preset 35b-a3b-mtp --experts Q4_K $q8 --dense Q8_0 \
        -o "$f.part" > /dev/null ;;
      solar100) bl synth --arch glm4moe --preset solar-open-100b --layers "${SOLAR_LAYERS:-48}" \
        --experts Q4_K $q8 --dense Q8_0 -o "$f.part" > /dev/null ;;
      solar2) bl synth --arch solar-open2 --preset 250b --layers 12 --experts Q4_K $q8 --dense Q8_0 \
        -o "$f.part" > /dev/null ;;
      glm5) bl synth --arch glm5-next --preset flash --layers 12 --experts Q4_K --experts-down Q5_K \
        $q8 --dense Q8_0 -o "$f.part" > /dev/null ;;
    esac || return 1
    mv "$f.part" "$f" || return 1
    echo "synth $1: $((SECONDS - start)) s" >&2
  fi
  echo "$f"
}

# The rows of a bench or llama-bench table: "pp512 t/s" and "tg128 t/s" means (or "-").
# The prompt and decode tests bench_rates reads and rounds_table heads (kvdepth: decode at depth).
rate_pp=pp512
rate_tg=tg128
bench_rates() {
  awk -F'|' -v pt="$rate_pp" -v tt="$rate_tg" \
    'NF > 3 && index($(NF-2), pt) { pp = $(NF-1) } NF > 3 && index($(NF-2), tt) { tg = $(NF-1) }
    END { split(pp, a, "±"); split(tg, b, "±"); gsub(/ /, "", a[1]); gsub(/ /, "", b[1])
          printf "%s\t%s", (a[1] == "" ? "-" : a[1]), (b[1] == "" ? "-" : b[1]) }' "$1"
}
# A markdown table of the rows in $1 (file, engine and build, flags, round, pp512, tg128 and an
# optional peak), one line per file, engine and flags, the rounds side by side.
rounds_table() {
  awk -F'\t' -v pt="$rate_pp" -v tt="$rate_tg" '
    { k = $1 "\t" $2 "\t" $3
      if (!(k in pp)) { keys[n++] = k; pp[k] = $5; tg[k] = $6; pk[k] = $7 }
      else { pp[k] = pp[k] " / " $5; tg[k] = tg[k] " / " $6; pk[k] = pk[k] " / " $7 }
      peak = peak || $7 != "" }
    END {
      printf "| file | build | flags | %s t/s | %s t/s |%s\n", pt, tt, peak ? " peak MiB above idle |" : ""
      printf "|---|---|---|---:|---:|%s\n", peak ? "---:|" : ""
      for (i = 0; i < n; i++) {
        split(keys[i], c, "\t")
        printf "| %s | %s | `%s` | %s | %s |%s\n", c[1], c[2], c[3], pp[keys[i]], tg[keys[i]],
          peak ? " " pk[keys[i]] " |" : ""
      }
    }' "$1"
}
# The builds to run in round $1: PREV's dists, then this one; reversed in even rounds.
round_order() {
  local builds
  read -r -a builds <<< "${PREV:-} dist"
  if [ $(($1 % 2)) = 1 ]; then
    echo "${builds[@]}"
  else
    printf '%s\n' "${builds[@]}" | tac | tr '\n' ' '
  fi
}
# The binary of dist $1 (this build's for a dist holding only plugins/).
dist_bin() {
  if [ -x "$1/bloomery" ]; then echo "$1/bloomery"; else echo dist/bloomery; fi
}

# ---- check ----

# The tiny files, written afresh (milliseconds each) to $tiny; the names the checks use.
tiny_files() {
  local q8="--attn Q8_0 --embd Q8_0 --output-type Q8_0"
  mkdir -p "$tiny"
  # shellcheck disable=SC2086
  {
    synth_tiny qwen3moe-f32 qwen3moe
    synth_tiny qwen3moe-q8_0 qwen3moe --experts Q8_0 $q8
    # K-quant experts, as in Q4_K_M files (down projections in Q6_K) and beyond.
    synth_tiny qwen3moe-q6_k qwen3moe --experts Q6_K --attn Q5_K --embd Q6_K --output-type Q6_K
    synth_tiny qwen3moe-q5_k qwen3moe --experts Q5_K --attn Q6_K --embd Q5_K --output-type Q5_K
    synth_tiny qwen3moe-q4_k qwen3moe --experts Q4_K $q8
    synth_tiny qwen35moe-f32 qwen35moe
    synth_tiny qwen35moe-q8_0 qwen35moe --experts Q8_0 $q8 --dense Q8_0
    synth_tiny qwen35moe-q4_k qwen35moe --experts Q4_K $q8 --dense Q8_0
    synth_tiny qwen35-f32 qwen35
    synth_tiny qwen35-q8_0 qwen35 --experts Q8_0 $q8 --dense Q8_0
    # Kimi Delta Attention (a decay per head and key dim): Solar-Open2 (KDA + gated NoPE GQA) and
    # Kimi-Linear (all KDA, a dense lead layer).
    synth_tiny solar-open2-f32 solar-open2
    synth_tiny solar-open2-q8_0 solar-open2 --experts Q8_0 $q8 --dense Q8_0
    synth_tiny kimi-linear-f32 kimi-linear
    # GLM-5.3 (glm5-next): KDA and NoPE latent MLA (K = V on 512-wide rows, per-head absorbed
    # products) over the k-pool DSA indexer's sparse selection, four hyper-connection streams
    # (Sinkhorn), clamped SwiGLU, a dense lead layer and a NextN layer (vocab 272).
    synth_tiny glm5-next-f32 glm5-next
    synth_tiny glm5-next-q8_0 glm5-next --experts Q8_0 $q8 --dense Q8_0
    # Qwen3.8-Flash-Next (qwen4exp): GDN and gated GQA over the QSA selection (from position 19),
    # gated hyper-connections, the PLE layer's dilated convolution and host-hashed n-gram rows.
    synth_tiny qwen4exp-f32 qwen4exp
    # DeepSeek-V4-Flash (deepseek4): latent attention over a window ring of 128 and compressed
    # rows (ratio 4 through the indexer's picks, ratio 128 all), the tail and inverse rope, four
    # hyper-connection streams with a trained head, hash-routed and biased √softplus experts.
    synth_tiny deepseek4-f32 deepseek4
    # DeepSeek-V4.1 (deepseek41): V4's attention with Engram n-gram rows before it on its layers,
    # the index keys made from the compressor's plain rows (Compress Plain and Store), the late mix.
    synth_tiny deepseek41-f32 deepseek41
    # GLM dialect: Q/K/V biases, QK-norm, half the head rotated, a dense lead layer, x2.5.
    synth_tiny glm4moe-f32 glm4moe
    synth_tiny glm4moe-q5_0 glm4moe --experts Q5_0 $q8 --dense Q8_0
    # Decision model: the tiny backbone and its f32 head (option rows from a Q8_0 output head).
    synth_tiny clef-f32 clef
    synth_tiny clef-q8_0 clef --attn Q8_0 --embd Q8_0 --output-type Q8_0 --dense Q8_0
  }
}
synth_tiny() {
  local name=$1 arch=$2
  shift 2
  bl synth --arch "$arch" --preset tiny --seed 7 "$@" -o "$tiny/$name.gguf" > /dev/null
}

# Whether the checks of tiny file or greedy label $1 run: ONLY unset, or $1 matching it.
wanted() { [ -z "${ONLY:-}" ] || [[ $1 =~ $ONLY ]]; }

# The kernel plugins to check: BUNDLES, or every GPU plugin `bloomery plugins` says runs here.
bundles() {
  if [ -n "${BUNDLES:-}" ]; then
    echo "$BUNDLES"
    return
  fi
  awk '$2 == "kernel" && /runs here: yes/ { name = $1; next }
       name != "" && /device: gpu/ { printf "%s ", name } { name = "" }' "$out/plugins.txt"
}

# `bloomery opcheck` of plugin $1 with op cases of seed $2, the tiny files $4… end to end with
# tolerance $3; MMQ, when set, is the batched products' form (BLOOMERY_CUDA_MMQ).
opcheck() {
  local bundle=$1 seed=$2 tol=$3 what log args=() envs=() m models=()
  shift 3
  for m in "$@"; do ! wanted "$m" || models+=("$m"); done
  if [ ${#models[@]} = 0 ]; then
    echo "skip opcheck $bundle seed $seed: ONLY='${ONLY:-}' names none of $*"
    return
  fi
  set -- "${models[@]}"
  what="opcheck $bundle seed $seed${MMQ:+ BLOOMERY_CUDA_MMQ=$MMQ} ($*)"
  log="$out/opcheck-$bundle-$seed${MMQ:+-$MMQ}.txt"
  for m in "$@"; do args+=(--model "$tiny/$m.gguf"); done
  [ -z "${MMQ:-}" ] || envs=("BLOOMERY_CUDA_MMQ=$MMQ")
  if env "${envs[@]}" dist/bloomery --plugin-dir dist/plugins opcheck --plugin "$bundle" \
    --seed "$seed" --model-tol "$tol" "${args[@]}" > "$log" 2>&1; then
    echo "ok   $what: $(tail -1 "$log")"
  else
    grep -m 5 -E "^FAIL" "$log" >&2 || [ $? = 1 ]
    fail "$what: $(why "$log") [$log]"
  fi
}

# The greedy text (NTOK tokens, default 24) of model file $1 after prompt $2 under the flags $3,
# written to file $4 (stderr to $4.log).
greedy() {
  # shellcheck disable=SC2086
  bl run -m "$1" -p "$2" -n "${NTOK:-24}" --temp 0 $3 > "$4" 2> "$4.log"
}
# same_text LABEL FILE PROMPT FORM…: the greedy text of FILE after PROMPT must be the same under
# every FORM (flags) as under the first.
same_text() {
  local label=$1 file=$2 prompt=$3 dir form i=0 bad=()
  shift 3
  wanted "$label" || return 0
  dir="$out/greedy/$label"
  mkdir -p "$dir"
  for form in "$@"; do
    if ! greedy "$file" "$prompt" "$form" "$dir/$i.txt"; then
      bad+=("'$form' exited: $(why "$dir/$i.txt.log")")
    elif ! cmp -s "$dir/0.txt" "$dir/$i.txt"; then
      bad+=("'$form'")
    fi
    echo "$i: $form: $(md5sum < "$dir/$i.txt" | cut -c1-12)" >> "$dir/forms.txt"
    i=$((i + 1))
  done
  if [ ${#bad[@]} -gt 0 ]; then
    local all
    printf -v all '%s, ' "${bad[@]}"
    fail "greedy $label: not as under '$1': ${all%, } [$dir]"
  else
    echo "ok   greedy $label: the same under $# forms"
  fi
}

# The last size ("1.25 GiB", "648.0 MiB") on the first line of stdin matching $1, in bytes (0 when
# none does).
plan_bytes() {
  awk -v pat="$1" '$0 ~ pat && !seen { seen = 1
      for (i = 1; i < NF; i++) if ($(i + 1) ~ /^(GiB|MiB)/) b = $i * ($(i + 1) ~ /GiB/ ? 1073741824 : 1048576) }
    END { printf "%d", b }'
}
# The helpers below return 1 (with a line on stderr) rather than rely on errexit, which is off
# where their callers test them.
#
# The plan (`bloomery plan`) of file $1 under flags $2…, also kept in $out/plans/.
plan_of() {
  local log
  mkdir -p "$out/plans"
  log="$out/plans/$(basename "$1" .gguf)_$(slug "${@:2}").txt"
  if ! bl plan -m "$@" > "$log" 2>&1; then
    echo "gpu-check: bloomery plan -m $*: $(why "$log")" >&2
    return 1
  fi
  cat "$log"
}
# The card budget under which `-cmoe` (flags $2…) on file $1 plans one staging set filled in two
# halves: the plan's total less half its staging, and 256 KiB.
one_set_budget() {
  local f=$1 plan budget
  shift
  plan=$(plan_of "$f" -cmoe "$@") || return 1
  budget=$(($(plan_bytes "^  total" <<< "$plan") - $(plan_bytes "^  expert staging" <<< "$plan") / 2
    + 262144))
  plan=$(plan_of "$f" -cmoe "$@" --gpu-budget "$budget") || return 1
  if ! grep -q "staging .*(1 set, filled in 2 parts" <<< "$plan"; then
    echo "gpu-check: -cmoe $* --gpu-budget $budget plans no staging set in halves for $f" >&2
    return 1
  fi
  echo "$budget"
}
# A host budget of half the host experts of file $1 under -cmoe, so that the disk tier reads the
# rest.
disk_budget() {
  local plan budget
  plan=$(plan_of "$1" -cmoe) || return 1
  budget=$(($(plan_bytes "^host budget .*routed experts" <<< "$plan") / 2))
  plan=$(plan_of "$1" -cmoe --host-budget "$budget") || return 1
  if ! grep -q "over the budget: read from disk" <<< "$plan"; then
    echo "gpu-check: -cmoe --host-budget $budget reads none of $1's experts from disk" >&2
    return 1
  fi
  echo "$budget"
}
# The first layer whose experts the staging sets hold for decode under -cmoe and flags $2… on
# file $1 (the lent layers are the last ones).
first_lent() {
  local plan n
  plan=$(plan_of "$1" -cmoe "${@:2}") || return 1
  n=$(sed -nE 's/.*holding the experts of blk\.([0-9]+).*/\1/p' <<< "$plan")
  if [ -z "$n" ]; then
    echo "gpu-check: -cmoe ${*:2} lends no staging set to decode on $1" >&2
    return 1
  fi
  echo "$n"
}

# Greedy text of the tiny files the same on the CPU, the card and the tiered placements.
check_tiny_text() {
  local short="hello world" long f one disk lent lent1 forms
  long="one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen \
sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four"
  for f in qwen3moe-f32 qwen3moe-q4_k qwen35moe-f32; do
    wanted "$f" || continue
    if ! one=$(one_set_budget "$tiny/$f.gguf") || ! disk=$(disk_budget "$tiny/$f.gguf"); then
      fail "greedy $f: no budget for one staging set or the disk tier (the line above says why)"
      continue
    fi
    # A two-token prompt runs on the host's experts; decode's host experts on the CPU, the card
    # in place (--bus-experts) or from the staging sets (lent); the disk tier reads them.
    forms=("-ngl 0" "-ngl 99" "-ngl 99 -ncmoe 2" "-ngl 99 -cmoe" "-ngl 99 -cmoe --bus-experts 0"
      "-ngl 99 -cmoe --bus-experts 8" "-ngl 99 -cmoe --no-decode-staging"
      "-ngl 99 -cmoe --gpu-budget $one" "-ngl 99 -cmoe --host-budget $disk"
      "-ngl 99 -cmoe --host-budget $disk --disk-prefetch 2")
    same_text "$f-short" "$tiny/$f.gguf" "$short" "${forms[@]}"
    if [ "$f" != qwen3moe-q4_k ]; then
      # A prompt long enough to stream every layer's experts through the staging sets.
      same_text "$f-long" "$tiny/$f.gguf" "$long" "-ngl 0" "-ngl 99" "-ngl 99 -cmoe" \
        "-ngl 99 -cmoe --gpu-budget $one" "-ngl 99 -cmoe --host-budget $disk"
    fi
  done
  same_text qwen35-f32-short "$tiny/qwen35-f32.gguf" "$short" "-ngl 0" "-ngl 99"
  # KDA on the card: decode (the step-wise kernel) after a short prompt, and a prompt of more
  # than 64 tokens (the card's chunked form, 64-row chunks).
  local longer="$long $long $long $long"
  for f in solar-open2-f32 kimi-linear-f32; do
    same_text "$f-short" "$tiny/$f.gguf" "$short" "-ngl 0" "-ngl 99" "-ngl 99 -cmoe"
    same_text "$f-longer" "$tiny/$f.gguf" "$longer" "-ngl 0" "-ngl 99"
  done
  # Quantized K/V caches (-ctk/-ctv), rotated as llama.cpp's: the card's store, decode and flash
  # prompt forms (q8_0, q4_0) and its run-time-typed scores form (a q8_0 K beside an f16 V,
  # iq4_nl) against the CPU's (which scores q quantized to Q8, as llama.cpp's CPU does: a near
  # tie may part them).
  local k v kv
  for kv in "q8_0 q8_0" "q4_0 q4_0" "q8_0 f16" "iq4_nl iq4_nl"; do
    read -r k v <<< "$kv"
    same_text "qwen3moe-f32-long-ctk-$k-ctv-$v" "$tiny/qwen3moe-f32.gguf" "$long" \
      "-ngl 0 -ctk $k -ctv $v" "-ngl 99 -ctk $k -ctv $v"
  done
  same_text glm4moe-f32-short "$tiny/glm4moe-f32.gguf" "$short" "-ngl 0" "-ngl 99" "-ngl 99 -cmoe"
  # GLM-5.3: the indexer selects from position 11 (top 8 + kpool 4 - 1), so decode after the
  # short prompt runs sparse latent attention; the longer prompt takes the KDA's chunked form and
  # selects inside the prompt. Its experts on the host, in one staging set and on the disk tier.
  f=$tiny/glm5-next-f32.gguf
  if ! wanted glm5-next-f32; then
    :
  elif ! one=$(one_set_budget "$f") || ! disk=$(disk_budget "$f"); then
    fail "greedy glm5-next-f32: no budget for one staging set or the disk tier (the line above says why)"
  else
    same_text glm5-next-f32-short "$f" "$short" "-ngl 0" "-ngl 99" "-ngl 99 -cmoe" \
      "-ngl 99 -cmoe --bus-experts 0" "-ngl 99 -cmoe --gpu-budget $one" \
      "-ngl 99 -cmoe --host-budget $disk"
    same_text glm5-next-f32-longer "$f" "$longer" "-ngl 0" "-ngl 99" "-ngl 99 -cmoe"
  fi
  same_text qwen4exp-f32-longer "$tiny/qwen4exp-f32.gguf" "$longer" "-ngl 0" "-ngl 99" "-ngl 99 -cmoe"
  # DeepSeek-V4: the longer prompt is 620 tokens of its tiny vocabulary, so the prompt's rows and
  # decode cross the window (128) and read compressed rows of both ratios (the indexer keeping 8
  # of up to 155).
  same_text deepseek4-f32-longer "$tiny/deepseek4-f32.gguf" "$longer" "-ngl 0" "-ngl 99" \
    "-ngl 99 -cmoe"
  same_text deepseek41-f32-longer "$tiny/deepseek41-f32.gguf" "$longer" "-ngl 0" "-ngl 99" \
    "-ngl 99 -cmoe"
  # Quantized activations round differently on the CPU (Q8_K) and the card (Q8_1), so after the
  # long prompt the Q4_K file is compared between forms that compute the same products on the same
  # devices: decode's host experts on the CPU (--bus-experts 0), the plan kept (--no-residency),
  # and a layer lent to decode against the same layer placed on the card.
  f=$tiny/qwen3moe-q4_k.gguf
  wanted qwen3moe-q4_k || return 0
  if ! one=$(one_set_budget "$f") || ! disk=$(disk_budget "$f") || ! lent=$(first_lent "$f") \
    || ! lent1=$(first_lent "$f" --gpu-budget "$one"); then
    fail "greedy qwen3moe-q4_k-long: no plan to compare (the line above says why)"
    return
  fi
  forms=("-ngl 99 -cmoe --bus-experts 0 --no-residency --no-decode-staging")
  same_text qwen3moe-q4_k-long-streamed "$f" "$long" "${forms[0]}" "${forms[0]} --gpu-budget $one" \
    "${forms[0]} --host-budget $disk --disk-prefetch 2"
  forms=("-ngl 99 --bus-experts 0 --no-residency")
  same_text qwen3moe-q4_k-long-lent "$f" "$long" "${forms[0]} -ncmoe $lent --no-decode-staging" \
    "${forms[0]} -cmoe"
  same_text qwen3moe-q4_k-long-lent-one-set "$f" "$long" \
    "${forms[0]} -ncmoe $lent1 --no-decode-staging" "${forms[0]} -cmoe --gpu-budget $one"
}

# The 30B-A3B file (128 experts a layer): the staging sets lent to decode and one set in halves
# (--gpu-budget 1950M, llama.cpp's -ncmoe 48 card memory) give the text of the same layers placed
# on the card; 32 tokens.
check_30b_text() {
  local f long lent lent1 base plan
  long="1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 \
34 35 36 37 38 39 40"
  base="-ngl 99 -c 512 --bus-experts 0 --no-residency"
  if ! f=$(big_file 30b) || ! lent=$(first_lent "$f" -c 512) \
    || ! lent1=$(first_lent "$f" -c 512 --gpu-budget 1950M) \
    || ! plan=$(plan_of "$f" -c 512 -cmoe --gpu-budget 1950M); then
    fail "greedy 30b: no file or plan to compare (the line above says why)"
    return
  fi
  grep -q "staging .*(1 set, filled in 2 parts" <<< "$plan" \
    || fail "greedy 30b: -cmoe --gpu-budget 1950M no longer plans one staging set in halves"
  NTOK=32 same_text 30b-lent "$f" "$long" "$base -ncmoe $lent --no-decode-staging" "$base -cmoe"
  NTOK=32 same_text 30b-lent-one-set "$f" "$long" "$base -ncmoe $lent1 --no-decode-staging" \
    "$base -cmoe --gpu-budget 1950M"
  NTOK=32 same_text 30b-streamed "$f" "$long" "$base -cmoe --no-decode-staging" \
    "$base -cmoe --gpu-budget 1950M --no-decode-staging"
}

# A TCP port no process listens on.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# Waits until the server on port $1 (process $2) answers /health; false if it exits first or is
# not ready in 300 s.
wait_ready() {
  local _
  for _ in $(seq 600); do
    kill -0 "$2" 2> /dev/null || return 1
    curl -sf "http://127.0.0.1:$1/health" > /dev/null && return 0
    sleep 0.5
  done
  return 1
}
# Stops $server (log $1): a failed check when it had exited by itself.
stop_server() {
  if kill "$server" 2> /dev/null; then
    wait "$server" || [ $? = 143 ]
  else
    wait "$server" || :
    fail "the server exited before it was stopped: $(why "$1") [$1]"
  fi
  server=""
}

# The prompt cache on the card: a restored prefix gives the tokens the slot held (tiny F32 file
# $1 of vocabulary $2; with $3 = --checkpoints, a hybrid's, restored to its checkpoints).
check_prompt_cache() {
  local port name=$1 vocab=$2 log="$out/serve-prompt-cache-$1.log" report="$out/prompt-cache-$1.txt"
  wanted "$name" || return 0
  port=$(free_port)
  # The binary itself in the background (not `bl`), so that $! is the server.
  dist/bloomery --plugin-dir dist/plugins serve -m "$tiny/$name.gguf" -ngl 99 -np 4 \
    -c 16384 --port "$port" > "$log" 2>&1 &
  server=$!
  if ! wait_ready "$port" "$server"; then
    fail "serve -ngl 99 ($name) did not start: $(why "$log") [$log]"
    return
  fi
  if python3 scripts/prompt_cache_bench.py --url "http://127.0.0.1:$port" --slots 4 \
    --vocab "$vocab" --prefix 1000 ${3:+"$3"} > "$report" 2>&1; then
    echo "ok   prompt cache on the card ($name): $(head -1 "$report")"
  else
    fail "prompt cache on the card ($name): $(tail -1 "$report") [$report]"
  fi
  stop_server "$log"
}

# Starts the server on tiny file $1 with flags $2 (log $3) in the background: sets $server and
# $port (the caller's locals); false when it is not ready.
serve_tiny() {
  port=$(free_port)
  # The binary itself in the background (not `bl`), so that $! is the server.
  # shellcheck disable=SC2086
  dist/bloomery --plugin-dir dist/plugins serve -m "$tiny/$1.gguf" -np 2 -c 8192 --port "$port" \
    $2 > "$3" 2>&1 &
  server=$!
  wait_ready "$port" "$server"
}
# A server that did not start (log $1): a failed check; stopped if it still runs.
not_started() {
  fail "serve $2 did not start: $(why "$1") [$1]"
  kill "$server" 2> /dev/null || :
  wait "$server" || :
  server=""
}

# The decision head on the card and on the CPU beside a backbone on the card: /v1/systemone
# answers of the tiny clef files (F32; Q8_0 backbone and option rows) against the same file all
# on the CPU, within 1e-4 (scripts/systemone_check.py).
check_decision_head() {
  local file flags port ref_port ref_server log ref_log
  for file in clef-f32 clef-q8_0; do
    wanted "$file" || continue
    ref_log="$out/serve-$file-cpu.log"
    if ! serve_tiny "$file" "-ngl 0" "$ref_log"; then
      not_started "$ref_log" "$file -ngl 0"
      continue
    fi
    ref_port=$port
    ref_server=$server
    for flags in "-ngl 99" "-ngl 99 --decision-head-device cpu"; do
      log="$out/serve-$file-$(slug "$flags").log"
      if ! serve_tiny "$file" "$flags" "$log"; then
        not_started "$log" "$file $flags"
        continue
      fi
      if python3 scripts/systemone_check.py --tol 1e-4 "http://127.0.0.1:$ref_port" \
        "http://127.0.0.1:$port" > "$log.check" 2>&1; then
        echo "ok   /v1/systemone $file $flags against -ngl 0: $(tail -1 "$log.check")"
      else
        fail "/v1/systemone $file $flags against -ngl 0: $(tail -1 "$log.check") [$log.check]"
      fi
      grep -m 1 "decision head from" "$log" || :
      stop_server "$log"
    done
    server=$ref_server
    stop_server "$ref_log"
  done
}

check_suite() {
  local b list
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
  fi
  bl plugins > "$out/plugins.txt"
  list=$(bundles)
  [ -n "$list" ] || {
    echo "gpu-check check: no runnable GPU kernel plugin here [$out/plugins.txt]" >&2
    exit 1
  }
  tiny_files
  for b in $list; do
    echo "== opcheck $b (${SECONDS} s)"
    # Op cases on six seeds, with the tiny files end to end. Tolerances (relative error of the
    # logits; an F16 cache adds 9e-5): the F32 files 1e-5. Q8_0: the products quantize their
    # activations, which turns summation-order differences into rounding flips (the two CPU
    # plugins differ by up to 1e-2), and the card's and the CPU's rounding of K/V to f16 adds
    # about 1e-2 a pass: 4.06e-2 at worst, the same from every build back to 6cb104e
    # (2026-12-02). K-quants: Q8_K activations on the CPU, Q8_1 on the card (as llama.cpp's two
    # backends), about 1e-2 apart per product, which these random files amplify (Q5_K 1.18e-1 at
    # its third decode step since 6cb104e); Q4_K the same (1.26-1.38e-2). The hybrids' Q8_0 files
    # 2e-2; their Q4_K experts sit up to 2.6e-1 at decode step 2, fused shared expert or not.
    # The bands catch gross errors (a wrong scale or block gives about 1); the op cases the fine
    # ones. The KDA files sit in the hybrids' bands, and so do GLM-5.3's (its DSA picks are
    # compared through the logits: a flipped pick near a tie shows as a large error).
    opcheck "$b" 1 1e-5 qwen3moe-f32 qwen35moe-f32 qwen35-f32 glm4moe-f32 solar-open2-f32 \
      kimi-linear-f32 glm5-next-f32 qwen4exp-f32 deepseek4-f32 deepseek41-f32
    opcheck "$b" 2 5e-2 qwen3moe-q8_0
    opcheck "$b" 3 1.5e-1 qwen3moe-q6_k qwen3moe-q5_k
    opcheck "$b" 4 1e-1 qwen3moe-q4_k glm4moe-q5_0
    opcheck "$b" 5 2e-2 qwen35moe-q8_0 qwen35-q8_0 solar-open2-q8_0 glm5-next-q8_0
    opcheck "$b" 6 3e-1 qwen35moe-q4_k
    # The dp4a form of the batched products (the int8 tensor-core tiles otherwise).
    MMQ=dp4a opcheck "$b" 7 1e-1 qwen3moe-q4_k
    # The 64 x 64 tiles where the wide tile is the default (its op case: 150 columns).
    MMQ=mma opcheck "$b" 9 2e-2 qwen35-q8_0
  done
  echo "== greedy text of the tiny files (${SECONDS} s)"
  check_tiny_text
  if [ -z "${SKIP_30B:-}" ] && wanted 30b; then
    echo "== greedy text of the 30B-A3B file (${SECONDS} s)"
    check_30b_text
  fi
  echo "== prompt cache (${SECONDS} s)"
  check_prompt_cache qwen3moe-f32 512
  check_prompt_cache solar-open2-f32 512 --checkpoints
  check_prompt_cache glm5-next-f32 272 --checkpoints
  echo "== decision head on the card and beside it (${SECONDS} s)"
  check_decision_head
  finish
}

# ---- bench and compare ----

# One timed run, logged to $1, of engine or build $2 on file $3 (30b or 35b) with flags $4 in round
# $5; the rest is the command, the flags go last. Adds a row to $out/rows.tsv, with the card's peak
# memory above idle when $idle is set.
timed_run() {
  local log=$1 label=$2 name=$3 flags=$4 round=$5 smi=$1.smi sampler peak="" rates
  shift 5
  if [ -n "${idle:-}" ]; then
    nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$smi" &
    sampler=$!
  fi
  # shellcheck disable=SC2086
  if "$@" $flags > "$log" 2>&1; then
    :
  else
    fail "$label $name '$flags' round $round: $(why "$log") [$log]"
  fi
  if [ -n "${idle:-}" ]; then
    kill "$sampler"
    wait "$sampler" 2> /dev/null || [ $? = 143 ]
    peak=$(($(sort -n "$smi" | tail -1) - idle))
  fi
  rates=$(bench_rates "$log")
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$label" "$flags" "$round" "$rates" "$peak" \
    | tee -a "$out/rows.tsv"
}

bench_suite() {
  local round name f p d placements
  IFS=';' read -r -a placements <<< "${PLACEMENTS:-$default_placements}"
  for round in $(seq "${ROUNDS:-2}"); do
    for name in ${FILES:-30b 35b}; do
      f=$(big_file "$name")
      for p in "${placements[@]}"; do
        for d in $(round_order "$round"); do
          timed_run "$out/bench-$name-$(slug "$d")-$(slug "$p")-r$round.txt" "$d" "$name" "$p" \
            "$round" "$(dist_bin "$d")" --plugin-dir "$d/plugins" bench -m "$f" -p 512 -n 128 -r 3
        done
      done
    done
  done
  rounds_table "$out/rows.tsv" | tee "$out/table.md"
  finish
}

compare_suite() {
  local round name f p placements llama first second engine
  if [ -z "${LLAMA_BENCH:-}" ] || [ ! -x "$LLAMA_BENCH" ]; then
    echo "gpu-check compare: FAILED: LLAMA_BENCH must name a llama-bench binary (is '${LLAMA_BENCH:-}')" >&2
    exit 1
  fi
  IFS=';' read -r -a placements <<< "${PLACEMENTS:-$default_placements}"
  IFS=';' read -r -a llama <<< "${LLAMA_PLACEMENTS:-$default_llama_placements}"
  idle=$(nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits)
  for round in $(seq "${ROUNDS:-2}"); do
    first=llama second=bloomery
    [ $((round % 2)) = 1 ] || first=bloomery second=llama
    for name in ${FILES:-30b 35b}; do
      f=$(big_file "$name")
      for engine in $first $second; do
        if [ "$engine" = llama ]; then
          for p in "${llama[@]}"; do
            timed_run "$out/llama-$name-$(slug "$p")-r$round.txt" llama.cpp "$name" "$p -fa 1 -t 16" \
              "$round" "$LLAMA_BENCH" -m "$f" -p 512 -n 128 -r 3
          done
        else
          for p in "${placements[@]}"; do
            timed_run "$out/bloomery-$name-$(slug "$p")-r$round.txt" bloomery "$name" "$p" "$round" \
              dist/bloomery --plugin-dir dist/plugins bench -m "$f" -p 512 -n 128 -r 3
          done
        fi
      done
    done
  done
  rounds_table "$out/rows.tsv" | tee "$out/table.md"
  finish
}

kvdepth_suite() {
  local round t f first second engine depth=16384
  if [ -z "${LLAMA_BENCH:-}" ] || [ ! -x "$LLAMA_BENCH" ]; then
    echo "gpu-check kvdepth: FAILED: LLAMA_BENCH must name a llama-bench binary (is '${LLAMA_BENCH:-}')" >&2
    exit 1
  fi
  rate_pp="no prompt test" rate_tg="tg64 @ d$depth"
  f=$(big_file 30b)
  for round in $(seq "${ROUNDS:-2}"); do
    first=llama second=bloomery
    [ $((round % 2)) = 1 ] || first=bloomery second=llama
    for t in ${KV_TYPES:-f16 q8_0 q4_0}; do
      for engine in $first $second; do
        if [ "$engine" = llama ]; then
          timed_run "$out/llama-kv-$t-r$round.txt" llama.cpp 30b "-ngl 99 -fa 1 -t 16 -ctk $t -ctv $t" \
            "$round" "$LLAMA_BENCH" -m "$f" -p 0 -n 64 -d "$depth" -r 3
        else
          timed_run "$out/bloomery-kv-$t-r$round.txt" bloomery 30b "-ngl 99 -ctk $t -ctv $t" "$round" \
            dist/bloomery --plugin-dir dist/plugins bench -m "$f" -p 0 -n 64 -d "$depth" -r 3
        fi
      done
    done
  done
  rounds_table "$out/rows.tsv" | tee "$out/table.md"
  finish
}

# Solar-Open2 at its real widths, 12 layers: decode and pp512 at each depth of DEPTHS, under each
# placement; bench's own tables (one per placement) at the end.
solar2speed_suite() {
  local f p round placements log
  IFS=';' read -r -a placements <<< "${PLACEMENTS:-"-ngl 99;-ngl 99 -cmoe"}"
  f=$(big_file solar2)
  for round in $(seq "${ROUNDS:-1}"); do
    for p in "${placements[@]}"; do
      log="$out/bench-solar2-$(slug "$p")-r$round.txt"
      # shellcheck disable=SC2086
      if bl bench -m "$f" -p 512 -n 64 -d "${DEPTHS:-512,16384}" -r 2 $p > "$log" 2>&1; then
        { echo "solar2 \`$p\` round $round:"; grep "|" "$log"; echo; } | tee -a "$out/table.md"
      else
        fail "solar2 bench '$p' round $round: $(why "$log") [$log]"
      fi
    done
  done
  finish
}

# GLM-5.3-Flash at its real widths, 12 layers and NextN: decode and pp512 at each depth of
# DEPTHS under each placement, and llama-bench (LLAMA_BENCH, when set) on the same file at its
# placements (LLAMA_PLACEMENTS), the engines alternating by round; bench's tables at the end.
glm5speed_suite() {
  local f p round placements llama log first second engine
  IFS=';' read -r -a placements <<< "${PLACEMENTS:-"-ngl 99;-ngl 99 -cmoe"}"
  # -ncmoe 13: the experts of all 13 blocks (12 trunk layers and NextN) on the host.
  IFS=';' read -r -a llama <<< "${LLAMA_PLACEMENTS:-"-ngl 99;-ngl 99 -ncmoe 13"}"
  if [ -n "${LLAMA_BENCH:-}" ] && [ ! -x "$LLAMA_BENCH" ]; then
    echo "gpu-check glm5speed: FAILED: LLAMA_BENCH is not a program ('$LLAMA_BENCH')" >&2
    exit 1
  fi
  f=$(big_file glm5)
  for round in $(seq "${ROUNDS:-1}"); do
    first=bloomery second=llama
    [ $((round % 2)) = 1 ] || first=llama second=bloomery
    for engine in $first $second; do
      if [ "$engine" = bloomery ]; then
        for p in "${placements[@]}"; do
          log="$out/bench-glm5-$(slug "$p")-r$round.txt"
          # shellcheck disable=SC2086
          if bl bench -m "$f" -p 512 -n 64 -d "${DEPTHS:-512,8192}" -r 2 $p > "$log" 2>&1; then
            { echo "glm5 bloomery \`$p\` round $round:"; grep "|" "$log"; echo; } \
              | tee -a "$out/table.md"
          else
            fail "glm5 bench '$p' round $round: $(why "$log") [$log]"
          fi
        done
      elif [ -n "${LLAMA_BENCH:-}" ]; then
        for p in "${llama[@]}"; do
          log="$out/llama-glm5-$(slug "$p")-r$round.txt"
          # shellcheck disable=SC2086
          if "$LLAMA_BENCH" -m "$f" -p 512 -n 64 -d "${DEPTHS:-512,8192}" -r 2 -fa 1 -t 16 $p \
            > "$log" 2>&1; then
            { echo "glm5 llama.cpp \`$p\` round $round:"; grep "|" "$log"; echo; } \
              | tee -a "$out/table.md"
          else
            fail "glm5 llama-bench '$p' round $round: $(why "$log") [$log]"
          fi
        done
      fi
    done
  done
  finish
}

# ---- mtpspeed ----

mtpspeed_suite() {
  local f p np log name lens placements
  IFS=';' read -r -a placements <<< "${PLACEMENTS:-"-ngl 99;-ngl 99 -cmoe"}"
  for name in 35b-mtp glm5; do
    lens=${LENS:-1.2,1.7,2.2,2.4,2.8}
    if [ "$name" = glm5 ]; then
      lens=${GLM_LENS-1.7}
      [ -n "$lens" ] || continue
    fi
    f=$(big_file "$name") || { fail "synth $name"; continue; }
    for p in "${placements[@]}"; do
      # Prompts with drafting off and on: the MTP block takes in every prompt row, and the
      # output head runs on the sampling row alone (before 2ed74fa, on every row: 0.08x).
      log="$out/mtp-prompt-$name-$(slug "$p").txt"
      # shellcheck disable=SC2086
      if bl bench -m "$f" -p 512,2048 -n 0 -r 2 --spec-type none,draft-mtp $p > "$log" 2>&1; then
        { echo "$name prompts \`$p\`:"; grep -E "\|" "$log"; echo; } | tee -a "$out/table.md"
      else
        fail "mtpspeed prompts $name '$p': $(why "$log") [$log]"
      fi
      for np in ${STREAMS:-1}; do
        log="$out/mtp-$name-$(slug "$p")-np$np.txt"
        # shellcheck disable=SC2086
        if bl bench -m "$f" -p 0 -n 128 -r 2 -np "$np" --spec-type none,draft-mtp \
          --spec-synth-len "$lens" $p > "$log" 2>&1; then
          { echo "$name \`$p\` -np $np:"; grep -E "\||accepted" "$log"; echo; } \
            | tee -a "$out/table.md"
        else
          fail "mtpspeed $name '$p' -np $np: $(why "$log") [$log]"
        fi
        # The default path: drafting gated, the random weights' real (near-zero) acceptance, so
        # the gate should turn drafting off and decode stay near drafting off (issue 48: never
        # below 0.97x with host experts).
        log="$out/mtp-gated-$name-$(slug "$p")-np$np.txt"
        # shellcheck disable=SC2086
        if bl bench -m "$f" -p 0 -n 128 -r 2 -np "$np" --spec-type none,draft-mtp $p \
          > "$log" 2>&1; then
          { echo "$name gated \`$p\` -np $np:"; grep -E "\||accepted|drafting (off|back on)" "$log"
            echo; } | tee -a "$out/table.md"
        else
          fail "mtpspeed gated $name '$p' -np $np: $(why "$log") [$log]"
        fi
      done
    done
  done
  finish
}

# ---- serve ----

serve_suite() {
  local f port log d place
  f=$(big_file "${FILES:-30b}")
  log="$out/serve.log"
  port=$(free_port)
  # llama-server's API with 4 slots, all on the card: the prompt cache (a restored 4,000-token
  # prefix gives the tokens the slot held) and time to first token, restored against not cached.
  dist/bloomery --plugin-dir dist/plugins serve -m "$f" -ngl 99 -np 4 -c 32768 --metrics \
    --port "$port" > "$log" 2>&1 &
  server=$!
  if ! wait_ready "$port" "$server"; then
    fail "serve -ngl 99 did not start: $(why "$log") [$log]"
    finish
  fi
  if python3 scripts/prompt_cache_bench.py --url "http://127.0.0.1:$port" --slots 4 --vocab 151000 \
    --prefix 4000 2>&1 | tee "$out/prompt-cache.txt"; then
    curl -s "http://127.0.0.1:$port/metrics" | grep -E "prompt_cache|n_busy" | grep -v "^#" \
      | tee -a "$out/prompt-cache.txt"
  else
    fail "prompt cache: $(tail -1 "$out/prompt-cache.txt") [$out/prompt-cache.txt]"
  fi
  stop_server "$log"
  for d in ${PREV:-} dist; do
    for place in "-ngl 99" "-ngl 99 -cmoe"; do
      echo "== $d, streams, $place" | tee -a "$out/table.md"
      python3 scripts/server_bench.py --bin "$(dist_bin "$d")" --plugins "$d/plugins" -n 128 \
        --streams 1,2,4 --ctx 8192 --rounds 2 --server-args="$place" \
        --server-log "$out/server-$(slug "$d")-$(slug "$place").log" "$f" 2>&1 \
        | tee -a "$out/table.md" || fail "server_bench $d '$place' [$out/table.md]"
    done
  done
  finish
}

# ---- build ----

build_suite() {
  local bytes limit=$((64 << 20))
  cargo xtask dist
  strip --strip-debug dist/bloomery dist/plugins/*.so
  bytes=$(du -sb dist | cut -f1)
  echo "dist/: $((bytes >> 20)) MiB of the 64 MiB carry (with PREV, the dists carried share it)"
  [ "$bytes" -le $limit ] || fail "dist/ is $((bytes >> 20)) MiB, over the 64 MiB carry"
  finish
}

"${suite}_suite"
