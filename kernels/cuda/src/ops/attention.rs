//! Launches of attention over the K/V cache (`cu/attention.cuh`). Calls over K and V caches of one
//! type, f16, Q8_0 or Q4_0 (dequantized on load), with head
//! sizes the flash form has take it, on the tensor cores: batches (prompts) in one launch, decode
//! split along the visible positions into enough blocks to fill the card, the last block of each
//! group merging the splits. Decode of few rows takes the decode form instead, which also splits a
//! short context's heads among blocks. Other calls (f32 caches, other head sizes, K and V of
//! different types, Q4_1, Q5_0, Q5_1 and IQ4_NL caches) take one block per (row, head) holding
//! every score, the quantized ones read a value at a time. Latent (values from the keys), sparse,
//! wider-headed and DeepSeek-V4's two-source calls (compressed rows) take the selection form
//! (`attention_select`).

use bloomery_plugin_api::op::{AttentionParams, OpKind, OpSupport};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::LaunchConfig;

use super::attention_select::takes_select_form;
use super::cache_store::{kv_code, KV_TYPES};
use super::{claim, driver_err, f32_only, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![claim(OpKind::Attention, &KV_TYPES)]
}

/// Batches of at least this many rows take the flash form in one launch (fewer: split).
const FLASH_MIN_ROWS: u64 = 16;
/// Blocks a split flash launch aims at (about two per SM of a large card).
const SPLIT_BLOCKS: u64 = 256;
/// Most splits of one launch (`FA_MAX_SPLITS`: the merge holds two per lane).
const MAX_SPLITS: u64 = 64;
/// Split counters the launcher keeps zeroed on the card: one per (pair block, KV head) of a
/// split flash launch, which has fewer than SPLIT_BLOCKS of them (`splits`), and one per (row,
/// KV head, part of its heads) of a decode launch (`decode_parts`).
pub(super) const SPLIT_COUNTERS: u64 = 1024;
/// Most (row, head) pairs per block of the flash form (`FA_ROWS`).
const FA_ROWS: u64 = 64;
/// Threads per block of the flash form (`FA_WARPS` warps).
const FA_THREADS: u32 = 128;
/// The flash form's cache types (K and V of one type), head sizes (dk = dv), key positions per
/// staged tile (`FA_KT_<d>`) and kernels.
const FLASH: [(DType, u32, u64, &str); 9] = [
    (DType::F16, 64, 64, "bl_flash_attn_f16_64"),
    (DType::F16, 128, 64, "bl_flash_attn_f16_128"),
    (DType::F16, 256, 32, "bl_flash_attn_f16_256"),
    (DType::Q8_0, 64, 64, "bl_flash_attn_q8_0_64"),
    (DType::Q8_0, 128, 64, "bl_flash_attn_q8_0_128"),
    (DType::Q8_0, 256, 32, "bl_flash_attn_q8_0_256"),
    (DType::Q4_0, 64, 64, "bl_flash_attn_q4_0_64"),
    (DType::Q4_0, 128, 64, "bl_flash_attn_q4_0_128"),
    (DType::Q4_0, 256, 32, "bl_flash_attn_q4_0_256"),
];
/// The decode form's kernels by cache type and head size (K and V of one type, dk = dv, as the
/// flash form's).
const DECODE: [(DType, u32, &str); 9] = [
    (DType::F16, 64, "bl_attn_decode_f16_64"),
    (DType::F16, 128, "bl_attn_decode_f16_128"),
    (DType::F16, 256, "bl_attn_decode_f16_256"),
    (DType::Q8_0, 64, "bl_attn_decode_q8_0_64"),
    (DType::Q8_0, 128, "bl_attn_decode_q8_0_128"),
    (DType::Q8_0, 256, "bl_attn_decode_q8_0_256"),
    (DType::Q4_0, 64, "bl_attn_decode_q4_0_64"),
    (DType::Q4_0, 128, "bl_attn_decode_q4_0_128"),
    (DType::Q4_0, 256, "bl_attn_decode_q4_0_256"),
];
/// Most heads per KV head of the decode form (`DEC_MAX_G`).
const DEC_MAX_G: u64 = 8;
/// Key positions per tile of the decode form (`DEC_KT`): its runs are whole tiles.
const DEC_KT: u64 = 64;
/// Dynamic shared memory every block may use without opting in.
const SMEM_DEFAULT: u32 = 48 * 1024;
/// Threads per block of the one-block-per-(row, head) form.
const SCORES_THREADS: u32 = 128;

/// The kernel a call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Flash: grid (ceil(rows · G / pairs per block), n_head_kv, splits); tiles of `kt`
    /// positions.
    Flash {
        name: &'static str,
        smem: u32,
        kt: u64,
    },
    /// Decode without the tensor cores: the flash form's split launch (a block per row, KV head
    /// and split), its partials and merge; runs of DEC_KT-position tiles.
    Decode { name: &'static str },
    /// One block per (row, head), every score of the row in shared memory; `types` the K and V
    /// type codes of the run-time-typed kernel (`bl_attention_kv`).
    Scores {
        name: &'static str,
        smem: u32,
        types: Option<(i32, i32)>,
    },
}

/// Shared memory of a flash block for head size `d` and `kt`-position tiles: q's two parts for
/// FA_ROWS rows and one key and one value tile, rows padded by 8 halfs.
fn flash_smem(d: u32, kt: u64) -> u32 {
    ((2 * FA_ROWS + 2 * kt) * (u64::from(d) + 8) * 2) as u32
}

/// Picks the form for caches of `k`/`v` element types, `len` positions per slot and heads of
/// `dk`/`dv`, on a card whose blocks may opt into `optin` bytes of shared memory.
fn choose(k: DType, v: DType, dk: u32, dv: u32, len: u64, optin: u32) -> Result<Form, PluginError> {
    let (kc, vc) = match (kv_code(k), kv_code(v)) {
        (Some(kc), Some(vc)) => (kc, vc),
        _ => {
            return Err(PluginError::unsupported(
                format!("attention over a {k} K and {v} V cache"),
                &[],
            ))
        }
    };
    for (t, d) in [(k, dk), (v, dv)] {
        if t.is_quantized() && !d.is_multiple_of(32) {
            return Err(PluginError::invalid(format!(
                "attention over a {t} cache needs heads of a multiple of 32 values, not {d}"
            )));
        }
    }
    let (scores, types) = match (k, v) {
        (DType::F32, DType::F32) => ("bl_attention_f32", None),
        (DType::F16, DType::F16) => ("bl_attention_f16", None),
        _ => ("bl_attention_kv", Some((kc, vc))),
    };
    let scores_smem = len.saturating_mul(4).min(u64::from(u32::MAX)) as u32;
    let flash = (k == v && dk == dv)
        .then(|| FLASH.iter().find(|f| f.0 == k && f.1 == dk))
        .flatten()
        .map(|&(_, d, kt, name)| Form::Flash {
            name,
            smem: flash_smem(d, kt),
            kt,
        })
        .filter(|f| matches!(f, Form::Flash { smem, .. } if *smem <= optin));
    match flash {
        Some(f) => Ok(f),
        _ if scores_smem <= optin => Ok(Form::Scores {
            name: scores,
            smem: scores_smem,
            types,
        }),
        _ => Err(PluginError::unsupported(
            format!(
                "attention over {len} cached positions per slot with {k} caches and heads of \
                 {dk}/{dv} on this card (its blocks hold the scores of at most {} positions)",
                optin / 4
            ),
            &[
                "K and V caches of one type (f16, q8_0 or q4_0) with heads of 64, 128 or 256",
                "a smaller context per slot",
            ],
        )),
    }
}

/// The form for `rows` rows of `g` heads of `d` per KV head over caches of type `t`: the flash
/// form's decode calls (fewer than FLASH_MIN_ROWS rows) take the decode form when it holds their
/// heads, as a row's G heads fill few of a tensor-core tile's 16 rows.
fn for_rows(form: Form, rows: u64, g: u64, d: u32, t: DType) -> Form {
    match form {
        Form::Flash { .. } if rows < FLASH_MIN_ROWS && g <= DEC_MAX_G => DECODE
            .iter()
            .find(|e| e.0 == t && e.1 == d)
            .map_or(form, |&(_, _, name)| Form::Decode { name }),
        f => f,
    }
}

/// (row, head) pairs per block of a flash launch over `rows` rows of `g` heads per KV head: a
/// row's heads for decode (so that several sequences' rows run in parallel blocks), FA_ROWS for
/// batches and for more heads per KV head than a block holds.
fn pairs_per_block(rows: u64, g: u64) -> u64 {
    if rows < FLASH_MIN_ROWS && g <= FA_ROWS {
        g
    } else {
        FA_ROWS
    }
}

/// The most parts a decode launch of `rows` rows may split each KV head's `g` heads into (the
/// kernel picks per row how many it uses, `decode_head_parts`): a head each where the split
/// counters hold a counter per (row, KV head, part), else 1.
fn decode_parts(rows: u64, g: u64, n_kv: u64) -> u64 {
    if rows * n_kv * g <= SPLIT_COUNTERS {
        g
    } else {
        1
    }
}

/// Splits of a flash launch of `pair_blocks` × `n_kv` blocks over caches of `len` positions of
/// `kt`-position tiles: one for batches, else enough to reach about SPLIT_BLOCKS blocks, at most
/// one per tile.
fn splits(rows: u64, pair_blocks: u64, n_kv: u64, len: u64, kt: u64) -> u64 {
    if rows >= FLASH_MIN_ROWS {
        return 1;
    }
    let want = SPLIT_BLOCKS.div_ceil((pair_blocks * n_kv).max(1));
    want.min(len.div_ceil(kt)).clamp(1, MAX_SPLITS)
}

impl Launcher {
    /// Attention of the rows of q over the caches (sources q, K cache, V cache, slots,
    /// positions, and sinks when the op has them).
    pub(super) fn attention<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: AttentionParams,
    ) -> Result<(), PluginError> {
        if takes_select_form(&p) {
            return self.attention_select(addr, src, c, p);
        }
        let (q, kc, vc, slots, pos) = (src(0)?, src(1)?, src(2)?, src(3)?, src(4)?);
        f32_only(q, "Attention q")?;
        f32_only(&c.dst, "Attention dst")?;
        let rows = slots.elements();
        let (nh, nkv, dk, dv) = (p.n_head, p.n_head_kv, p.dk, p.dv);
        if nkv == 0
            || nh % nkv != 0
            || q.elements() != u64::from(dk * nh) * rows
            || c.dst.elements() != u64::from(dv * nh) * rows
            || pos.elements() != rows
            || kc.ne[0] != u64::from(dk * nkv)
            || vc.ne[0] != u64::from(dv * nkv)
            || kc.ne[1] != vc.ne[1]
            || kc.ne[2] != vc.ne[2]
        {
            return Err(PluginError::invalid("Attention shapes"));
        }
        let form = choose(kc.dtype, vc.dtype, dk, dv, kc.ne[1], self.smem_optin)?;
        let sinks = if p.sinks {
            let s = src(5)?;
            f32_only(s, "sinks")?;
            addr(s, "sinks")?
        } else {
            0u64
        };
        let (len, ns) = (kc.ne[1] as i32, kc.ne[2] as i32);
        let (mut pq, pk, pv) = (addr(q, "q")?, addr(kc, "k cache")?, addr(vc, "v cache")?);
        // llama.cpp's Walsh-Hadamard rotation of quantized caches: q rotated as the keys were
        // (into the scratch, after the output's Q8_1 copy and the split partials), the output
        // rotated back in place after the launch.
        let rotate_q = p.rot_k > 0 && kc.dtype.is_quantized();
        let rotate_out = p.rot_v > 0 && vc.dtype.is_quantized();
        let (ps, pp, po) = (
            addr(slots, "slots")?,
            addr(pos, "positions")?,
            addr(&c.dst, "dst")?,
        );
        let (nhi, nkvi, dki, dvi, rowsi) =
            (nh as i32, nkv as i32, dk as i32, dv as i32, rows as i32);
        let window = p.window as i32;
        let err = self.error_word;
        // The output's Q8_1 copy too, when a quantized product reads it next.
        let wanted = self.product_next.load(std::sync::atomic::Ordering::Relaxed)
            && dv.is_multiple_of(32)
            && !rotate_out;
        let g = u64::from(nh / nkv);
        let form = for_rows(form, rows, g, dk, kc.dtype);
        // A decode launch has a block per row and KV head along x and y; its blocks along z
        // take runs of positions, or parts of the heads and runs of each (at least as many blocks
        // as parts).
        let (pair_blocks, pbi, split) = match form {
            Form::Flash { kt, .. } => {
                let pb = pairs_per_block(rows, g);
                let pair_blocks = (rows * g).div_ceil(pb);
                let split = splits(rows, pair_blocks, u64::from(nkv), kc.ne[1], kt);
                (pair_blocks, pb as i32, split)
            }
            Form::Decode { .. } => {
                let parts = decode_parts(rows, g, u64::from(nkv));
                let split = splits(rows, rows, u64::from(nkv), kc.ne[1], DEC_KT).max(parts);
                (rows, (g / parts) as i32, split)
            }
            Form::Scores { .. } => (rows, 0, 1),
        };
        // Split partials go in the scratch after the output's Q8_1 copy: o, then max and sum,
        // per split and output row; a rotated q after them. The scratch is sized for all before
        // the copy takes its start.
        let copy_bytes = (c.dst.elements() / 32 * 36).div_ceil(256) * 256;
        let part_bytes = if split > 1 {
            (split * rows * u64::from(nh) * (u64::from(dv) + 2) * 4).div_ceil(256) * 256
        } else {
            0
        };
        let q_bytes = if rotate_q { q.elements() * 4 } else { 0 };
        let part = if split > 1 || rotate_q {
            let base = self.scratch(copy_bytes + part_bytes + q_bytes)?;
            if rotate_q {
                let rotated = base + copy_bytes + part_bytes;
                self.rotate(pq, rotated, q.elements(), p.rot_k)?;
                pq = rotated;
            }
            if split > 1 {
                base + copy_bytes
            } else {
                0
            }
        } else {
            0u64
        };
        let copy = self.copy_slot(wanted, po, c.dst.elements())?;
        let oq = copy.map_or(0u64, |c| c.q);
        let (name, smem) = match form {
            Form::Flash { name, smem, .. } | Form::Scores { name, smem, .. } => (name, smem),
            Form::Decode { name, .. } => (name, 0),
        };
        let f = self.func_smem(name, smem)?;
        let mut l = self.args(&f);
        l.arg(&pq)
            .arg(&pk)
            .arg(&pv)
            .arg(&ps)
            .arg(&pp)
            .arg(&po)
            .arg(&oq);
        let cfg = match form {
            Form::Flash { .. } | Form::Decode { .. } => {
                l.arg(&part)
                    .arg(&self.split_counters)
                    .arg(&rowsi)
                    .arg(&pbi)
                    .arg(&nhi)
                    .arg(&nkvi);
                LaunchConfig {
                    grid_dim: (pair_blocks as u32, nkv, split as u32),
                    block_dim: (FA_THREADS, 1, 1),
                    shared_mem_bytes: smem,
                }
            }
            Form::Scores { .. } => {
                l.arg(&nhi).arg(&nkvi).arg(&dki).arg(&dvi);
                LaunchConfig {
                    grid_dim: ((rows * u64::from(nh)) as u32, 1, 1),
                    block_dim: (SCORES_THREADS, 1, 1),
                    shared_mem_bytes: smem,
                }
            }
        };
        l.arg(&len).arg(&ns);
        l.arg(&p.scale)
            .arg(&p.softcap)
            .arg(&window)
            .arg(&sinks)
            .arg(&err);
        let types = match form {
            Form::Scores { types, .. } => types,
            _ => None,
        };
        if let Some((kt, vt)) = &types {
            l.arg(kt).arg(vt);
        }
        if rows > 0 {
            // SAFETY: the arguments follow the kernel's parameters for its form; q, dst and the
            // caches hold the shapes checked above; slots and positions are checked on the card;
            // the partials of a split launch fit the scratch sized above, and its blocks the
            // split counters (`splits`).
            unsafe { l.launch(cfg) }.map_err(driver_err(name))?;
            if rotate_out {
                self.rotate(po, po, c.dst.elements(), p.rot_v)?;
            }
        }
        if let Some(copy) = copy {
            self.keep_quantized(copy)?;
        }
        Ok(())
    }

    /// The kernel `name`, allowed `smem` bytes of dynamic shared memory when that is more than
    /// every block may use by default.
    pub(super) fn func_smem(
        &self,
        name: &'static str,
        smem: u32,
    ) -> Result<cudarc::driver::CudaFunction, PluginError> {
        let f = self.func(name)?;
        if smem > SMEM_DEFAULT {
            let mut set = self
                .smem_allowed
                .lock()
                .map_err(|_| PluginError::device("shared-memory table poisoned"))?;
            if set.get(name).is_none_or(|&s| s < smem) {
                f.set_attribute(
                    CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(driver_err("cuFuncSetAttribute"))?;
                set.insert(name, smem);
            }
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: u32 = 227 * 1024;

    #[test]
    fn f16_caches_take_the_flash_form() {
        let f = choose(DType::F16, DType::F16, 128, 128, 4096, H200).unwrap();
        assert_eq!(
            f,
            Form::Flash {
                name: "bl_flash_attn_f16_128",
                smem: (2 * 64 + 2 * 64) * 136 * 2,
                kt: 64,
            }
        );
        // Decode takes it too, over short and long caches (split, below).
        for len in [64, 4096, 100_000] {
            let d = choose(DType::F16, DType::F16, 128, 128, len, H200).unwrap();
            assert_eq!(d, f, "{len}");
        }
        // f32 caches keep the scores form, opting into more shared memory.
        let f32c = choose(DType::F32, DType::F32, 128, 128, 20_000, H200).unwrap();
        assert!(matches!(f32c, Form::Scores { smem: 80_000, .. }));
        // Quantized caches of one type take it too, mixed types the run-time-typed scores form.
        let q8 = choose(DType::Q8_0, DType::Q8_0, 128, 128, 4096, H200).unwrap();
        assert!(matches!(
            q8,
            Form::Flash {
                name: "bl_flash_attn_q8_0_128",
                ..
            }
        ));
        let mixed = choose(DType::Q8_0, DType::F16, 128, 128, 4096, H200).unwrap();
        assert!(matches!(
            mixed,
            Form::Scores {
                name: "bl_attention_kv",
                types: Some((2, 1)),
                ..
            }
        ));
        let odd = choose(DType::Q4_0, DType::Q4_0, 80, 80, 4096, H200).unwrap_err();
        assert!(odd.to_string().contains("multiple of 32"), "{odd}");
    }

    #[test]
    fn decode_takes_a_block_per_row_and_batches_full_blocks() {
        assert_eq!(pairs_per_block(1, 8), 8);
        assert_eq!(pairs_per_block(15, 16), 16);
        assert_eq!(pairs_per_block(16, 8), FA_ROWS);
        assert_eq!(pairs_per_block(4, 128), FA_ROWS);
    }

    #[test]
    fn decode_splits_fill_the_card_and_batches_do_not_split() {
        // One row of 32 heads over 8 KV heads: one pair block per KV head, so 32 splits ...
        assert_eq!(splits(1, 1, 8, 32_768, 64), 32);
        // ... but never more than the cache has tiles, nor more than MAX_SPLITS.
        assert_eq!(splits(1, 1, 8, 100, 64), 2);
        assert_eq!(splits(1, 1, 1, 1 << 20, 64), MAX_SPLITS);
        assert_eq!(splits(512, 64, 4, 32_768, 64), 1);
        // A split launch has fewer blocks per split than there are split counters.
        for blocks in [1, 7, 100, 255, 256, 257, 4000] {
            let s = splits(15, blocks, 1, 1 << 20, 64);
            assert!(
                s == 1 || blocks < SPLIT_COUNTERS,
                "{blocks} blocks, {s} splits"
            );
        }
    }

    #[test]
    fn decode_splits_heads_while_the_counters_hold_them() {
        // One row of 32 heads over 4 KV heads: up to a head a block, the launch at least 8
        // blocks deep.
        assert_eq!(decode_parts(1, 8, 4), 8);
        assert_eq!(decode_parts(15, 8, 8), 8);
        // 15 rows over 16 KV heads of 8 would need 1,920 counters: the heads stay together.
        assert_eq!(decode_parts(15, 8, 16), 1);
    }

    #[test]
    fn other_caches_and_heads_take_the_scores_form_or_a_named_error() {
        let f32c = choose(DType::F32, DType::F32, 128, 128, 4096, H200).unwrap();
        assert!(matches!(
            f32c,
            Form::Scores {
                name: "bl_attention_f32",
                ..
            }
        ));
        let odd = choose(DType::F16, DType::F16, 96, 96, 4096, H200).unwrap();
        assert!(matches!(odd, Form::Scores { .. }));
        let mla = choose(DType::F16, DType::F16, 192, 128, 4096, H200).unwrap();
        assert!(matches!(mla, Form::Scores { .. }));
        // f32 scores of 100,000 positions need 400 KB: more than any block holds.
        let e = choose(DType::F32, DType::F32, 128, 128, 100_000, H200).unwrap_err();
        assert!(e.to_string().contains("100000 cached positions"), "{e}");
        // A card whose blocks cannot hold the 256-wide flash tiles keeps the scores form.
        let small = choose(DType::F16, DType::F16, 256, 256, 4096, 64 * 1024).unwrap();
        assert!(matches!(small, Form::Scores { .. }));
    }

    #[test]
    fn decode_calls_with_few_heads_per_kv_head_take_the_decode_form() {
        let flash = choose(DType::F16, DType::F16, 128, 128, 4096, H200).unwrap();
        for rows in [1, 4, 15] {
            assert_eq!(
                for_rows(flash, rows, 8, 128, DType::F16),
                Form::Decode {
                    name: "bl_attn_decode_f16_128"
                },
                "{rows} rows"
            );
        }
        // Batches, and more heads per KV head than a decode block holds, keep the flash form.
        assert_eq!(for_rows(flash, 16, 8, 128, DType::F16), flash);
        assert_eq!(for_rows(flash, 1, 16, 128, DType::F16), flash);
        let q4 = choose(DType::Q4_0, DType::Q4_0, 128, 128, 4096, H200).unwrap();
        assert_eq!(
            for_rows(q4, 1, 8, 128, DType::Q4_0),
            Form::Decode {
                name: "bl_attn_decode_q4_0_128"
            }
        );
        // The scores form (f32 caches) stays as it is.
        let f32c = choose(DType::F32, DType::F32, 128, 128, 4096, H200).unwrap();
        assert_eq!(for_rows(f32c, 1, 4, 128, DType::F32), f32c);
    }

    #[test]
    fn flash_constants_match_the_kernels() {
        let src = include_str!("../../cu/attention.cuh");
        let split = include_str!("../../cu/attn_split.cuh");
        let define = |name: &str| super::super::tests::define_in(split, name);
        assert_eq!(define("FA_WARPS") * 16, FA_ROWS);
        assert_eq!(define("FA_WARPS") * 32, u64::from(FA_THREADS));
        assert_eq!(define("FA_MAX_SPLITS"), MAX_SPLITS);
        let code = |t: DType| {
            let n = t.name().unwrap_or("?").to_ascii_lowercase();
            (n.clone(), format!("KV_{}", t.name().unwrap_or("?")))
        };
        assert!(src.contains(
            "FLASH_ATTEND(NAME, T, 64) FLASH_ATTEND(NAME, T, 128) FLASH_ATTEND(NAME, T, 256)"
        ));
        for (t, d, kt, name) in FLASH {
            let kt_define = super::super::tests::define_in(src, &format!("FA_KT_{d}"));
            assert_eq!(kt_define, kt, "{name}");
            let (n, c) = code(t);
            assert_eq!(name, format!("bl_flash_attn_{n}_{d}"));
            assert!(
                src.contains(&format!("FLASH_ATTEND_SIZES({n}, {c})")),
                "{name}"
            );
        }
        assert_eq!(define("DEC_MAX_G"), DEC_MAX_G);
        assert_eq!(define("DEC_KT"), DEC_KT);
        assert_eq!(define("DEC_THREADS"), u64::from(FA_THREADS));
        assert!(split.contains(
            "ATTEND_DECODE(NAME, T, 64) ATTEND_DECODE(NAME, T, 128) ATTEND_DECODE(NAME, T, 256)"
        ));
        for (t, d, name) in DECODE {
            let (n, c) = code(t);
            assert_eq!(name, format!("bl_attn_decode_{n}_{d}"));
            assert!(
                split.contains(&format!("ATTEND_DECODE_SIZES({n}, {c})")),
                "{name}"
            );
        }
        let quant = include_str!("../../cu/kv_quant.cuh");
        for (i, t) in KV_TYPES.iter().enumerate() {
            let (_, c) = code(*t);
            assert_eq!(super::super::tests::define_in(quant, &c), i as u64, "{c}");
        }
    }
}
