//! Launches of attention's selection form (`cu/attn_select.cuh`): the calls the other forms do not
//! take, over f32 or f16 caches: heads wider than 256 (up to 512, GLM-5.3's latent rows), values
//! taken from the keys (`v_from_k`, latent attention) and sparse selection (`selected`). One block
//! per (row, head) holds the row's scores (and, with a selection, its sorted list) in shared
//! memory. Quantized caches are refused by name for these calls.

use bloomery_plugin_api::op::AttentionParams;
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::{driver_err, f32_only, Addr, Launcher, Src};

/// Threads per block (`SEL_THREADS`).
const SEL_THREADS: u32 = 128;
/// The widest key head (`SEL_MAX_D`).
pub(super) const SEL_MAX_D: u32 = 512;

/// Whether a call takes the selection form rather than the others.
pub(super) fn takes_select_form(p: &AttentionParams) -> bool {
    p.v_from_k || p.selected || p.dk > 256
}

/// Dynamic shared memory of a block: a score per window position (the whole visible span
/// without a selection, at most `len`) and, with a list of `n_sel`, the list padded to a power
/// of two and a score per entry.
fn select_smem(len: u64, window: u32, n_sel: Option<u64>) -> u64 {
    match n_sel {
        None => {
            4 * if window > 0 {
                len.min(u64::from(window))
            } else {
                len
            }
        }
        Some(n) => {
            let npad = n.max(1).next_power_of_two();
            4 * (2 * npad
                + if window > 0 {
                    len.min(u64::from(window))
                } else {
                    0
                })
        }
    }
}

/// The kernel for caches of type `t`, or the refusal that names the call.
fn kernel_for(t: DType, p: &AttentionParams) -> Result<&'static str, PluginError> {
    match t {
        DType::F32 => Ok("bl_attention_sel_f32"),
        DType::F16 => Ok("bl_attention_sel_f16"),
        _ => Err(PluginError::unsupported(
            format!(
                "attention over a {t} cache with{}{}{} on the CUDA bundles",
                if p.v_from_k {
                    " values from the keys"
                } else {
                    ""
                },
                if p.selected { " sparse selection" } else { "" },
                if p.dk > 256 {
                    format!(" heads of {}/{}", p.dk, p.dv)
                } else {
                    String::new()
                }
            ),
            &["f32 and f16 caches"],
        )),
    }
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
        if dk > SEL_MAX_D {
            return Err(PluginError::unsupported(
                format!("attention heads of {dk} on the CUDA bundles (at most {SEL_MAX_D})"),
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
        let smem = select_smem(kc.ne[1], p.window, n_sel);
        if smem > u64::from(self.smem_optin) {
            return Err(PluginError::unsupported(
                format!(
                    "attention over {} cached positions with a window of {} and a selection of \
                     {} on this card ({smem} bytes of shared memory a block; it holds {})",
                    kc.ne[1],
                    p.window,
                    n_sel.unwrap_or(0),
                    self.smem_optin
                ),
                &["a smaller context per slot", "a shorter selection"],
            ));
        }
        let po = addr(&c.dst, "dst")?;
        let wanted =
            self.product_next.load(std::sync::atomic::Ordering::Relaxed) && dv.is_multiple_of(32);
        let copy = self.copy_slot(wanted, po, c.dst.elements())?;
        let oq = copy.map_or(0u64, |c| c.q);
        let (pq, pk, pv) = (addr(q, "q")?, addr(kc, "k cache")?, addr(vc, "v cache")?);
        let (ps, pp) = (addr(slots, "slots")?, addr(pos, "positions")?);
        let n_sel = n_sel.unwrap_or(0) as i32;
        let (nhi, nkvi, dki, dvi) = (nh as i32, nkv as i32, dk as i32, dv as i32);
        let (len, ns) = (kc.ne[1] as i32, kc.ne[2] as i32);
        let (window, v_from_k, err) = (p.window as i32, i32::from(p.v_from_k), self.error_word);
        let f = self.func_smem(name, smem as u32)?;
        let mut l = self.args(&f);
        l.arg(&pq)
            .arg(&pk)
            .arg(&pv)
            .arg(&ps)
            .arg(&pp)
            .arg(&sel)
            .arg(&n_sel)
            .arg(&po)
            .arg(&oq)
            .arg(&nhi)
            .arg(&nkvi)
            .arg(&dki)
            .arg(&dvi)
            .arg(&len)
            .arg(&ns)
            .arg(&p.scale)
            .arg(&p.softcap)
            .arg(&window)
            .arg(&sinks)
            .arg(&v_from_k)
            .arg(&err);
        if rows > 0 {
            let cfg = LaunchConfig {
                grid_dim: ((rows * u64::from(nh)) as u32, 1, 1),
                block_dim: (SEL_THREADS, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            // SAFETY: the arguments follow bl_attention_sel_<type>'s parameters; q, dst, the
            // caches and the selection hold the shapes checked above; slots, positions and the
            // listed positions are checked on the card; the block's shared memory is `smem`,
            // which the kernel's layout needs and the card allows.
            unsafe { l.launch(cfg) }.map_err(driver_err(name))?;
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
    fn shared_memory_holds_the_scores_and_the_sorted_list() {
        assert_eq!(select_smem(8192, 0, None), 4 * 8192);
        assert_eq!(select_smem(8192, 128, None), 4 * 128);
        // top 2,048 and a tail: a list of 4,096 after padding, and as many scores
        assert_eq!(select_smem(8192, 0, Some(2100)), 4 * 2 * 4096);
        assert_eq!(select_smem(100, 300, Some(3)), 4 * (2 * 4 + 100));
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
}
