//! Routed experts (`cu/moe.cuh`), MoeExperts: each row's k chosen experts' gate and up products
//! with the GLU into hidden rows, then the weighted down products summed into the output, a warp
//! per (row, slot, output row), over F32 stacks or stacks of any type of [`QUANT_TYPES`] (the
//! activations and hidden rows quantized to Q8_1 for them). Batches of 16 rows or more with
//! quantized stacks take the tiled products instead (`moe_batch`); a sigmoid-gated shared expert
//! joins the decode kernels as one more slot (`fused::moe_shared`).
//!
//! [`QUANT_TYPES`]: super::QUANT_TYPES

use bloomery_plugin_api::op::{MoeParams, OpKind, OpSupport};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::activations::Quantized;
use super::elementwise::glu_code;
use super::moe_batch::Stacks;
use super::quant::{pairs_ok, per_wtype, typed, weight_code, with_quant_types, STAGE_PAIR};
use super::{driver_err, Addr, Launcher, Src, BLOCK, WARPS};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![OpSupport {
        op: OpKind::MoeExperts,
        dtypes: with_quant_types(&[DType::F32]),
    }]
}

/// Routed gate/up products with both stacks of one type, per type (`bl_moe_gate_up`: two types).
pub(super) const MOE_GATE_UP: [&str; 13] = per_wtype!("bl_moe_gate_up");
/// Routed down products, per weight type.
pub(super) const MOE_DOWN: [&str; 13] = per_wtype!("bl_moe_down");

impl Launcher {
    /// Routed experts: x quantized once when a stack is Q8_0, gate/up products and the GLU into
    /// `h`, `h` quantized when down is Q8_0, then the weighted down products. With `shared`, a
    /// sigmoid-gated shared expert joins the decode kernels as one more slot and the gated sum
    /// goes to its output (ops/fused/moe_shared.rs, which checked that the kernels' forms
    /// apply).
    pub(super) fn moe<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: MoeParams,
        held: Option<Quantized>,
        shared: Option<&SharedSlot>,
    ) -> Result<(), PluginError> {
        let (x, ids, w, gate) = (src(0)?, src(1)?, src(2)?, src(3)?);
        let (up, down_i) = if p.fused_gate_up {
            (None, 4)
        } else {
            (Some(src(4)?), 5)
        };
        let down = src(down_i)?;
        let kind = glu_code(p.glu, p.limit)?;
        let map = if p.expert_map {
            addr(src(down_i + 1)?, "expert map")?
        } else {
            0u64
        };
        let wtype = |t: DType| -> Result<(i32, u64), PluginError> {
            weight_code(t).ok_or_else(|| {
                PluginError::unsupported(format!("MoeExperts with {t} experts"), &[])
            })
        };
        let (n_embd, n_ff, k) = (x.ne[0], u64::from(p.n_ff), u64::from(p.k));
        let rows = x.rows();
        let up_t = up.map_or(gate.dtype, |u| u.dtype);
        let ((wg, bg), (wu, bu), (wd, bd)) = (wtype(gate.dtype)?, wtype(up_t)?, wtype(down.dtype)?);
        let gate_rows = if p.fused_gate_up { 2 * n_ff } else { n_ff };
        if gate.ne[0] != n_embd
            || gate.ne[1] != gate_rows
            || down.ne[0] != n_ff
            || down.ne[1] != n_embd
            || ids.elements() != k * rows
            || w.elements() != k * rows
            || c.dst.ne[0] != n_embd
            || c.dst.rows() != rows
            || n_embd % bg.max(bu) != 0
            || n_ff % bd.max(32) != 0
        {
            return Err(PluginError::invalid("MoeExperts shapes"));
        }
        let align = |b: u64| b.div_ceil(256) * 256;
        if let (Some(routed), true, None) = (
            self.mmq.experts(rows),
            wg >= 1 && wu >= 1 && wd >= 1 && addr(&c.dst, "dst")? % 16 == 0,
            shared,
        ) {
            let stacks = Stacks {
                x: addr(x, "x")?,
                ids: addr(ids, "ids")?,
                weights: addr(w, "weights")?,
                map,
                gate: (
                    addr(gate, "gate")?,
                    gate.nb[1] as i64,
                    gate.nb[2] as i64,
                    wg,
                ),
                up: match up {
                    Some(u) => Some((addr(u, "up")?, u.nb[1] as i64, u.nb[2] as i64, wu)),
                    None => None,
                },
                down: (
                    addr(down, "down")?,
                    down.nb[1] as i64,
                    down.nb[2] as i64,
                    wd,
                ),
                n_stack: gate.ne[2],
                out: addr(&c.dst, "dst")?,
            };
            return self.moe_routed(routed, &stacks, p, n_embd, rows);
        }
        let xq_bytes = if wg >= 1 || wu >= 1 {
            align(rows * (n_embd / 32) * 36)
        } else {
            0
        };
        // Slots of h per row: the shared expert's after the routed ones.
        let hk = k + u64::from(shared.is_some());
        let h_bytes = align(rows * hk * n_ff * 4);
        let pd = addr(down, "down")?;
        let (d_row, d_exp) = (down.nb[1] as i64, down.nb[2] as i64);
        // The hidden rows' Q8_1 blocks, in the pair layout the down kernel reads straight from
        // memory where its rows suit the pair form.
        let hpairs = pairs_ok(wd, pd, d_row, d_exp, n_ff);
        let hq_row = if hpairs {
            (n_ff / 64) * STAGE_PAIR
        } else {
            (n_ff / 32) * 36
        };
        let hq_bytes = if wd >= 1 {
            align(rows * hk * hq_row)
        } else {
            0
        };
        let gs_bytes = if shared.is_some() { align(rows * 4) } else { 0 };
        let base = self.scratch(xq_bytes + h_bytes + hq_bytes + gs_bytes)?;
        let (xq, h, hq) = (base, base + xq_bytes, base + xq_bytes + h_bytes);
        // The shared expert's gate logits.
        let gs = hq + hq_bytes;
        let names = match shared {
            Some(sh) => {
                let forms = (wg == wu && xq_bytes > 0 && hpairs)
                    .then(|| moe_shared_kernels(wg, wd, sh.wtype))
                    .flatten();
                Some(forms.ok_or_else(|| {
                    PluginError::invalid("a shared expert slot off the kernels' pair forms")
                })?)
            }
            None => None,
        };
        let px = addr(x, "x")?;
        let cfg = |tasks: u64| LaunchConfig {
            grid_dim: (tasks.div_ceil(WARPS).max(1) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let nblocks = rows * (n_embd / 32);
        let copy = Quantized {
            x: px,
            nblocks,
            q: xq,
        };
        let quantized_now = xq_bytes > 0 && held != Some(copy);
        if quantized_now {
            self.quantize_q8_1(px, xq, nblocks)?;
        }
        let act = |t: i32| {
            if t >= 1 {
                (xq, ((n_embd / 32) * 36) as i64)
            } else {
                (px, (n_embd * 4) as i64)
            }
        };
        let ((xg, xg_row), (xu, xu_row)) = (act(wg), act(wu));
        let pg = addr(gate, "gate")?;
        let pu = match up {
            Some(u) => addr(u, "up")?,
            None => 0u64,
        };
        let (g_row, g_exp) = (gate.nb[1] as i64, gate.nb[2] as i64);
        let (u_row, u_exp) = up.map_or((0, 0), |u| (u.nb[1] as i64, u.nb[2] as i64));
        let (pids, pw, po) = (addr(ids, "ids")?, addr(w, "weights")?, addr(&c.dst, "dst")?);
        let (ne, nf, ki, ri, nx) = (
            n_embd as i32,
            n_ff as i32,
            k as i32,
            rows as i32,
            p.n_expert as i32,
        );
        let (fused, err) = (i32::from(p.fused_gate_up), self.error_word);
        let name = match names {
            Some((gate_up, _)) => gate_up,
            None if wg == wu => typed(&MOE_GATE_UP, wg)?,
            None => "bl_moe_gate_up",
        };
        let hki = hk as i32;
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&pg)
            .arg(&pu)
            .arg(&g_row)
            .arg(&g_exp)
            .arg(&u_row)
            .arg(&u_exp)
            .arg(&wg)
            .arg(&wu);
        l.arg(&xg)
            .arg(&xu)
            .arg(&xg_row)
            .arg(&xu_row)
            .arg(&pids)
            .arg(&map)
            .arg(&h);
        l.arg(&ne)
            .arg(&nf)
            .arg(&ki)
            .arg(&ri)
            .arg(&nx)
            .arg(&kind)
            .arg(&p.limit)
            .arg(&fused)
            .arg(&hki)
            .arg(&err);
        let mut tasks = rows * k * n_ff;
        // The shared expert's warps may read x and its copy before waiting only when the kernel
        // before is the routing, not the quantization just launched.
        let early = i32::from(shared.is_some_and(|sh| sh.after_routing) && !quantized_now);
        if let Some(sh) = shared {
            l.arg(&sh.gate.0)
                .arg(&sh.up.0)
                .arg(&sh.gate.1)
                .arg(&sh.up.1)
                .arg(&sh.gate_w)
                .arg(&sh.x)
                .arg(&gs);
            l.arg(&early);
            // A warp per (row, ff row) of the shared expert and one per row for its gate's
            // logit, before the routed warps.
            tasks += rows * n_ff + rows;
        }
        // SAFETY: one warp per (row, expert slot, ff row), with a shared expert after one per
        // (row, ff row) and one per row; expert ids are checked on the card, every stack row lies
        // inside the stacks' checked spans, and h and gs hold hk slots and one logit per row.
        unsafe { l.launch(cfg(tasks)) }.map_err(driver_err(name))?;
        let (hact, h_row) = if wd >= 1 {
            let nblocks = rows * hk * (n_ff / 32);
            if hpairs {
                // In the pair layout (nblocks even: n_ff is a multiple of 64 there).
                let nb = nblocks as i64;
                let name = "bl_quantize_q8_1_pairs";
                let f = self.func(name)?;
                let mut l = self.args(&f);
                l.arg(&h).arg(&hq).arg(&nb);
                // SAFETY: one warp per 32-value block; h holds nblocks blocks, hq as many in
                // pairs of STAGE_PAIR bytes.
                unsafe { l.launch(cfg(nblocks)) }.map_err(driver_err(name))?;
            } else {
                self.quantize_q8_1(h, hq, nblocks)?;
            }
            (hq, hq_row as i64)
        } else {
            (h, (n_ff * 4) as i64)
        };
        let name = match names {
            Some((_, down)) => down,
            None => typed(&MOE_DOWN, wd)?,
        };
        let po = shared.map_or(po, |sh| sh.out);
        let f = self.func(name)?;
        let mut l = self.args(&f);
        let hp = i32::from(hpairs);
        l.arg(&pd)
            .arg(&d_row)
            .arg(&d_exp)
            .arg(&hact)
            .arg(&h_row)
            .arg(&hp)
            .arg(&pids)
            .arg(&map);
        l.arg(&pw)
            .arg(&po)
            .arg(&ne)
            .arg(&nf)
            .arg(&ki)
            .arg(&hki)
            .arg(&ri)
            .arg(&nx)
            .arg(&err);
        if let Some(sh) = shared {
            l.arg(&sh.down.0).arg(&sh.down.1).arg(&gs);
        }
        // SAFETY: one warp per (row, output); rows of the down stacks inside their checked spans,
        // hk staged slots of h per row and, with a shared expert, its logits in gs.
        unsafe { l.launch(cfg(rows * n_embd)) }.map_err(driver_err(name))?;
        Ok(())
    }
}

/// A sigmoid-gated shared expert run as one more slot of the routed experts' decode kernels
/// (ops/fused/moe_shared.rs): device addresses and row strides of its stacks, their type code, its
/// gate's F32 weights, the f32 rows that gate reads, where the whole sum goes, and what ran
/// before.
pub(super) struct SharedSlot {
    pub(super) gate: (u64, i64),
    pub(super) up: (u64, i64),
    pub(super) down: (u64, i64),
    pub(super) wtype: i32,
    pub(super) gate_w: u64,
    pub(super) x: u64,
    pub(super) out: u64,
    /// The last kernel launched was the routing's (it writes neither the activations nor the
    /// scratch).
    pub(super) after_routing: bool,
}

/// The gate/up and down kernels with a shared expert slot, for routed gate/up stacks of type
/// code `gate_up`, a routed down stack of `down` and shared stacks of `shared` (each Q8_0 or
/// Q4_K, the types with a pair form).
pub(super) fn moe_shared_kernels(
    gate_up: i32,
    down: i32,
    shared: i32,
) -> Option<(&'static str, &'static str)> {
    const GATE_UP: [[&str; 2]; 2] = [
        ["bl_moe_gate_up_sh_1_1", "bl_moe_gate_up_sh_1_2"],
        ["bl_moe_gate_up_sh_2_1", "bl_moe_gate_up_sh_2_2"],
    ];
    const DOWN: [[&str; 2]; 2] = [
        ["bl_moe_down_sh_1_1", "bl_moe_down_sh_1_2"],
        ["bl_moe_down_sh_2_1", "bl_moe_down_sh_2_2"],
    ];
    let at = |t: i32| usize::try_from(t - 1).ok().filter(|&i| i < 2);
    let (g, d, s) = (at(gate_up)?, at(down)?, at(shared)?);
    Some((GATE_UP[g][s], DOWN[d][s]))
}
