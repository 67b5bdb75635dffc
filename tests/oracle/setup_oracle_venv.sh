#!/usr/bin/env bash
# Sets up the scratch oracle environment used by llamacpp_sync_logits.py, hf_qwen35.py,
# check_qwen35_roundtrip.py and make_qwen35_goldens.sh (not used by CI):
#   * a venv (default /work/oracle/venv) with the pinned PyPI packages below (torch from PyPI is the
#     large CUDA-enabled wheel; only its CPU path is used);
#   * glibc >= 2.38 for the prebuilt libllama.so of llama-cpp-py-sync (it calls __isoc23_strtol & co,
#     GLIBC_2.38). On Debian 12 (glibc 2.36) Debian 13's libc6 package is downloaded with apt through a
#     private apt state folder (the system's apt sources and libc stay as they are) and unpacked to
#     ORACLE_DIR/glibc; llamacpp_sync_logits.py starts llama.cpp through that glibc's ld.so.
# usage: tests/oracle/setup_oracle_venv.sh [ORACLE_DIR]   (default /work/oracle)
set -euo pipefail
dir=${1:-/work/oracle}
mkdir -p "$dir"
if [ ! -x "$dir/venv/bin/python" ]; then
  python3 -m venv "$dir/venv"
fi
"$dir/venv/bin/pip" install -q numpy==2.4.6 cffi==2.1.1 gguf==0.19.0 llama-cpp-py-sync==0.11739 \
  torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0
have=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
if [ "$(printf '%s\n2.38\n' "$have" | sort -V | head -1)" != "2.38" ]; then
  echo "glibc $have < 2.38: unpacking Debian 13's libc6 into $dir/glibc"
  apt_dir=$dir/apt
  mkdir -p "$apt_dir/parts" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$dir/glibc"
  cat > "$apt_dir/parts/trixie.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$apt_dir/parts"
        -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
  apt-get "${opts[@]}" update -qq
  (cd "$apt_dir" && rm -f libc6_*.deb && apt-get "${opts[@]}" download libc6)
  dpkg-deb -x "$apt_dir"/libc6_*.deb "$dir/glibc"
  "$dir/glibc/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --version | head -1
fi
echo "oracle venv ready: $dir/venv/bin/python"
