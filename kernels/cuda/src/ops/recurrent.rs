//! Launches of the sequence-state ops of linear-attention layers (`cu/recurrent.cuh`): the causal
//! depthwise conv and the gated delta rule, each reading and updating a per-slot state in place.
//! Slots and positions stay on the card: segments (the rows of one sequence) are found by the
//! kernels, so a step needs no host read and can be captured in a device graph.

use bloomery_plugin_api::op::{DeltaRuleParams, OpKind, OpSupport};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::{claim, driver_err, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![
        claim(OpKind::ConvCausal, &[DType::F32]),
        claim(OpKind::DeltaRule, &[DType::F32]),
    ]
}

/// Most taps of a causal conv (`CONV_MAX_TAPS`).
const CONV_MAX_TAPS: u32 = 16;
/// Longest conv history, `(taps − 1)·dilation` (`CONV_MAX_HIST`).
const CONV_MAX_HIST: u64 = 64;
/// Rows a thread of the conv's state update walks (`CONV_STATE_ROWS`).
const CONV_STATE_ROWS: u64 = 64;
/// Rows of a delta-rule chunk (`DR_CHUNK`); batches of at least this many rows list their
/// segments, and segments this long take the chunked form.
const DR_CHUNK: u64 = 64;
/// Largest key head dim of the delta-rule kernels (`DR_MAX_DK`).
const DR_MAX_DK: u32 = 256;
/// State columns per block of the delta-rule kernels (`DR_STEP_COLS`, `DR_COLS`).
const DR_COLS: u64 = 16;

/// The optional last source of a state op (a verify pass's row states, `[width, rows]` f32,
/// column `r` the state after row `r`), at index `at`: its shape checked. More sources than that
/// are refused.
fn row_states<'c>(
    c: &'c OpCall,
    at: usize,
    width: u64,
    rows: u64,
    op: &str,
) -> Result<Option<&'c TensorRef>, PluginError> {
    match c.srcs() {
        s if s.len() == at => Ok(None),
        s if s.len() == at + 1 => {
            let t = &s[at];
            expect(t, DType::F32, &format!("{op} row states"))?;
            if !t.is_contiguous() || t.ne[0] != width || t.elements() != width * rows {
                return Err(PluginError::invalid(format!(
                    "{op} row states {:?} for {rows} rows of {width}",
                    t.ne
                )));
            }
            Ok(Some(t))
        }
        s => Err(PluginError::invalid(format!(
            "{op} takes {at} sources, or {} with row states, not {}",
            at + 1,
            s.len()
        ))),
    }
}

fn grid3(x: u64, y: u64, z: u64, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, y as u32, z as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn expect(t: &TensorRef, dtype: DType, what: &str) -> Result<(), PluginError> {
    if t.dtype == dtype {
        Ok(())
    } else {
        Err(PluginError::invalid(format!(
            "{what} must be {dtype}, not {}",
            t.dtype
        )))
    }
}

/// Checks a conv's taps and dilation against the kernels' limits; returns its history, the rows
/// of state per channel (`(taps − 1)·dilation`).
fn conv_history(taps: u32, dilation: u32) -> Result<u64, PluginError> {
    if taps == 0 || taps > CONV_MAX_TAPS {
        return Err(PluginError::unsupported(
            format!("ConvCausal with {taps} taps on the CUDA bundles"),
            &["1 to 16 taps"],
        ));
    }
    if dilation == 0 {
        return Err(PluginError::invalid("ConvCausal at dilation 0"));
    }
    let hist = u64::from(taps - 1) * u64::from(dilation);
    if hist > CONV_MAX_HIST {
        return Err(PluginError::unsupported(
            format!(
                "ConvCausal with {taps} taps at dilation {dilation} on the CUDA bundles (a \
                 history of {hist} rows)"
            ),
            &["(taps − 1)·dilation of at most 64"],
        ));
    }
    Ok(hist)
}

impl Launcher {
    /// Causal depthwise conv: the outputs (one thread per (row, channel), reading the old state),
    /// then the state update by each segment's last row.
    pub(super) fn conv_causal<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        taps: u32,
        dilation: u32,
    ) -> Result<(), PluginError> {
        let (x, w, state, slots, pos) = (src(0)?, src(1)?, src(2)?, src(3)?, src(4)?);
        for (t, what) in [(x, "x"), (w, "w"), (state, "state"), (&c.dst, "dst")] {
            expect(t, DType::F32, &format!("ConvCausal {what}"))?;
        }
        expect(slots, DType::I32, "ConvCausal slots")?;
        expect(pos, DType::I32, "ConvCausal positions")?;
        let hist = conv_history(taps, dilation)?;
        let (ch, rows, t) = (x.ne[0], x.rows(), u64::from(taps));
        let n_slots = state.rows();
        if w.ne[0] != t
            || w.elements() != t * ch
            || state.ne[0] != ch * hist
            || c.dst.ne[0] != ch
            || c.dst.rows() != rows
            || slots.elements() != rows
            || pos.elements() != rows
            || n_slots == 0
            || rows > i32::MAX as u64
            || ch.div_ceil(256) > 65_535
        {
            return Err(PluginError::invalid(format!(
                "ConvCausal shapes: x {:?}, w {:?}, state {:?}, dst {:?}",
                x.ne, w.ne, state.ne, c.dst.ne
            )));
        }
        let rows_out = row_states(c, 5, ch * hist, rows, "ConvCausal")?;
        if rows == 0 || ch == 0 {
            return Ok(());
        }
        let (px, pw, ps) = (addr(x, "x")?, addr(w, "w")?, addr(slots, "slots")?);
        let (pp, po) = (addr(pos, "positions")?, addr(&c.dst, "dst")?);
        // A conv of one tap keeps no state.
        let pst = if taps > 1 { addr(state, "state")? } else { 0 };
        let (chi, tapsi, ri, nsi) = (ch as i32, taps as i32, rows as i32, n_slots as i32);
        let (dili, histi) = (dilation as i32, hist as i32);
        let err = self.error_word;
        let f = self.func("bl_conv_causal")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&pw).arg(&pst).arg(&ps).arg(&pp).arg(&po);
        l.arg(&chi).arg(&tapsi).arg(&dili).arg(&nsi).arg(&err);
        // SAFETY: one thread per (row, channel) inside the checked spans; a row's slot is checked
        // on the card before its state is read.
        unsafe { l.launch(grid3(rows, ch.div_ceil(256), 1, 256)) }
            .map_err(driver_err("bl_conv_causal"))?;
        if let Some(rs) = rows_out.filter(|_| taps > 1) {
            let prs = addr(rs, "row states")?;
            let f = self.func("bl_conv_causal_rows")?;
            let mut l = self.args(&f);
            l.arg(&px).arg(&pst).arg(&ps).arg(&pp).arg(&prs);
            l.arg(&chi).arg(&histi).arg(&nsi);
            // SAFETY: one thread per (row, channel) writes that row's column of the row states
            // (checked above to hold every row) and reads x and the old state, before the
            // launch below updates the state.
            unsafe { l.launch(grid3(rows, ch.div_ceil(256), 1, 256)) }
                .map_err(driver_err("bl_conv_causal_rows"))?;
        }
        if taps > 1 {
            let f = self.func("bl_conv_causal_state")?;
            let mut l = self.args(&f);
            l.arg(&px).arg(&pst).arg(&ps).arg(&pp);
            l.arg(&chi).arg(&ri).arg(&histi).arg(&nsi);
            let groups = rows.div_ceil(CONV_STATE_ROWS);
            // SAFETY: as above; each (slot, channel) of the state is written by one thread only
            // (the last row of the slot's segment), after the launch above read it.
            unsafe { l.launch(grid3(groups, ch.div_ceil(256), 1, 256)) }
                .map_err(driver_err("bl_conv_causal_state"))?;
        }
        Ok(())
    }

    /// Gated delta rule, with a decay per head (GDN) or per (head, key dim) (KDA). Batches of
    /// fewer than [`DR_CHUNK`] rows: the step-wise kernel on every segment. Larger batches: the
    /// segment lists in scratch, then the step-wise kernel on the short segments and the chunked
    /// form (prep over all chunks, `bl_delta_rule_prep_dim` for a per-dimension decay, then the
    /// chunks of each long segment in order) on the others.
    pub(super) fn delta_rule<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        p: DeltaRuleParams,
    ) -> Result<(), PluginError> {
        let (q, k, v, gate, beta) = (src(0)?, src(1)?, src(2)?, src(3)?, src(4)?);
        let (state, slots, pos) = (src(5)?, src(6)?, src(7)?);
        for (t, what) in [
            (q, "q"),
            (k, "k"),
            (v, "v"),
            (gate, "gate"),
            (beta, "beta"),
            (state, "state"),
            (&c.dst, "dst"),
        ] {
            expect(t, DType::F32, &format!("DeltaRule {what}"))?;
        }
        expect(slots, DType::I32, "DeltaRule slots")?;
        expect(pos, DType::I32, "DeltaRule positions")?;
        let (hk, hv, dk, dv) = (p.n_head_k, p.n_head_v, p.dk, p.dv);
        if dk > DR_MAX_DK {
            return Err(PluginError::unsupported(
                format!("DeltaRule with key heads of {dk} on the CUDA bundles"),
                &["dk up to 256"],
            ));
        }
        let (hk, hv, dk, dv) = (u64::from(hk), u64::from(hv), u64::from(dk), u64::from(dv));
        let rows = slots.elements();
        let n_slots = state.rows();
        let per_row_gates = if p.per_dim_gate { dk * hv } else { hv };
        if hk == 0
            || hv % hk != 0
            || dk == 0
            || dv == 0
            || q.elements() != dk * hk * rows
            || k.elements() != dk * hk * rows
            || v.elements() != dv * hv * rows
            || gate.elements() != per_row_gates * rows
            || beta.elements() != hv * rows
            || state.ne[0] != dk * dv * hv
            || pos.elements() != rows
            || c.dst.elements() != dv * hv * rows
            || n_slots == 0
            || rows > i32::MAX as u64
            || hv > 65_535
        {
            return Err(PluginError::invalid(format!(
                "DeltaRule shapes: q {:?}, v {:?}, gate {:?}, state {:?}, {rows} rows, \
                 heads {hk}/{hv} of {dk}/{dv}",
                q.ne, v.ne, gate.ne, state.ne
            )));
        }
        let rows_out = row_states(c, 8, dk * dv * hv, rows, "DeltaRule")?;
        if rows_out.is_some() && rows >= DR_CHUNK {
            return Err(PluginError::unsupported(
                format!("DeltaRule row states over {rows} rows on the CUDA bundles"),
                &["row states for passes of fewer than 64 rows (the step-wise form)"],
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        let prs = match rows_out {
            Some(t) => addr(t, "row states")?,
            None => 0,
        };
        let (pq, pk, pv) = (addr(q, "q")?, addr(k, "k")?, addr(v, "v")?);
        let (pg, pb, pst) = (
            addr(gate, "gate")?,
            addr(beta, "beta")?,
            addr(state, "state")?,
        );
        let (ps, pp, po) = (
            addr(slots, "slots")?,
            addr(pos, "positions")?,
            addr(&c.dst, "dst")?,
        );
        let (hki, hvi, dki, dvi) = (hk as i32, hv as i32, dk as i32, dv as i32);
        let (ri, nsi, err) = (rows as i32, n_slots as i32, self.error_word);
        let per_dim = i32::from(p.per_dim_gate);
        let col_groups = dv.div_ceil(DR_COLS);
        let step = |tab: u64, lists: [i32; 3], segments: u64| -> Result<(), PluginError> {
            let f = self.func("bl_delta_rule_step")?;
            let mut l = self.args(&f);
            l.arg(&pq).arg(&pk).arg(&pv).arg(&pg).arg(&pb).arg(&pst);
            l.arg(&ps).arg(&pp).arg(&po).arg(&prs).arg(&tab);
            l.arg(&lists[0]).arg(&lists[1]).arg(&lists[2]);
            l.arg(&hki).arg(&hvi).arg(&dki).arg(&dvi).arg(&ri).arg(&nsi);
            l.arg(&p.scale).arg(&p.beta_scale).arg(&per_dim).arg(&err);
            // SAFETY: each block reads its segment's rows of q, k, v, gate and beta and writes
            // its rows of dst (and of the row states, when given), all inside the checked spans;
            // slots are checked on the card before the state is touched, and each (slot, head,
            // column) of the state belongs to one block (one segment per slot).
            unsafe { l.launch(grid3(segments, col_groups, hv, 128)) }
                .map(|_| ())
                .map_err(driver_err("bl_delta_rule_step"))
        };
        if rows < DR_CHUNK {
            return step(0, [0; 3], rows);
        }
        // Segments name distinct slots; a long one has DR_CHUNK rows or more, and its chunks
        // number at most its rows / DR_CHUNK + 1.
        let max_short = rows.min(n_slots);
        let max_long = (rows / DR_CHUNK).min(n_slots);
        let max_chunks = rows / DR_CHUNK + max_long;
        let align = |b: u64| b.div_ceil(256) * 256;
        // DrTable in cu/recurrent.cuh: counts, all segments, short, long (3 lists), chunks (2).
        let tab_ints = 3 + (rows + 1) + max_short + 3 * max_long + 1 + 2 * max_chunks;
        let per = max_chunks * hv * DR_CHUNK * 4;
        // A per-dimension decay adds prep_dim's Qg, Kg and gl; a per-head one leaves them empty.
        let dim = u64::from(p.per_dim_gate);
        let sizes = [
            align(tab_ints * 4),
            align(per),                            // G
            align(per * DR_CHUNK),                 // P
            align(per * dk),                       // W
            align(per * dv),                       // U
            align(dim * per * dk),                 // Qg
            align(dim * per * dk),                 // Kg
            align(dim * max_chunks * hv * dk * 4), // gl
        ];
        let base = self.scratch(sizes.iter().sum())?;
        let mut at = [0u64; 8];
        let mut off = base;
        for (a, sz) in at.iter_mut().zip(sizes) {
            *a = off;
            off += sz;
        }
        let [tab, gs, pps, ws, us, qg, kg, gl] = at;
        let (qg, kg, gl) = if p.per_dim_gate {
            (qg, kg, gl)
        } else {
            (0, 0, 0)
        };
        let lists = [max_short as i32, max_long as i32, max_chunks as i32];
        let f = self.func("bl_delta_rule_table")?;
        let mut l = self.args(&f);
        l.arg(&ps).arg(&pp).arg(&tab).arg(&ri).arg(&nsi);
        l.arg(&lists[0]).arg(&lists[1]).arg(&lists[2]).arg(&err);
        // SAFETY: one block reads the slots and positions and writes the lists, which the table
        // area holds at their largest.
        unsafe { l.launch(grid3(1, 1, 1, 1024)) }.map_err(driver_err("bl_delta_rule_table"))?;
        step(tab, lists, max_short)?;
        let prep = if p.per_dim_gate {
            "bl_delta_rule_prep_dim"
        } else {
            "bl_delta_rule_prep"
        };
        let f = self.func(prep)?;
        let mut l = self.args(&f);
        l.arg(&pq)
            .arg(&pk)
            .arg(&pv)
            .arg(&pg)
            .arg(&pb)
            .arg(&tab)
            .arg(&ri);
        l.arg(&lists[0]).arg(&lists[1]).arg(&lists[2]);
        l.arg(&hki).arg(&hvi).arg(&dki).arg(&dvi).arg(&p.beta_scale);
        l.arg(&gs).arg(&pps).arg(&ws).arg(&us);
        if p.per_dim_gate {
            l.arg(&qg).arg(&kg).arg(&gl);
        }
        // SAFETY: block (chunk, head) reads the chunk's rows of the inputs and writes its own
        // areas of G, P, W and U (and of Qg, Kg and gl for a per-dimension decay), sized for
        // max_chunks chunks above; blocks past the table's chunk count return.
        unsafe { l.launch(grid3(max_chunks, hv, 1, 256)) }.map_err(driver_err(prep))?;
        let f = self.func("bl_delta_rule_chunks")?;
        let mut l = self.args(&f);
        l.arg(&pq)
            .arg(&pk)
            .arg(&pst)
            .arg(&ps)
            .arg(&pp)
            .arg(&tab)
            .arg(&ri);
        l.arg(&lists[0]).arg(&lists[1]).arg(&lists[2]);
        l.arg(&gs).arg(&pps).arg(&ws).arg(&us);
        l.arg(&qg).arg(&kg).arg(&gl).arg(&po);
        l.arg(&hki)
            .arg(&hvi)
            .arg(&dki)
            .arg(&dvi)
            .arg(&nsi)
            .arg(&p.scale);
        // SAFETY: block (long segment, columns, head) reads its chunks' areas and rows and owns
        // those columns of its slot's state; slots are checked before the state is touched.
        unsafe { l.launch(grid3(max_long, col_groups, hv, 128)) }
            .map_err(driver_err("bl_delta_rule_chunks"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::define_in;

    #[test]
    fn launch_constants_match_the_kernels() {
        let src = include_str!("../../cu/recurrent.cuh");
        assert_eq!(u64::from(CONV_MAX_TAPS), define_in(src, "CONV_MAX_TAPS"));
        assert_eq!(CONV_MAX_HIST, define_in(src, "CONV_MAX_HIST"));
        assert_eq!(CONV_STATE_ROWS, define_in(src, "CONV_STATE_ROWS"));
    }

    #[test]
    fn conv_histories_are_checked_and_limits_named() {
        assert_eq!(conv_history(4, 1).unwrap(), 3);
        assert_eq!(conv_history(4, 3).unwrap(), 9);
        assert_eq!(conv_history(1, 5).unwrap(), 0);
        assert!(conv_history(4, 0).is_err());
        let e = conv_history(17, 1).unwrap_err().to_string();
        assert!(e.contains("ConvCausal with 17 taps"), "{e}");
        let e = conv_history(16, 5).unwrap_err().to_string();
        assert!(e.contains("16 taps at dilation 5"), "{e}");
    }
}
