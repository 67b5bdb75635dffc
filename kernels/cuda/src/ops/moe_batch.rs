//! Routed experts of prompt batches (`cu/moe_batch.cuh`, around the tiled products of
//! `cu/mmq.cuh`): the route table sorted by expert on the card, then per expert one tiled product
//! over all its rows for gate/up and for down (each expert's weights read once per batch), the GLU
//! between them straight into Q8_1, and the weighted sum in slot order. `moe` takes this path for
//! batches of 16 rows or more with quantized stacks.

use bloomery_plugin_api::op::MoeParams;
use bloomery_plugin_api::PluginError;
use cudarc::driver::LaunchConfig;

use super::elementwise::glu_code;
use super::matmul::{MMQ_THREADS, MMQ_TILE};
use super::{driver_err, Launcher};

/// Threads of `bl_moe_tiles`, a thread per stack expert (`TILES_THREADS`).
const TILES_THREADS: u32 = 1024;
/// Threads of `bl_moe_route` (`ROUTE_THREADS`): a chunk of 32 entries a thread per round.
const ROUTE_THREADS: u32 = 1024;
/// Device addresses of one MoeExperts call: stacks as (pointer, row stride, expert stride, type).
pub(super) struct Stacks {
    pub(super) x: u64,
    pub(super) ids: u64,
    pub(super) weights: u64,
    pub(super) map: u64,
    pub(super) gate: (u64, i64, i64, i32),
    pub(super) up: Option<(u64, i64, i64, i32)>,
    pub(super) down: (u64, i64, i64, i32),
    pub(super) n_stack: u64,
    pub(super) out: u64,
}

impl Launcher {
    /// Routed experts for batches: the route table sorted by expert on the card, then per expert
    /// one tiled product over all its rows for gate/up and for down (each expert's weights read
    /// once per batch), the GLU between, and the weighted sum in slot order (into `st.out`,
    /// which the caller checked is 16-byte aligned).
    pub(super) fn moe_routed(
        &self,
        kernel: &'static str,
        st: &Stacks,
        p: MoeParams,
        n_embd: u64,
        rows: u64,
    ) -> Result<(), PluginError> {
        let (n_ff, k) = (u64::from(p.n_ff), u64::from(p.k));
        let entries = rows * k;
        if st.n_stack > u64::from(TILES_THREADS) {
            return Err(PluginError::unsupported(
                format!(
                    "batches over {} routed experts in one stack on the CUDA bundles (at most {TILES_THREADS})",
                    st.n_stack
                ),
                &[],
            ));
        }
        // Column tiles of all experts together: each expert's count rounded up to whole tiles.
        let max_tiles = entries.div_ceil(MMQ_TILE) + st.n_stack;
        let align = |b: u64| b.div_ceil(256) * 256;
        let sizes = [
            align(rows * (n_embd / 32) * 36),  // x as Q8_1
            align(st.n_stack * entries * 4),   // route lists
            align(st.n_stack * 4),             // route counts
            align(max_tiles * 8),              // column tiles
            align(entries * 2 * n_ff * 4),     // gate | up products
            align(entries * (n_ff / 32) * 36), // GLU as Q8_1
            align(entries * n_embd * 4),       // down products
        ];
        let mut at = [0u64; 7];
        let base = self.scratch(sizes.iter().sum())?;
        let mut off = base;
        for (a, sz) in at.iter_mut().zip(sizes) {
            *a = off;
            off += sz;
        }
        let [xq, list, count, tiles, gu, hq, dbuf] = at;
        let flat = |n: u64| LaunchConfig {
            grid_dim: (n.div_ceil(256).clamp(1, 4096) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.quantize_q8_1(st.x, xq, rows * (n_embd / 32))?;
        let (ne, nf, nx) = (n_embd as i32, n_ff as i32, p.n_expert as i32);
        let (n_entries, list_stride, err) = (entries as i32, entries as i64, self.error_word);
        let f = self.func("bl_moe_route")?;
        let mut l = self.args(&f);
        l.arg(&st.ids).arg(&st.map).arg(&n_entries).arg(&nx);
        l.arg(&list).arg(&list_stride).arg(&count).arg(&err);
        // SAFETY: one block per stack expert writes its own list (at most `entries` long) and count.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (st.n_stack as u32, 1, 1),
                block_dim: (ROUTE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(driver_err("bl_moe_route"))?;
        // Every expert's column tiles as one list, so that the products launch no empty blocks.
        let (ns, mt) = (st.n_stack as i32, max_tiles as i32);
        let f = self.func("bl_moe_tiles")?;
        let mut l = self.args(&f);
        l.arg(&count).arg(&ns).arg(&tiles).arg(&mt);
        // SAFETY: one block of TILES_THREADS threads, a thread per stack expert (checked above);
        // the tiles area holds max_tiles entries, which bound the tiles of `entries` columns.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (TILES_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(driver_err("bl_moe_tiles"))?;
        let tiled = self.func(kernel)?;
        let product = |stack: (u64, i64, i64, i32),
                       act: u64,
                       act_row: i64,
                       col_div: i32,
                       y: u64,
                       y_row: i64,
                       kk: u64,
                       nn: u64|
         -> Result<(), PluginError> {
            let (pw, w_row, w_exp, wtype) = stack;
            let (ki, ni) = (kk as i32, nn as i32);
            let mut l = self.args(&tiled);
            l.arg(&pw)
                .arg(&w_row)
                .arg(&w_exp)
                .arg(&wtype)
                .arg(&act)
                .arg(&act_row);
            l.arg(&list)
                .arg(&list_stride)
                .arg(&count)
                .arg(&tiles)
                .arg(&col_div);
            l.arg(&y).arg(&y_row).arg(&ki).arg(&ni);
            let grid = (nn.div_ceil(MMQ_TILE) as u32, max_tiles as u32, 1);
            // SAFETY: a block per (row tile, listed column tile) reads its expert's stack rows
            // (< nn) and listed columns, whose entries index rows of the activation and output
            // areas sized above.
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: grid,
                    block_dim: (MMQ_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map(|_| ())
            .map_err(driver_err(kernel))
        };
        let x_row = ((n_embd / 32) * 36) as i64;
        let (gu_row, ki) = ((2 * n_ff) as i64, k as i32);
        match st.up {
            None => product(st.gate, xq, x_row, ki, gu, gu_row, n_embd, 2 * n_ff)?,
            Some(up) => {
                product(st.gate, xq, x_row, ki, gu, gu_row, n_embd, n_ff)?;
                product(up, xq, x_row, ki, gu + n_ff * 4, gu_row, n_embd, n_ff)?;
            }
        }
        let kind = glu_code(p.glu, p.limit)?;
        let n_e = entries as i64;
        let f = self.func("bl_moe_glu_q8_1")?;
        let mut l = self.args(&f);
        l.arg(&gu)
            .arg(&hq)
            .arg(&n_e)
            .arg(&nf)
            .arg(&kind)
            .arg(&p.limit);
        // SAFETY: 8 threads per Q8_1 block of the GLU (entries x n_ff / 32 blocks, whole warps a
        // grid step) read their quads of the gate | up rows (2 n_ff floats each, the layout the
        // products above wrote; 16-byte aligned: a 256-aligned area, n_ff a multiple of 32) and
        // write the block into hq, both areas sized so.
        unsafe { l.launch(flat(entries * n_ff / 4)) }.map_err(driver_err("bl_moe_glu_q8_1"))?;
        let h_row = ((n_ff / 32) * 36) as i64;
        product(st.down, hq, h_row, 1, dbuf, n_embd as i64, n_ff, n_embd)?;
        let ri = rows as i32;
        let f = self.func("bl_moe_combine")?;
        let mut l = self.args(&f);
        l.arg(&dbuf)
            .arg(&st.ids)
            .arg(&st.map)
            .arg(&st.weights)
            .arg(&st.out);
        l.arg(&ne).arg(&ki).arg(&ri).arg(&nx);
        // SAFETY: a thread per four of the rows x n_embd outputs (n_embd a multiple of 32, out
        // 16-byte aligned: checked by the caller, dbuf 256-aligned); only entries with a valid,
        // mapped expert are read.
        unsafe { l.launch(flat(rows * n_embd / 4)) }.map_err(driver_err("bl_moe_combine"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::tests::define_in;

    #[test]
    fn launch_shapes_match_the_kernels() {
        let batch = include_str!("../../cu/moe_batch.cuh");
        assert_eq!(
            define_in(batch, "TILES_THREADS"),
            u64::from(super::TILES_THREADS)
        );
        assert_eq!(
            define_in(batch, "ROUTE_THREADS"),
            u64::from(super::ROUTE_THREADS)
        );
    }
}
