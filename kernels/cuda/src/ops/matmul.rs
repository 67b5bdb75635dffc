//! Matrix products (`cu/matmul.cuh`, `cu/gemm_f32.cuh`, `cu/mmq.cuh`): `y = W x` for F32 weights
//! (a block per output for the few outputs of routers and gates, `bl_matmul_f32_split` in
//! `cu/router.cuh` beside the fused router kernel that repeats its sums; a warp per output; or
//! tiles for batches) and for weights of any type of [`QUANT_TYPES`] against activations
//! quantized to Q8_1 in the scratch: a warp per (row, column) for a single column, the few-column
//! forms for 2 to 15 columns (each weight row read once per pass of up to 8), and tiles on the
//! int8 tensor cores (or dp4a) for batches of 16 rows or more. Up to three products of the same
//! activations go in one launch (`fused::matmul_parts`). Stacks of per-head matrices take
//! `matmul_heads`.
//!
//! [`QUANT_TYPES`]: super::QUANT_TYPES

use bloomery_plugin_api::op::{OpKind, OpSupport};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::{result, LaunchConfig};

use super::activations::Quantized;
use super::matmul_heads::is_per_head;
use super::quant::{pairs_ok, per_wtype, typed, weight_code, with_quant_types, STAGE_PAIR};
use super::{cfg, driver_err, f32_only, grid, Addr, Launcher, Src, BLOCK, WARPS};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![OpSupport {
        op: OpKind::MatMul,
        dtypes: with_quant_types(&[DType::F32]),
    }]
}

/// Single-row quantized products, per weight type.
pub(super) const MATMUL_Q: [&str; 13] = per_wtype!("bl_matmul_q");
/// Q, K and V of one activation row in one launch (ops/fused/matmul_parts.rs), per weight type.
pub(super) const MATMUL_Q_PARTS: [&str; 13] = per_wtype!("bl_matmul_q_parts");
/// One few-column product of a pair-form type (`bl_matmul_q_few_<type>_<M>_<R>`, and its
/// three-part form `bl_matmul_q_few_parts_...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FewForm {
    /// Weight type code.
    wtype: i32,
    /// Columns per pass (M).
    pub(crate) cols: u64,
    /// Weight rows per warp (R).
    pub(crate) rows: u64,
    /// The single product's entry point.
    pub(crate) name: &'static str,
    /// The entry point of up to three products of the same activations.
    pub(crate) parts: &'static str,
}

macro_rules! few_forms {
    ($(($t:literal, $m:literal, $r:literal)),* $(,)?) => {
        [$(FewForm {
            wtype: $t,
            cols: $m,
            rows: $r,
            name: concat!("bl_matmul_q_few_", $t, "_", $m, "_", $r),
            parts: concat!("bl_matmul_q_few_parts_", $t, "_", $m, "_", $r),
        }),*]
    };
}

/// The few-column forms the kernels define. R trades warps in flight against activation reads
/// per weight row; `few_cols` picks it by the row count as kernels/cuda/bench/cols_bench.cu
/// measured on the H200.
pub(super) const MATMUL_Q_FEW: [FewForm; 15] = few_forms![
    (1, 2, 1),
    (1, 4, 1),
    (1, 8, 1),
    (1, 2, 2),
    (1, 4, 2),
    (1, 8, 2),
    (1, 2, 4),
    (1, 4, 4),
    (1, 8, 4),
    (2, 2, 1),
    (2, 4, 1),
    (2, 8, 1),
    (2, 2, 2),
    (2, 4, 2),
    (2, 8, 2),
];

/// Threads per block of the few-column products (4 warps).
pub(crate) const FEW_BLOCK: u32 = 128;

/// The few-column form for `m` (2 or more) columns of `n` weight rows (the largest part's) of
/// type `wtype`; None for types without a pair form.
pub(crate) fn few_cols(wtype: i32, n: u64, m: u64) -> Option<FewForm> {
    let cols = match m {
        0..=2 => 2,
        3 | 4 => 4,
        _ => 8,
    };
    let rows = match (wtype, n) {
        (1, 2048..) => 4,
        (_, 1024..) => 2,
        _ => 1,
    };
    MATMUL_Q_FEW
        .iter()
        .find(|f| (f.wtype, f.cols, f.rows) == (wtype, cols, rows))
        .copied()
}

/// The dynamic shared memory a single-row product launch gives its blocks so that its pair
/// form (Q8_0, Q4_K) can stage `rows` Q8_1 activation rows of `nvals` values (cu/matmul.cuh
/// `stage_rows`); 0 where the form cannot apply, and the kernel then reads them from global
/// memory. At most 48 KiB, the default limit per block.
pub(super) fn stage_bytes(wtype: i32, nvals: u64, rows: u64) -> u32 {
    let bytes = nvals / 64 * STAGE_PAIR * rows;
    if matches!(wtype, 1 | 2) && nvals.is_multiple_of(64) && bytes <= 48 * 1024 {
        bytes as u32
    } else {
        0
    }
}

/// Weight rows, columns and threads of a block of `bl_matmul_f32_tiled` (`F32T_BN`, `F32T_BM`,
/// `F32T_THREADS`).
const F32_TILE_ROWS: u64 = 16;
const F32_TILE_COLS: u64 = 32;
const F32_TILE_THREADS: u32 = 256;

/// Whether an F32 product of `m` columns of `k` values takes `bl_matmul_f32_tiled`: a batch
/// (as the quantized products take tiles), whole quads, and 16-byte aligned addresses and weight
/// rows (`aligned`: w, x, the row stride).
fn f32_tiles(m: u64, k: u64, aligned: [u64; 3]) -> bool {
    m >= MMQ_MIN_ROWS && k.is_multiple_of(4) && aligned.iter().all(|a| a.is_multiple_of(16))
}

/// F32 products with at most this many (row, column) pairs take a block per pair
/// (`bl_matmul_f32_split`, whose block size this is), not a warp.
pub(super) const F32_SPLIT_MAX_TASKS: u64 = 4096;
/// Threads of `bl_matmul_f32_split` (its `SPLIT_THREADS`).
pub(super) const F32_SPLIT_THREADS: u32 = 128;
/// Threads per block of `bl_matmul_q_cols` (a warp per weight row): 4 warps, so that the few
/// hundred rows of a K or V projection still spread over the SMs.
const MQ_COLS_BLOCK: u32 = 128;

/// The batched quantized product in use (`BLOOMERY_CUDA_MMQ=mma2|mma|dp4a|off`; mma2 by
/// default: on an H100 it took Clef-Flash's Q8_0 prompts 4-5% faster than mma, docs/performance.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mmq {
    /// Tiles on the int8 tensor cores.
    Mma,
    /// As `Mma`, with the wide tile (`bl_mmq2_*`) for the dense and parts products of batches
    /// of [`MMQ2_MIN_ROWS`] rows or more.
    Mma2,
    /// The same tiles with dp4a.
    Dp4a,
    /// One warp per (row, column), as for single rows.
    Off,
}

/// The dense and parts kernels of a tiled product and the launch shape they take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MmqTiles {
    /// The dense kernel.
    pub(crate) dense: &'static str,
    /// The kernel of up to three products of one batch ([`Launcher::fused`]).
    pub(crate) parts: &'static str,
    /// Weight rows of a tile.
    pub(crate) rows: u64,
    /// Activation rows (output columns) of a tile.
    pub(crate) cols: u64,
    /// Threads of a block.
    pub(crate) threads: u32,
    /// Dynamic shared memory of a block, bytes.
    pub(crate) smem: u32,
}

/// The 64 x 64 tiles (`mmq_tile`) on the tensor cores.
const MMA_TILES: MmqTiles = MmqTiles {
    dense: "bl_mmq_mma",
    parts: "bl_mmq_parts_mma",
    rows: MMQ_TILE,
    cols: MMQ_TILE,
    threads: MMQ_THREADS,
    smem: 0,
};

/// The wide tile (`mmq_tile2`): 128 weight rows x 64 columns, 8 warps, its `Mmq2Smem` dynamic.
const MMA2_TILES: MmqTiles = MmqTiles {
    dense: "bl_mmq2_mma",
    parts: "bl_mmq2_parts_mma",
    rows: 128,
    cols: 64,
    threads: 256,
    smem: ((128 + 64) * MMQ_LD_BYTES + MMQ_SLOTS * (128 + 64) * 8) as u32,
};

/// Bytes of one staged row of a k step (`MMQ_LD` ints) and the slots of a k step (`MMQ_SB`).
const MMQ_LD_BYTES: u64 = (MMQ_SLOTS * 8 + 4) * 4;
const MMQ_SLOTS: u64 = 8;

impl Mmq {
    pub(super) fn from_env() -> Mmq {
        match std::env::var("BLOOMERY_CUDA_MMQ").as_deref() {
            Ok("dp4a") => Mmq::Dp4a,
            Ok("mma") => Mmq::Mma,
            Ok("off") => Mmq::Off,
            _ => Mmq::Mma2,
        }
    }

    /// The dense and parts kernels when batches of `rows` use tiles.
    pub(super) fn tiles(self, rows: u64) -> Option<MmqTiles> {
        match self {
            _ if rows < MMQ_MIN_ROWS => None,
            Mmq::Mma2 if rows >= MMQ2_MIN_ROWS => Some(MMA2_TILES),
            Mmq::Mma | Mmq::Mma2 => Some(MMA_TILES),
            Mmq::Dp4a => Some(MmqTiles {
                dense: "bl_mmq_dp4a",
                parts: "bl_mmq_parts_dp4a",
                ..MMA_TILES
            }),
            Mmq::Off => None,
        }
    }

    /// The routed experts' kernel (64 x 64 tiles) when batches of `rows` use tiles.
    pub(super) fn experts(self, rows: u64) -> Option<&'static str> {
        match self {
            _ if rows < MMQ_MIN_ROWS => None,
            Mmq::Mma | Mmq::Mma2 => Some("bl_mmq_experts_mma"),
            Mmq::Dp4a => Some("bl_mmq_experts_dp4a"),
            Mmq::Off => None,
        }
    }
}

/// Batches of at least this many rows use the tiled products.
pub(super) const MMQ_MIN_ROWS: u64 = 16;
/// Batches of at least this many rows take the wide tile under `BLOOMERY_CUDA_MMQ=mma2`: shorter
/// ones have one or two column tiles, and its 128-row tiles would halve the few blocks the SMs get.
pub(super) const MMQ2_MIN_ROWS: u64 = 128;
/// Rows and columns of one tile of the 64 x 64 tiled products.
pub(super) const MMQ_TILE: u64 = 64;
/// Threads per block of the 64 x 64 tiled products (`MMQ_THREADS`).
pub(super) const MMQ_THREADS: u32 = 128;

/// Dense tiled products with fewer 64 x 64 tiles than this split k in two halves (grid z): about
/// the blocks an H200's 132 SMs hold at once (4 each). The wide tile splits where these would,
/// so that both give the same f32 bits.
const MMQ_SPLIT_BELOW_TILES: u64 = 512;

/// Along z of a dense tiled product of `tiles` tiles over `k` values: 2 (each half of the k
/// steps adds into the zeroed output) when the tiles are few and there is more than one k step
/// of 256 values, else 1.
fn mmq_k_halves(tiles: u64, k: u64) -> u32 {
    if tiles < MMQ_SPLIT_BELOW_TILES && k > 256 {
        2
    } else {
        1
    }
}

impl Launcher {
    /// `y = W x` for the weights of source 0 and the f32 activations of source 1; `held` is the
    /// Q8_1 copy the scratch holds.
    pub(super) fn matmul<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        held: Option<Quantized>,
    ) -> Result<(), PluginError> {
        let (w, x) = (src(0)?, src(1)?);
        f32_only(x, "MatMul x")?;
        f32_only(&c.dst, "MatMul dst")?;
        if is_per_head(w) {
            return self.matmul_heads(addr, w, x, c, held);
        }
        let (k, n, m) = (w.ne[0], w.ne[1], x.rows());
        if x.ne[0] != k || c.dst.ne[0] != n || c.dst.rows() != m || w.rows() != n {
            return Err(PluginError::invalid(format!(
                "MatMul shapes {:?} x {:?} -> {:?}",
                w.ne, x.ne, c.dst.ne
            )));
        }
        let (pw, px, py) = (addr(w, "w")?, addr(x, "x")?, addr(&c.dst, "dst")?);
        let (stride, ki, ni, mi) = (w.nb[1] as i64, k as i32, n as i32, m as i32);
        let tasks = n * m;
        match (w.dtype, weight_code(w.dtype)) {
            (DType::F32, _) => {
                // A batch: tiles. Few outputs (a router, a gate at decode): a block per
                // output splits k. Else a warp per output.
                let (name, launch) = if f32_tiles(m, k, [pw, px, stride as u64]) {
                    let launch = LaunchConfig {
                        grid_dim: (
                            n.div_ceil(F32_TILE_ROWS) as u32,
                            m.div_ceil(F32_TILE_COLS) as u32,
                            1,
                        ),
                        block_dim: (F32_TILE_THREADS, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    ("bl_matmul_f32_tiled", launch)
                } else if tasks <= F32_SPLIT_MAX_TASKS {
                    ("bl_matmul_f32_split", cfg(tasks as u32, F32_SPLIT_THREADS))
                } else {
                    ("bl_matmul_f32", cfg(grid(tasks, WARPS), BLOCK))
                };
                let f = self.func(name)?;
                let mut l = self.args(&f);
                l.arg(&pw)
                    .arg(&stride)
                    .arg(&px)
                    .arg(&py)
                    .arg(&ki)
                    .arg(&ni)
                    .arg(&mi);
                // SAFETY: a block per tile (rows and columns past n and m neither read
                // nor written, k whole quads), a block or a warp per output, all
                // inside the checked spans.
                unsafe { l.launch(launch) }.map_err(driver_err(name))?;
            }
            (_, Some((wtype, block))) => {
                if k % block.max(32) != 0 {
                    return Err(PluginError::invalid(format!(
                        "{} rows must be whole blocks",
                        w.dtype
                    )));
                }
                let nblocks = (k / 32) * m;
                let copy = self.quantize_in_scratch(px, nblocks, held)?;
                let q = copy.q;
                // The next product may reuse q unless this one overwrites x.
                let (x_end, y_end) = (px + x.elements() * 4, py + c.dst.elements() * 4);
                if y_end <= px || x_end <= py {
                    self.keep_quantized(copy)?;
                }
                let x_row = ((k / 32) * 36) as i64;
                if let Some(form) = self.mmq.tiles(m) {
                    let tiled = form.dense;
                    let f = self.func_smem(tiled, form.smem)?;
                    let mut l = self.args(&f);
                    l.arg(&pw).arg(&stride).arg(&wtype).arg(&q).arg(&x_row);
                    l.arg(&py).arg(&ki).arg(&ni).arg(&mi);
                    let tiles = n.div_ceil(MMQ_TILE) * m.div_ceil(MMQ_TILE);
                    let halves = mmq_k_halves(tiles, k);
                    if halves > 1 {
                        // The halves add into y.
                        // SAFETY: y is the checked m x n output span, on this stream.
                        unsafe {
                            result::memset_d8_async(
                                py,
                                0,
                                (m * n * 4) as usize,
                                self.stream.cu_stream(),
                            )
                        }
                        .map_err(driver_err("cuMemsetD8Async"))?;
                    }
                    let grid = (
                        n.div_ceil(form.rows) as u32,
                        m.div_ceil(form.cols) as u32,
                        halves,
                    );
                    // SAFETY: one block per tile (and half of k), with the dynamic shared
                    // memory the kernel takes; rows and columns beyond n and m are neither read
                    // nor written; all inside the checked spans.
                    unsafe {
                        l.launch(LaunchConfig {
                            grid_dim: grid,
                            block_dim: (form.threads, 1, 1),
                            shared_mem_bytes: form.smem,
                        })
                    }
                    .map_err(driver_err(tiled))?;
                    return Ok(());
                }
                // A single column: one warp per row. A few columns (several decode
                // streams): each weight row read once per pass of up to 8 columns, by a
                // warp taking 1, 2 or 4 rows (Q8_0, Q4_K) or one row (other types).
                let few = if m > 1 && pairs_ok(wtype, pw, stride, 0, k) {
                    few_cols(wtype, n, m)
                } else {
                    None
                };
                let (name, launch) = if m == 1 {
                    let launch = LaunchConfig {
                        shared_mem_bytes: stage_bytes(wtype, k, 2),
                        ..cfg(grid(tasks, WARPS), BLOCK)
                    };
                    (typed(&MATMUL_Q, wtype)?, launch)
                } else if let Some(form) = few {
                    let warps = u64::from(FEW_BLOCK / 32) * form.rows;
                    let launch = LaunchConfig {
                        grid_dim: (grid(n, warps), m.div_ceil(form.cols) as u32, 1),
                        block_dim: (FEW_BLOCK, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    (form.name, launch)
                } else {
                    let warps = u64::from(MQ_COLS_BLOCK / 32);
                    ("bl_matmul_q_cols", cfg(grid(n, warps), MQ_COLS_BLOCK))
                };
                let f = self.func(name)?;
                let mut l = self.args(&f);
                l.arg(&pw).arg(&stride).arg(&q).arg(&x_row).arg(&py);
                l.arg(&ki).arg(&ni).arg(&mi);
                if m > 1 && few.is_none() {
                    l.arg(&wtype);
                }
                // SAFETY: one warp per (row, column), per row or per R rows, all inside
                // the checked spans.
                unsafe { l.launch(launch) }.map_err(driver_err(name))?;
            }
            (other, None) => {
                return Err(PluginError::unsupported(
                    format!("MatMul with {other} weights"),
                    &[],
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::tests::define_in;

    #[test]
    fn launch_shapes_match_the_kernels() {
        let mmq = include_str!("../../cu/mmq.cuh");
        assert_eq!(define_in(mmq, "MMQ_BN"), super::MMQ_TILE);
        assert_eq!(define_in(mmq, "MMQ_THREADS"), u64::from(super::MMQ_THREADS));
        assert_eq!(define_in(mmq, "MMQ_BM"), super::MMQ_TILE);
        assert_eq!(define_in(mmq, "MMQ_SB"), super::MMQ_SLOTS);
        let wide = super::MMA2_TILES;
        assert_eq!(define_in(mmq, "MMQ2_BM"), wide.rows);
        assert_eq!(define_in(mmq, "MMQ2_BN"), wide.cols);
        assert_eq!(define_in(mmq, "MMQ2_THREADS"), u64::from(wide.threads));
        assert!(mmq.contains("#define MMQ_LD (MMQ_SB * 8 + 4)"));
        // sizeof(Mmq2Smem): the staged rows, then a float2 per (slot, row or column).
        assert_eq!(wide.smem, 64_512);
        let gemm = include_str!("../../cu/gemm_f32.cuh");
        assert_eq!(define_in(gemm, "F32T_BN"), super::F32_TILE_ROWS);
        assert_eq!(define_in(gemm, "F32T_BM"), super::F32_TILE_COLS);
        assert_eq!(
            define_in(gemm, "F32T_THREADS"),
            u64::from(super::F32_TILE_THREADS)
        );
    }

    #[test]
    fn mma2_takes_the_wide_tile_for_long_batches_only() {
        use super::{Mmq, MMA2_TILES, MMA_TILES};
        assert_eq!(Mmq::Mma2.tiles(512), Some(MMA2_TILES));
        assert_eq!(Mmq::Mma2.tiles(128), Some(MMA2_TILES));
        assert_eq!(Mmq::Mma2.tiles(127), Some(MMA_TILES));
        assert_eq!(Mmq::Mma2.tiles(15), None, "decode keeps warps");
        assert_eq!(
            Mmq::Mma.tiles(512),
            Some(MMA_TILES),
            "the default is unchanged"
        );
        assert_eq!(Mmq::Mma2.experts(512), Mmq::Mma.experts(512));
        assert_eq!(Mmq::Dp4a.tiles(512).map(|t| t.dense), Some("bl_mmq_dp4a"));
        assert_eq!(Mmq::Off.tiles(512), None);
    }

    #[test]
    fn few_dense_tiles_split_k_in_halves() {
        assert_eq!(super::mmq_k_halves(256, 4096), 2, "an output projection");
        assert_eq!(super::mmq_k_halves(511, 352), 2, "a partial second step");
        assert_eq!(super::mmq_k_halves(512, 4096), 1, "enough tiles");
        assert_eq!(super::mmq_k_halves(8, 256), 1, "one k step");
    }

    #[test]
    fn f32_batches_take_tiles_when_whole_quads_and_aligned() {
        let aligned = [256, 4096, 8192];
        assert!(super::f32_tiles(512, 2048, aligned));
        assert!(super::f32_tiles(16, 352, aligned));
        assert!(!super::f32_tiles(15, 2048, aligned), "decode keeps warps");
        assert!(!super::f32_tiles(512, 2050, aligned), "a partial quad");
        assert!(
            !super::f32_tiles(512, 2048, [256, 4100, 8192]),
            "x off 16 bytes"
        );
        assert!(
            !super::f32_tiles(512, 2048, [256, 4096, 8200]),
            "rows off 16 bytes"
        );
    }

    #[test]
    fn few_column_products_cover_every_column_count_and_name_their_form() {
        for wtype in [1, 2] {
            for m in 2..16 {
                for n in [256, 512, 1024, 2048, 4096] {
                    let f = super::few_cols(wtype, n, m).expect("a form");
                    let (cols, rows) = (f.cols, f.rows);
                    assert!(
                        cols >= m.min(8) && (cols == 2 || cols / 2 < m),
                        "{m} columns in {cols}"
                    );
                    assert_eq!(f.name, format!("bl_matmul_q_few_{wtype}_{cols}_{rows}"));
                    assert_eq!(
                        f.parts,
                        format!("bl_matmul_q_few_parts_{wtype}_{cols}_{rows}")
                    );
                }
            }
        }
        assert_eq!(super::few_cols(1, 4096, 2).map(|f| f.rows), Some(4));
        assert_eq!(super::few_cols(2, 4096, 2).map(|f| f.rows), Some(2));
        assert_eq!(super::few_cols(1, 512, 2).map(|f| f.rows), Some(1));
        assert_eq!(super::few_cols(3, 4096, 2), None, "Q6_K has no pair form");
    }
}
