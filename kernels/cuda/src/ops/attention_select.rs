//! Launches of attention's selection form (`cu/attn_select.cuh`): the calls the other forms do not
//! take, over f32 or f16 caches: heads wider than 256 (up to 512, GLM-5.3's latent rows), values
//! taken from the keys (`v_from_k`, latent attention) and sparse selection (`selected`). With a
//! selection a block per row first sorts and dedups the row's list into the scratch. The
//! attention blocks take up to 16 heads of one KV head, which share every key row they load, over
//! one of S runs of the row's positions; with S > 1 a merge launch combines the runs. S grows
//! with the positions a row may see until the launch has about SPLIT_BLOCKS blocks (decode), and
//! is 1 for batches that fill the card with rows. Quantized caches are refused by name for these
//! calls. DeepSeek-V4's compressed rows (`comp`) join a row's positions after its window
//! (`attention_comp`).

use bloomery_plugin_api::op::AttentionParams;
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::attention_comp::{comp_kernel, Comp, CompLists};
use super::{driver_err, f32_only, Addr, Launcher, Src};

/// Threads per block of the three kernels (`SEL_THREADS`).
const SEL_THREADS: u32 = 256;
/// The widest key or value head (`SEL_MAX_D`).
pub(super) const SEL_MAX_D: u32 = 512;
/// Heads per attention block (`SEL_HEADS`) and positions per tile (`SEL_TILE`).
const SEL_HEADS: u64 = 16;
const SEL_TILE: u64 = 32;
/// Blocks a split launch aims at (about two per SM of a large card).
const SPLIT_BLOCKS: u64 = 256;
/// Most runs of a row (`FA_MAX_SPLITS`: the merge's weights).
const MAX_SPLITS: u64 = 64;
/// Fewest tiles a run takes when the row has that many positions.
const MIN_RUN_TILES: u64 = 2;

/// Whether a call takes the selection form rather than the others.
pub(super) fn takes_select_form(p: &AttentionParams) -> bool {
    p.v_from_k || p.selected || p.dk > 256 || p.comp != 0
}

/// A head width as the tiles pad it (`sel_pad`).
fn pad(d: u32) -> u64 {
    u64::from(d).div_ceil(8) * 8
}

/// Dynamic shared memory of an attention block: q rows of its heads, the key tile, a value tile
/// when the values are not the keys, the scores of the tile, its positions and three floats a
/// head (`attend_select`'s layout).
fn attend_smem(dk: u32, dv: u32, v_from_k: bool) -> u64 {
    let values = if v_from_k { 0 } else { SEL_TILE * pad(dv) };
    4 * (SEL_HEADS * (pad(dk) + 4)
        + SEL_TILE * pad(dk)
        + values
        + SEL_HEADS * SEL_TILE
        + SEL_TILE
        + 3 * SEL_HEADS)
}

/// Dynamic shared memory of a list block: the list padded to a power of two.
fn list_smem(n_sel: u64) -> u64 {
    4 * n_sel.max(1).next_power_of_two()
}

/// Attention blocks per row: chunks of up to SEL_HEADS heads of each KV head's group.
fn head_chunks(n_head: u32, n_kv: u32) -> u64 {
    u64::from(n_kv) * u64::from(n_head / n_kv).div_ceil(SEL_HEADS)
}

/// Runs each row's positions are cut into: enough for about SPLIT_BLOCKS blocks, but at least
/// MIN_RUN_TILES tiles a run of the most positions a row may see (`most`), 1 to MAX_SPLITS.
fn runs(rows: u64, chunks: u64, most: u64) -> u64 {
    let want = SPLIT_BLOCKS.div_ceil((rows * chunks).max(1));
    want.min(most.div_ceil(MIN_RUN_TILES * SEL_TILE))
        .clamp(1, MAX_SPLITS)
}

/// The kernel for caches of type `t`, or the refusal that names the call.
fn kernel_for(t: DType, p: &AttentionParams) -> Result<&'static str, PluginError> {
    let kernel = if p.comp != 0 {
        comp_kernel(t)
    } else {
        match t {
            DType::F32 => Some("bl_attention_sel_f32"),
            DType::F16 => Some("bl_attention_sel_f16"),
            _ => None,
        }
    };
    match kernel {
        Some(k) => Ok(k),
        None => {
            let wide = format!("heads of {}/{}", p.dk, p.dv);
            let features: Vec<&str> = [
                (p.v_from_k, "values from the keys"),
                (p.selected, "sparse selection"),
                (p.dk > 256, wide.as_str()),
                (p.comp != 0, "compressed rows"),
            ]
            .iter()
            .filter_map(|&(on, what)| on.then_some(what))
            .collect();
            Err(PluginError::unsupported(
                format!(
                    "attention over a {t} cache with {} on the CUDA bundles",
                    features.join(", ")
                ),
                &["f32 and f16 caches"],
            ))
        }
    }
}

/// 256-byte multiples, as the scratch's parts are laid out.
fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(256) * 256
}

impl Launcher {
    /// Attention through the selection form (sources q, K cache, V cache, slots, positions,
    /// sinks when the op has them, the selection when it has one).
    pub(super) fn attention_select<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: AttentionParams,
    ) -> Result<(), PluginError> {
        let (q, kc, vc, slots, pos) = (src(0)?, src(1)?, src(2)?, src(3)?, src(4)?);
        f32_only(q, "Attention q")?;
        f32_only(&c.dst, "Attention dst")?;
        let name = kernel_for(kc.dtype, &p)?;
        let rows = slots.elements();
        let (nh, nkv, dk, dv) = (p.n_head, p.n_head_kv, p.dk, p.dv);
        if dk > SEL_MAX_D || dv > SEL_MAX_D {
            return Err(PluginError::unsupported(
                format!("attention heads of {dk}/{dv} on the CUDA bundles (at most {SEL_MAX_D})"),
                &[],
            ));
        }
        if p.v_from_k && (vc != kc || dv > dk) {
            return Err(PluginError::invalid(format!(
                "Attention with values from the keys: the V source must be the K cache again \
                 and dv {dv} at most dk {dk}"
            )));
        }
        let v_width = if p.v_from_k { dk * nkv } else { dv * nkv };
        if nkv == 0
            || nh % nkv != 0
            || vc.dtype != kc.dtype
            || q.elements() != u64::from(dk * nh) * rows
            || c.dst.elements() != u64::from(dv * nh) * rows
            || pos.elements() != rows
            || kc.ne[0] != u64::from(dk * nkv)
            || vc.ne[0] != u64::from(v_width)
            || kc.ne[1] != vc.ne[1]
            || kc.ne[2] != vc.ne[2]
        {
            return Err(PluginError::invalid("Attention shapes"));
        }
        if rows > 65_535 {
            return Err(PluginError::unsupported(
                format!("attention's selection form over {rows} rows in one call (at most 65,535)"),
                &["smaller batches"],
            ));
        }
        let sinks = if p.sinks {
            let s = src(5)?;
            f32_only(s, "sinks")?;
            addr(s, "sinks")?
        } else {
            0u64
        };
        let (sel, n_sel) = if p.selected {
            let t = src(5 + usize::from(p.sinks))?;
            if t.dtype != DType::I32 || t.ne[0] == 0 || t.rows() != rows {
                return Err(PluginError::invalid(format!(
                    "Attention selection {:?} of {} for {rows} rows (want i32 [n_sel, rows])",
                    t.ne, t.dtype
                )));
            }
            (addr(t, "selected")?, Some(t.ne[0]))
        } else {
            (0u64, None)
        };
        let comp = Comp::of_call(src, &p, kc, rows)?;
        let len = kc.ne[1];
        let smem = attend_smem(dk, dv, p.v_from_k);
        let lsmem = n_sel
            .map_or(0, list_smem)
            .max(comp.as_ref().map_or(0, Comp::list_smem));
        if smem.max(lsmem) > u64::from(self.smem_optin) {
            return Err(PluginError::unsupported(
                format!(
                    "attention's selection form with heads of {dk}/{dv} and a selection of {} on \
                     this card ({} bytes of shared memory a block; it holds {})",
                    n_sel.unwrap_or(0),
                    smem.max(lsmem),
                    self.smem_optin
                ),
                &["f16 caches, narrower heads or a shorter selection"],
            ));
        }
        let window = u64::from(p.window);
        let span = if window > 0 { window.min(len) } else { len };
        let most = n_sel.map_or(span, |n| n + if window > 0 { span } else { 0 })
            + comp.as_ref().map_or(0, Comp::most);
        let chunks = head_chunks(nh, nkv);
        let split = runs(rows, chunks, most);
        // The scratch: the output's Q8_1 copy first (copy_slot takes its start), then the runs'
        // partials (o, then maximum and sum, per run and output row), then the rows' lists and
        // counts, then the compressed rows' lists and counts.
        let copy_bytes = aligned(c.dst.elements() / 32 * 36);
        let part_bytes = if split > 1 {
            aligned(split * rows * u64::from(nh) * (u64::from(dv) + 2) * 4)
        } else {
            0
        };
        let list_bytes = n_sel.map_or(0, |n| aligned(rows * n * 4) + aligned(rows * 4));
        let comp_bytes = comp.as_ref().map_or(0, |c| c.scratch_bytes(rows));
        let base = if part_bytes + list_bytes + comp_bytes > 0 {
            self.scratch(copy_bytes + part_bytes + list_bytes + comp_bytes)?
        } else {
            0
        };
        let part = if split > 1 { base + copy_bytes } else { 0 };
        let (list, count) = match n_sel {
            Some(n) => {
                let list = base + copy_bytes + part_bytes;
                (list, list + aligned(rows * n * 4))
            }
            None => (0, 0),
        };
        let po = addr(&c.dst, "dst")?;
        let wanted =
            self.product_next.load(std::sync::atomic::Ordering::Relaxed) && dv.is_multiple_of(32);
        let copy = self.copy_slot(wanted, po, c.dst.elements())?;
        let oq = copy.map_or(0u64, |c| c.q);
        let (pq, pk, pv) = (addr(q, "q")?, addr(kc, "k cache")?, addr(vc, "v cache")?);
        let (ps, pp) = (addr(slots, "slots")?, addr(pos, "positions")?);
        let n_seli = n_sel.unwrap_or(0) as i32;
        let (nhi, nkvi, dki, dvi) = (nh as i32, nkv as i32, dk as i32, dv as i32);
        let (leni, ns) = (len as i32, kc.ne[2] as i32);
        let (wi, v_from_k, err) = (p.window as i32, i32::from(p.v_from_k), self.error_word);
        if rows == 0 {
            return Ok(());
        }
        let comp_lists = match &comp {
            Some(cm) => {
                let at = base + copy_bytes + part_bytes + list_bytes;
                self.comp_lists(addr, cm, (ps, pp), rows, kc.ne[2], at)?
            }
            None => CompLists::default(),
        };
        if n_sel.is_some() {
            let f = self.func_smem("bl_attn_sel_list", lsmem as u32)?;
            let mut l = self.args(&f);
            l.arg(&ps)
                .arg(&pp)
                .arg(&sel)
                .arg(&n_seli)
                .arg(&leni)
                .arg(&ns)
                .arg(&wi)
                .arg(&list)
                .arg(&count)
                .arg(&err);
            let cfg = LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (SEL_THREADS, 1, 1),
                shared_mem_bytes: lsmem as u32,
            };
            // SAFETY: the arguments follow bl_attn_sel_list's parameters; the selection holds
            // n_sel entries a row (checked above), the list and count areas of the scratch as
            // many and one a row; slots and positions are checked on the card; the block's
            // shared memory is the padded list, which the card allows.
            unsafe { l.launch(cfg) }.map_err(driver_err("bl_attn_sel_list"))?;
        }
        let f = self.func_smem(name, smem as u32)?;
        let mut l = self.args(&f);
        l.arg(&pq).arg(&pk);
        if comp.is_none() {
            l.arg(&pv);
        }
        l.arg(&ps).arg(&pp).arg(&list).arg(&count).arg(&n_seli);
        // The compressed rows' kernel: the rows, their lists and counts after the selection's.
        let (pc, comp_len) = match &comp {
            Some(cm) => cm.cache(addr)?,
            None => (0, 0),
        };
        let n_list = comp.as_ref().map_or(0, Comp::n_list);
        if comp.is_some() {
            l.arg(&pc)
                .arg(&comp_lists.list)
                .arg(&comp_lists.count)
                .arg(&n_list)
                .arg(&comp_len);
        }
        l.arg(&po)
            .arg(&oq)
            .arg(&part)
            .arg(&nhi)
            .arg(&nkvi)
            .arg(&dki)
            .arg(&dvi)
            .arg(&leni)
            .arg(&ns)
            .arg(&p.scale)
            .arg(&p.softcap)
            .arg(&wi)
            .arg(&sinks);
        if comp.is_none() {
            l.arg(&v_from_k);
        }
        l.arg(&err);
        let cfg = LaunchConfig {
            grid_dim: (split as u32, chunks as u32, rows as u32),
            block_dim: (SEL_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: the arguments follow bl_attention_sel_<type>'s (or bl_attention_comp_<type>'s)
        // parameters; q, dst and the caches (the compressed rows too) hold the shapes checked
        // above, the lists and counts were written by the launches before, the partials of `split` runs fit the scratch sized above; slots and positions
        // are checked on the card; the block's shared memory is `smem`, the kernel's layout,
        // which the card allows.
        unsafe { l.launch(cfg) }.map_err(driver_err(name))?;
        if split > 1 {
            let f = self.func("bl_attn_sel_merge")?;
            let mut l = self.args(&f);
            let spliti = split as i32;
            l.arg(&part)
                .arg(&spliti)
                .arg(&ps)
                .arg(&pp)
                .arg(&count)
                .arg(&nhi)
                .arg(&dvi)
                .arg(&leni)
                .arg(&ns)
                .arg(&wi)
                .arg(&sinks)
                .arg(&comp_lists.count)
                .arg(&po)
                .arg(&oq);
            let cfg = LaunchConfig {
                grid_dim: ((rows * u64::from(nh)) as u32, 1, 1),
                block_dim: (SEL_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments follow bl_attn_sel_merge's parameters; the partials of
            // `split` runs of every output row were written by the launch before into the
            // scratch sized above, the compressed rows' counts (when the call has them) by the
            // list launch; dst holds rows x n_head x dv floats.
            unsafe { l.launch(cfg) }.map_err(driver_err("bl_attn_sel_merge"))?;
        }
        if let Some(copy) = copy {
            self.keep_quantized(copy)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_follows_the_kernels_layout() {
        // GLM-5.3's latent rows: q of 16 heads (520 a row), a key tile of 32 x 512, the scores,
        // the tile's positions and three floats a head.
        assert_eq!(
            attend_smem(512, 512, true),
            4 * (16 * 516 + 32 * 512 + 16 * 32 + 32 + 48)
        );
        // A separate value tile, widths padded to 8.
        assert_eq!(
            attend_smem(100, 36, false),
            4 * (16 * 108 + 32 * 104 + 32 * 40 + 16 * 32 + 32 + 48)
        );
        // top 2,048 and a tail: a list of 4,096 after padding
        assert_eq!(list_smem(2100), 4 * 4096);
    }

    #[test]
    fn decode_splits_into_runs_and_batches_do_not() {
        // One decode row of 64 heads (4 chunks) over a list of 2,051: 33 runs of about 2 tiles.
        assert_eq!(head_chunks(64, 1), 4);
        assert_eq!(runs(1, 4, 2051), 33);
        // A long dense row: as many runs as make 256 blocks.
        assert_eq!(runs(1, 4, 100_000), 64);
        assert_eq!(runs(2, 4, 100_000), 32);
        // A prompt's rows fill the card: one run a row.
        assert_eq!(runs(512, 4, 2051), 1);
        // A group of 24: chunks of 16 and 8.
        assert_eq!(head_chunks(48, 2), 4);
    }

    #[test]
    fn latent_sparse_and_wide_calls_take_the_form_and_quantized_caches_are_refused() {
        let mut p = AttentionParams::gqa(64, 1, 512);
        assert!(takes_select_form(&p));
        p = AttentionParams::gqa(8, 2, 128);
        assert!(!takes_select_form(&p));
        p.selected = true;
        assert!(takes_select_form(&p));
        let e = kernel_for(DType::Q8_0, &p).unwrap_err().to_string();
        assert!(e.contains("Q8_0 cache with sparse selection"), "{e}");
    }

    #[test]
    fn two_source_calls_take_the_comp_kernels_over_f32_and_f16_caches() {
        // DeepSeek-V4's ratio-4 layer: 64 heads of 512, the window ring and the picked rows.
        let mut p = AttentionParams {
            v_from_k: true,
            sinks: true,
            window: 128,
            comp: 4,
            comp_selected: true,
            ..AttentionParams::gqa(64, 1, 512)
        };
        assert!(takes_select_form(&p));
        assert_eq!(kernel_for(DType::F32, &p).unwrap(), "bl_attention_comp_f32");
        assert_eq!(kernel_for(DType::F16, &p).unwrap(), "bl_attention_comp_f16");
        let e = kernel_for(DType::Q8_0, &p).unwrap_err().to_string();
        assert!(
            e.contains("Q8_0 cache with values from the keys, heads of 512/512, compressed rows"),
            "{e}"
        );
        // Compressed rows alone send a narrow call to the selection form too.
        p = AttentionParams {
            comp: 128,
            ..AttentionParams::gqa(8, 2, 128)
        };
        assert!(takes_select_form(&p));
        let src = include_str!("../../cu/attn_comp.cuh");
        for (t, name) in [
            ("float", "bl_attention_comp_f32"),
            ("__half", "bl_attention_comp_f16"),
        ] {
            assert!(src.contains(&format!("ATTEND_COMP({name}, {t})")), "{name}");
        }
    }
}
