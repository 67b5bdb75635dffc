//! Kernel sources checked without a GPU: `sim/*_test.cpp` run them under a small CPU emulation of
//! CUDA (`sim/sim.h`) against f64 references — the sequence-state kernels (`cu/recurrent.cuh`:
//! ConvCausal, dilated too and over calls carrying the state, and DeltaRule, step-wise and
//! chunked, several sequences per batch, bad slots, and the fused GDN decode step against an f64 form of the calls it replaces) and the routing kernels
//! (`cu/router.cuh`: the fused logits + choice against the two kernels it replaces and an f64
//! top-k; the gated shared-expert sum) and the decode attention (`cu/attn_split.cuh`: one run and merged runs,
//! windows, sinks, softcap, bad rows, against an f64 attention) and attention's selection form
//! (`cu/attn_select.cuh`: the rows' sorted lists, blocks of heads sharing each cache row, one run
//! a row and merged runs; latent rows of 512 with values from the keys, all 64 of GLM-5.3's heads,
//! sparse lists with unused, repeated and later entries, windows, wide heads, bad rows, against
//! an f64 attention) and the
//! products over per-head weight stacks (`cu/matmul_heads.cuh`: f32 and Q8_0 stacks against f64)
//! and the routed experts' decode kernels with a shared expert slot (`cu/moe.cuh`: against the separate kernels they replace) and
//! the tiled f32 product of batches (`cu/gemm_f32.cuh`: against the in-order f32 sum bit for bit)
//! and the prompt batches' route table, tile list, GLU into Q8_1 and combine (`cu/moe_batch.cuh`:
//! against the lists, blocks and sums they must give) and the per-head norm + RoPE with its cache stores
//! (`cu/rope.cuh`: against an f64 norm and rotation) and the tiled quantized products of prompts
//! (`cu/mmq.cuh`, the int8 mma and ldmatrix emulated by `sim/mma.h`: dense, Q/K/V parts and routed
//! experts against the per-sub-block terms summed in k order, bit for bit; also with the sums made
//! f32 through `MMQ_MAGIC`, and the wide tile of long prompts) and the weight readers
//! (`cu/quant.cuh`: every value of every quantized type against the CPU reference's dequantizers,
//! bit for bit) and the quantized K/V cache store (`cu/cache_store.cuh`, `cu/kv_quant.cuh`: every
//! cache type against the CPU reference's quantizers) and the Walsh-Hadamard rotation of quantized
//! caches (`bl_fwht_f32`: against the CPU's, bit for bit) and the ops of decision heads
//! (`cu/dense.cuh`: LayerNorm, Softmax, Concat, span means and dense attention against f64) and
//! the hyper-connection ops (`cu/hyper.cuh`: Sinkhorn, stream mix and update against f64) and the
//! k-pool indexer (`cu/kpool.cuh`: pooled keys and selections against f64, prompts in chunks,
//! f16 caches, the in-place sort of many pools, bad rows; the QSA pooling over prompt calls and
//! decode past the budget, two slots).
//! DeepSeek-V4's ops are checked against transformers 5.24 (kernels/cpu's fixture
//! `tests/fixtures/deepseek4/ops_hf.json`): the tail and inverse rope (`cu/rope.cuh`), and the
//! compressor and indexer (`cu/compress.cuh`) across calls, with ties from equal scores, and
//! V4.1's index keys (the compressor's Plain and Store forms), and the
//! two-source attention over the window ring and the compressed rows (`cu/attn_comp.cuh`), also
//! against an f64 attention (f16 rings, 64 heads of 512, lists of 512, merged runs, bad rows).
//! Built with the host C++ compiler (`$CXX`, else `c++`); skipped, saying so, when there is none.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `sim/<name>.cpp` and runs it, failing with its report when it fails.
fn run_emulated(name: &str) {
    run_emulated_with(name, &[]);
}

/// run_emulated, passing `args` to the program.
fn run_emulated_with(name: &str, args: &[&Path]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("sim/{name}.cpp"));
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    // The kernels read words through pointers of other types, as CUDA allows: no strict aliasing.
    // `sim/` holds the emulation's stand-in for <cuda_fp16.h>. The headers' static helpers serve
    // several kernels, so a test that includes one need not use them all. The emulation's fibers
    // switch stacks by hand (`sim/sim.h`), which a shadow stack would refuse: the program is not
    // marked as keeping one.
    let flags = [
        "-std=c++20",
        "-O2",
        "-Wall",
        "-Wno-unknown-pragmas",
        "-Wno-unused-function",
        "-fno-strict-aliasing",
        "-fcf-protection=none",
    ];
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("sim");
    match Command::new(&cxx)
        .args(flags)
        .arg("-I")
        .arg(&include)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
    {
        Ok(s) => assert!(s.success(), "{cxx} failed on {}", src.display()),
        Err(e) => {
            eprintln!("skipped: no C++ compiler ({cxx}: {e})");
            return;
        }
    }
    let run = Command::new(&exe)
        .args(args)
        .output()
        .expect("running the emulation");
    let report = String::from_utf8_lossy(&run.stdout);
    eprintln!("{report}");
    assert!(
        run.status.success(),
        "the emulated kernels failed:\n{report}"
    );
}

/// The numpy golden's input streams: splitmix64, `((z >> 40) / 2^23 − 1)·a`
/// (tests/oracle/numpy_kpool.py `draw`).
fn splitmix_draw(seed: u64, n: usize, a: f32) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u32 << 23) as f32 - 1.0) * a
        })
        .collect()
}

/// The cases of host/tests/fixtures/kpool_select.json (f64 numpy, `tests/oracle/numpy_kpool.py`)
/// with their inputs regenerated, as `sim/kpool_test.cpp` reads them: per case the shape (8 i32:
/// n_head, dh, kpool, n_top, tail, len, n_slots, rows), q, w, the cache (pooled sections NaN, so a
/// read before the call's write shows), ape (f32), slots, positions, the golden lists (i32), each
/// row's scores of its complete pools (f64), then the number of golden pooled keys and each as
/// slot, pool (i32) and dh f64 values.
fn kpool_golden_file() -> PathBuf {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../host/tests/fixtures/kpool_select.json"
    );
    let text = std::fs::read_to_string(path).expect("the k-pool golden");
    let g: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let int = |v: &serde_json::Value| v.as_i64().expect("an integer") as i32;
    fn put_i32(file: &mut Vec<u8>, v: i32) {
        file.extend_from_slice(&v.to_le_bytes());
    }
    let mut file = Vec::new();
    for c in g["cases"].as_array().expect("cases") {
        let shape: Vec<i32> = ["n_head", "head_dim", "kpool", "n_top"]
            .iter()
            .map(|k| int(&c[*k]))
            .collect();
        let (nh, dh, kpool) = (shape[0] as usize, shape[1] as usize, shape[2]);
        let tail = c["tail"].as_bool().expect("tail");
        let (len, n_slots) = (int(&c["len"]), int(&c["n_slots"]));
        let slots: Vec<i32> = c["slots"]
            .as_array()
            .expect("slots")
            .iter()
            .map(int)
            .collect();
        let positions: Vec<i32> = c["positions"]
            .as_array()
            .expect("positions")
            .iter()
            .map(int)
            .collect();
        let rows = slots.len();
        for v in shape
            .iter()
            .copied()
            .chain([i32::from(tail), len, n_slots, rows as i32])
        {
            put_i32(&mut file, v);
        }
        let seed = c["seed"].as_u64().expect("seed");
        let mut cache = splitmix_draw(seed + 3, 3 * dh * len as usize * n_slots as usize, 2.0);
        for row in cache.chunks_exact_mut(3 * dh) {
            row[2 * dh..].fill(f32::NAN);
        }
        let floats = [
            splitmix_draw(seed + 1, dh * nh * rows, 1.0),
            splitmix_draw(seed + 2, nh * rows, 1.0),
            cache,
            splitmix_draw(seed + 4, dh * kpool as usize, 1.0),
        ];
        for v in floats.iter().flatten() {
            file.extend_from_slice(&v.to_le_bytes());
        }
        for &v in slots.iter().chain(&positions) {
            put_i32(&mut file, v);
        }
        for row in c["selected"].as_array().expect("selected") {
            for v in row.as_array().expect("a list") {
                put_i32(&mut file, int(v));
            }
        }
        for (r, row) in c["scores"].as_array().expect("scores").iter().enumerate() {
            let scores = row.as_array().expect("a row's scores");
            assert_eq!(scores.len() as i32, (positions[r] + 1) / kpool, "row {r}");
            for v in scores {
                file.extend_from_slice(&v.as_f64().expect("a score").to_le_bytes());
            }
        }
        let pooled = c["pooled"].as_object().expect("pooled");
        let count: usize = pooled
            .values()
            .map(|p| p.as_array().map_or(0, Vec::len))
            .sum();
        put_i32(&mut file, count as i32);
        for (slot, pools) in pooled {
            for (g, key) in pools.as_array().expect("pools").iter().enumerate() {
                put_i32(&mut file, slot.parse().expect("a slot"));
                put_i32(&mut file, g as i32);
                for v in key.as_array().expect("a key") {
                    file.extend_from_slice(&v.as_f64().expect("a value").to_le_bytes());
                }
            }
        }
    }
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kpool_golden.bin");
    std::fs::write(&out, file).expect("writing the cases");
    out
}

#[test]
fn kpool_selection_matches_the_numpy_golden_and_f64_under_emulation() {
    run_emulated_with("kpool_test", &[&kpool_golden_file()]);
}

#[test]
fn dense_graph_ops_match_the_f64_reference_under_emulation() {
    run_emulated("dense_test");
}

#[test]
fn hyper_connection_ops_match_the_f64_reference_under_emulation() {
    run_emulated("hyper_test");
}

#[test]
fn recurrent_kernels_match_the_reference_under_emulation() {
    run_emulated("recurrent_test");
}

#[test]
fn routing_kernels_match_the_reference_under_emulation() {
    run_emulated("router_test");
}

#[test]
fn decode_attention_matches_the_reference_under_emulation() {
    run_emulated("attention_test");
}

#[test]
fn selection_attention_matches_the_reference_under_emulation() {
    run_emulated("attn_select_test");
}

#[test]
fn per_head_products_match_the_reference_under_emulation() {
    run_emulated("matmul_heads_test");
}

#[test]
fn routed_experts_with_a_shared_slot_match_the_separate_kernels_under_emulation() {
    run_emulated("moe_test");
}

#[test]
fn tiled_f32_products_match_the_in_order_sum_under_emulation() {
    run_emulated("gemm_f32_test");
}

#[test]
fn prompt_routing_kernels_match_the_reference_under_emulation() {
    run_emulated("moe_batch_test");
}

#[test]
fn norm_rope_matches_the_f64_reference_under_emulation() {
    run_emulated("rope_test");
}

#[test]
fn tiled_quantized_products_match_the_sub_block_sums_under_emulation() {
    run_emulated("mmq_test");
}

#[test]
fn weight_readers_match_the_cpu_dequantizers_under_emulation() {
    use bloomery_kernels_cpu::quant::dequantize_row;
    use bloomery_kernels_cuda::ops::QUANT_TYPES;
    // A small xorshift generator: the cases need variety, not quality.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut file = Vec::new();
    for (t, code) in QUANT_TYPES {
        let layout = t.layout().expect("a block type");
        let (per, bytes) = (layout.block as usize, layout.bytes as usize);
        let blocks = 2048 / per;
        // Every bit random, scales too: a block whose scale is not finite is compared only for
        // giving no finite value either (quant_test).
        let row: Vec<u8> = (0..blocks * bytes).map(|_| next() as u8).collect();
        let mut values = vec![0f32; blocks * per];
        dequantize_row(t, &row, &mut values).expect("the CPU dequantizes it");
        for v in [code, blocks as i32, bytes as i32, per as i32] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        file.extend_from_slice(&row);
        for v in values {
            file.extend_from_slice(&v.to_le_bytes());
        }
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("quant_cases.bin");
    std::fs::write(&path, file).expect("writing the cases");
    run_emulated_with("quant_test", &[&path]);
}

#[test]
fn quantized_cache_store_matches_the_cpu_quantizers_under_emulation() {
    use bloomery_kernels_cpu::quant::{iquants::quantize_iq4_nl, quantize_row};
    use bloomery_plugin_api::DType;
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    // The kv_quant.cuh codes (KV_Q8_0 = 2 ...).
    let types = [
        (DType::Q8_0, 2),
        (DType::Q4_0, 3),
        (DType::Q4_1, 4),
        (DType::Q5_0, 5),
        (DType::Q5_1, 6),
        (DType::IQ4_NL, 7),
    ];
    // Rows of 256 values (8 blocks), as opcheck's case stores them.
    let (width, rows) = (256usize, 24usize);
    let mut file = Vec::new();
    for (t, code) in types {
        let rb = t.row_bytes(width as u64).expect("whole blocks") as usize;
        // Values in [-2, 2), and a block of zeros, a block of one value and a tie-prone block.
        let mut x: Vec<f32> = (0..rows * width)
            .map(|_| (next() % 4096) as f32 / 1024.0 - 2.0)
            .collect();
        x[..32].fill(0.0);
        x[32..64].fill(0.75);
        for (i, v) in x[64..96].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 0.5;
        }
        let mut want = vec![0u8; rows * rb];
        for (src, dst) in x.chunks_exact(width).zip(want.chunks_exact_mut(rb)) {
            if t == DType::IQ4_NL {
                quantize_iq4_nl(src, dst);
            } else {
                quantize_row(t, src, dst).expect("the CPU quantizes it");
            }
        }
        for v in [code, width as i32, rows as i32, rb as i32] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        for v in &x {
            file.extend_from_slice(&v.to_le_bytes());
        }
        file.extend_from_slice(&want);
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cache_store_cases.bin");
    std::fs::write(&path, file).expect("writing the cases");
    run_emulated_with("cache_store_test", &[&path]);
}

#[test]
fn cache_rotation_matches_the_cpu_bit_for_bit_under_emulation() {
    use bloomery_kernels_cpu::ops::hadamard::walsh_hadamard;
    let mut state = 0x6a09_e667_f3bc_c908_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut file = Vec::new();
    // llama.cpp's chunks: 64 (V, and K of 64-wide heads), 128 and 256 (K of wider heads).
    for (n, count) in [(64usize, 64usize * 7), (128, 128 * 3), (256, 512)] {
        let x: Vec<f32> = (0..count)
            .map(|_| (next() % 8192) as f32 / 1024.0 - 4.0)
            .collect();
        let mut want = x.clone();
        walsh_hadamard(&mut want, n).expect("the CPU rotates it");
        for v in [n as i32, count as i32] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        for v in x.iter().chain(&want) {
            file.extend_from_slice(&v.to_le_bytes());
        }
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fwht_cases.bin");
    std::fs::write(&path, file).expect("writing the cases");
    run_emulated_with("fwht_test", &[&path]);
}

/// The committed transformers 5.24 fixture of DeepSeek-V4's ops (kernels/cpu's
/// tests/fixtures/deepseek4/ops_hf.json).
fn deepseek4_golden() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../cpu/tests/fixtures/deepseek4/ops_hf.json"
    );
    let text = std::fs::read_to_string(path).expect("the DeepSeek-V4 fixture");
    serde_json::from_str(&text).expect("JSON")
}

/// Little-endian values for the emulated tests' case files.
#[derive(Default)]
struct CaseFile(Vec<u8>);

impl CaseFile {
    fn i32s(&mut self, v: impl IntoIterator<Item = i32>) {
        v.into_iter()
            .for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    fn f32s(&mut self, v: impl IntoIterator<Item = f32>) {
        v.into_iter()
            .for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    fn f64s(&mut self, v: impl IntoIterator<Item = f64>) {
        v.into_iter()
            .for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    /// The JSON array `v` as f32 values.
    fn json_f32s(&mut self, v: &serde_json::Value) {
        let a = v.as_array().expect("an array");
        self.f32s(a.iter().map(|x| x.as_f64().expect("a number") as f32));
    }
    /// The JSON array `v` as i32 values.
    fn json_i32s(&mut self, v: &serde_json::Value) {
        let a = v.as_array().expect("an array");
        self.i32s(a.iter().map(|x| x.as_i64().expect("an integer") as i32));
    }
    /// Writes the file under the test's temporary folder as `name`.
    fn write(self, name: &str) -> PathBuf {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&path, self.0).expect("writing the cases");
        path
    }
}

/// DeepSeek-V4's rope of `kind` as its graph builds it ("main": θ `rope_theta` plain;
/// "compress": `compress_theta` with YaRN and llama.cpp b11434's `dsv4_rope_attn_factor`), NORM
/// pairs on the last `rope_dims` dims of `head_dim`-wide heads.
fn deepseek4_rope(
    g: &serde_json::Value,
    kind: &str,
    head_dim: u32,
) -> bloomery_plugin_api::op::RopeParams {
    use bloomery_plugin_api::op::{RopeMode, RopeParams};
    let int = |k: &str| g[k].as_u64().expect("an integer") as u32;
    let float = |k: &str| g[k].as_f64().expect("a number") as f32;
    let plain = RopeParams {
        mode: RopeMode::Norm,
        n_dims: int("rope_dims"),
        offset: head_dim - int("rope_dims"),
        sections: [0; 4],
        freq_base: float("rope_theta"),
        freq_scale: 1.0,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 0,
        inverse: false,
    };
    match kind {
        "main" => plain,
        "compress" => {
            let factor = float("yarn_factor");
            RopeParams {
                freq_base: float("compress_theta"),
                freq_scale: 1.0 / factor,
                ext_factor: 1.0,
                attn_factor: 1.0 / (1.0 + 0.1 * factor.ln()),
                n_ctx_orig: int("yarn_orig_ctx"),
                ..plain
            }
        }
        other => panic!("rope kind {other}"),
    }
}

/// A rope's kernel terms as `sim/deepseek4_test.cpp` reads them: n_dims, offset (i32),
/// log2 of the base, mscale (f64), freq_scale, ext_factor and the two correction dims (f32).
fn put_rope(file: &mut CaseFile, p: &bloomery_plugin_api::op::RopeParams) {
    let (corr, mscale) = bloomery_kernels_cpu::ops::rope::RopeParams::from_abi(p).yarn_terms();
    file.i32s([p.n_dims as i32, p.offset as i32]);
    file.f64s([f64::from(p.freq_base).log2(), mscale]);
    file.f32s([p.freq_scale, p.ext_factor, corr[0], corr[1]]);
}

#[test]
fn deepseek4_tail_rope_matches_transformers_under_emulation() {
    let g = deepseek4_golden();
    let int = |v: &serde_json::Value| v.as_u64().expect("an integer") as i32;
    let (hd, nh) = (int(&g["head_dim"]), int(&g["n_head"]));
    let mut file = CaseFile::default();
    let cases = g["rope"].as_array().expect("rope cases");
    file.i32s([cases.len() as i32]);
    for c in cases {
        file.i32s([int(&c["rows"]), hd, nh]);
        put_rope(
            &mut file,
            &deepseek4_rope(&g, c["kind"].as_str().expect("kind"), hd as u32),
        );
        file.json_i32s(&c["pos"]);
        for key in ["x", "fwd", "inv"] {
            file.json_f32s(&c[key]);
        }
    }
    run_emulated_with("deepseek4_rope_test", &[&file.write("deepseek4_rope.bin")]);
}

/// One Compress record of `sim/compress_test.cpp`: the fixture case `c`'s inputs named with
/// `prefix` ("" for the attention rows, "i_" for the index keys) at `width`.
fn put_compress(
    file: &mut CaseFile,
    g: &serde_json::Value,
    c: &serde_json::Value,
    prefix: &str,
    width: u32,
) {
    let int = |v: &serde_json::Value| v.as_i64().expect("an integer") as i32;
    let (rows, ratio) = (int(&c["rows"]), int(&c["ratio"]));
    // V4's ratio-4 compressor overlaps two series; one call, then calls cut inside windows.
    let overlap = ratio == 4;
    let cuts = [ratio + 1, ratio + 2, rows - 3, rows];
    for calls in [&cuts[3..], &cuts[..]] {
        file.i32s([
            0,
            ratio,
            i32::from(overlap),
            width as i32,
            rows,
            int(&c["n_compressed"]),
        ]);
        file.i32s([calls.len() as i32]);
        file.i32s(calls.iter().copied());
        put_rope(file, &deepseek4_rope(g, "compress", width));
        file.f32s([g["eps"].as_f64().expect("eps") as f32]);
        for key in ["kv", "score", "ape", "norm"] {
            file.json_f32s(&c[format!("{prefix}{key}").as_str()]);
        }
        let want = if prefix.is_empty() {
            "compressed"
        } else {
            "i_keys"
        };
        file.json_f32s(&c[want]);
    }
}

#[test]
fn deepseek4_compressor_and_indexer_match_transformers_under_emulation() {
    let g = deepseek4_golden();
    let int = |v: &serde_json::Value| v.as_i64().expect("an integer") as i32;
    let mut file = CaseFile::default();
    for c in g["compress"].as_array().expect("compress cases") {
        put_compress(&mut file, &g, c, "", int(&g["head_dim"]) as u32);
        if int(&c["ratio"]) == 4 {
            put_compress(&mut file, &g, c, "i_", int(&g["index_dim"]) as u32);
        }
    }
    // The indexer over the ratio-4 case's keys, in slot 1 of two (slot 0 garbage).
    let c = &g["compress"][0];
    let (di, n_out) = (int(&g["index_dim"]), int(&c["n_compressed"]));
    file.i32s([
        1,
        int(&g["index_heads"]),
        di,
        int(&c["ratio"]),
        int(&g["top_k"]),
    ]);
    file.i32s([int(&c["rows"]), n_out]);
    file.json_f32s(&c["i_q"]);
    let scale = c["i_scale"].as_f64().expect("i_scale") as f32;
    let w = c["i_w"].as_array().expect("i_w");
    file.f32s(
        w.iter()
            .map(|v| v.as_f64().expect("a number") as f32 * scale),
    );
    file.f32s(std::iter::repeat_n(9.0, (di * n_out) as usize));
    file.json_f32s(&c["i_keys"]);
    file.json_i32s(&c["i_ids"]);
    // Every score equal (identical keys): the ABI's ties go to the lower row, so each list is
    // its first visible rows ascending, then -1.
    let (nh, dh, ratio, top_k, rows, n_out) = (2, 8, 4, 3, 20, 5);
    file.i32s([1, nh, dh, ratio, top_k, rows, n_out]);
    file.f32s(std::iter::repeat_n(1.0, (dh * nh * rows) as usize));
    file.f32s(std::iter::repeat_n(0.5, (nh * rows) as usize));
    file.f32s(std::iter::repeat_n(0.25, (dh * n_out * 2) as usize));
    for p in 0..rows {
        let visible = (p + 1) / ratio;
        file.i32s((0..top_k).map(|i| if i < visible { i } else { -1 }));
    }
    for c in g["v41_keys"].as_array().expect("v41_keys cases") {
        put_v41_keys(&mut file, &g, c);
    }
    run_emulated_with("compress_test", &[&file.write("deepseek4_compress.bin")]);
}

/// The V4.1 index-key records (kind 2) of `sim/compress_test.cpp` for the fixture case `c`: one
/// call, then calls cut inside windows.
fn put_v41_keys(file: &mut CaseFile, g: &serde_json::Value, c: &serde_json::Value) {
    let int = |v: &serde_json::Value| v.as_i64().expect("an integer") as i32;
    let (rows, ratio) = (int(&c["rows"]), int(&c["ratio"]));
    let (w, di) = (int(&g["head_dim"]), int(&g["index_dim"]));
    for calls in [vec![rows], vec![1, ratio + 2, rows - 3, rows]] {
        file.i32s([2, ratio, w, di, rows, int(&c["n_compressed"])]);
        file.i32s([calls.len() as i32]);
        file.i32s(calls.iter().copied());
        put_rope(file, &deepseek4_rope(g, "compress", w as u32));
        put_rope(file, &deepseek4_rope(g, "compress", di as u32));
        file.f32s([g["eps"].as_f64().expect("eps") as f32]);
        for key in ["kv", "score", "norm", "wk", "k_norm", "plain", "keys"] {
            file.json_f32s(&c[key]);
        }
    }
}

#[test]
fn deepseek4_two_source_attention_matches_transformers_and_f64_under_emulation() {
    let g = deepseek4_golden();
    let int = |v: &serde_json::Value| v.as_i64().expect("an integer") as i32;
    let (h, d, top_k) = (int(&g["n_head"]), int(&g["head_dim"]), int(&g["top_k"]));
    let mut file = CaseFile::default();
    for c in g["attention"].as_array().expect("attention cases") {
        let selected = c["layer_type"] == "compressed_sparse_attention";
        let kept = c["kept"].as_array().expect("kept");
        let (n, n_comp) = (kept.len() as i32, int(&c["n_compressed"]));
        file.i32s([
            1,
            h,
            d,
            int(&c["window"]),
            int(&c["rows"]),
            n_comp,
            n,
            top_k,
        ]);
        file.i32s([i32::from(selected)]);
        file.f32s([c["scale"].as_f64().expect("scale") as f32]);
        for key in ["q", "kv", "compressed", "sinks", "out"] {
            file.json_f32s(&c[key]);
        }
        file.json_i32s(&c["kept"]);
        if selected {
            // The indexer's picks as the mask shows them, from the highest row down, then −1
            // (CompSelect lists them in its own order).
            let visible = c["comp_visible"].as_array().expect("comp_visible");
            for row in visible.chunks(n_comp as usize) {
                let mut l: Vec<i32> = (0..n_comp)
                    .rev()
                    .filter(|&j| row[j as usize] == 1)
                    .collect();
                assert!(l.len() <= top_k as usize, "{} picks", l.len());
                l.resize(top_k as usize, -1);
                file.i32s(l);
            }
        }
    }
    run_emulated_with("attn_comp_test", &[&file.write("deepseek4_attention.bin")]);
}
