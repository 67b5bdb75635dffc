//! llama.cpp's quantized K/V cache blocks against ours: layer 0 of the tiny qwen3moe file's
//! prompt pass under `-ctk q4_0 -ctv q4_0`, dumped from llama.cpp (fixtures/kv_rotation/
//! PROVENANCE.md). llama.cpp stores K and V rotated by the Walsh-Hadamard transform before it
//! quantizes them; our quantizer on the rotated rows must give its bytes, every block.

use bloomery_kernels_cpu::ops::hadamard::walsh_hadamard;
use bloomery_kernels_cpu::quant::quantize_kv_row;
use bloomery_plugin_api::op::{kv_rotation_k, kv_rotation_v};
use bloomery_plugin_api::DType;

/// Prompt tokens, KV heads and head width of the dump.
const TOKENS: usize = 36;
const HEADS: usize = 2;
const DIM: usize = 64;
/// Bytes of one head row of Q4_0 (two blocks).
const ROW: usize = DIM / 32 * 18;

struct Dump {
    k: Vec<f32>,
    v: Vec<f32>,
    k_blocks: Vec<u8>,
    v_blocks: Vec<u8>,
}

/// The fixture: K and V after RoPE `[TOKENS][HEADS][DIM]` f32, then llama.cpp's K and V cache
/// rows `[TOKENS][HEADS][ROW]`.
fn dump() -> Dump {
    let b = include_bytes!("fixtures/kv_rotation/qwen3moe_tiny_q4_0_layer0.bin");
    let f = TOKENS * HEADS * DIM * 4;
    let q = TOKENS * HEADS * ROW;
    assert_eq!(b.len(), 2 * f + 2 * q);
    let floats = |s: &[u8]| -> Vec<f32> {
        s.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    Dump {
        k: floats(&b[..f]),
        v: floats(&b[f..2 * f]),
        k_blocks: b[2 * f..2 * f + q].to_vec(),
        v_blocks: b[2 * f + q..].to_vec(),
    }
}

/// Head rows of `x` whose Q4_0 bytes, after rotating in chunks of `rot` (0: none), differ from
/// `want`.
fn differing(x: &[f32], want: &[u8], rot: usize) -> usize {
    let mut bad = 0;
    for (row, want) in x.chunks_exact(DIM).zip(want.chunks_exact(ROW)) {
        let mut r = row.to_vec();
        if rot > 0 {
            walsh_hadamard(&mut r, rot).unwrap();
        }
        let mut got = [0u8; ROW];
        quantize_kv_row(DType::Q4_0, &r, &mut got).unwrap();
        bad += usize::from(got[..] != want[..]);
    }
    bad
}

#[test]
fn rotated_rows_quantize_to_llama_cpp_blocks() {
    let d = dump();
    let (rk, rv) = (kv_rotation_k(DIM as u32), kv_rotation_v(DIM as u32));
    assert_eq!((rk, rv), (64, 64));
    assert_eq!(differing(&d.k, &d.k_blocks, rk as usize), 0, "K");
    assert_eq!(differing(&d.v, &d.v_blocks, rv as usize), 0, "V");
}

#[test]
fn unrotated_rows_do_not() {
    // What our store writes today: no head row of llama.cpp's cache.
    let d = dump();
    assert_eq!(differing(&d.k, &d.k_blocks, 0), TOKENS * HEADS);
    assert_eq!(differing(&d.v, &d.v_blocks, 0), TOKENS * HEADS);
}
