//! Cases of the k-pool indexer's selection. GLM-5.3's DSA (32 heads of 128, pools of 4): decode
//! rows at depth 8,192 (2,047 complete pools, 512 kept, one row completing a pool), a prompt of
//! two sequences (one from position 0, one continuing at 1,000; pools completed inside the call
//! read by later rows), and 8 heads without the tail. Qwen3.8-Flash-Next's QSA (4 heads of 128,
//! pools of 4, 512 kept, the IMROPE of its keys): the same decode rows and prompt. The random
//! pooled sections stand in for the pooled keys of earlier calls; the cache is compared after the
//! run (the pooled keys the call writes) besides the lists, which must be equal (any other pool
//! moves a position by at least 4, far above the tolerance).

use bloomery_plugin_api::op::{KPoolMode, KPoolParams, Op, OpKind, RopeMode, RopeParams};
use bloomery_plugin_api::DType;

use super::{case, f32s, runs, spec};
use crate::opcheck::{Case, Fill};

/// A selection of `rows` rows (`split` in the first sequence, positions from `first`) over a
/// cache of `n_slots` slots of `len`.
fn select(
    name: &str,
    cache: DType,
    p: KPoolParams,
    [len, n_slots]: [u64; 2],
    [rows, split]: [u64; 2],
    slots: [i32; 2],
    first: [i32; 2],
) -> Case {
    let (dh, nh, kpool) = (
        u64::from(p.head_dim),
        u64::from(p.n_head),
        u64::from(p.kpool),
    );
    let n_sel = kpool * u64::from(p.n_top) + if p.tail { kpool - 1 } else { 0 };
    let mut srcs = vec![f32s([dh, nh, rows, 1])];
    match p.mode {
        KPoolMode::SoftmaxGate => srcs.extend([
            spec(DType::F32, [nh, rows, 1, 1], Fill::Random(0.1)),
            spec(cache, [3 * dh, len, n_slots, 1], Fill::Random(2.0)),
            f32s([dh, kpool, 1, 1]),
        ]),
        // The norm's gamma about 1, as the model's (stored +1).
        KPoolMode::MeanNormRope { .. } => srcs.extend([
            spec(DType::F32, [dh, 1, 1, 1], Fill::Range(0.5, 1.5)),
            spec(cache, [2 * dh, len, n_slots, 1], Fill::Random(2.0)),
        ]),
    }
    srcs.extend([runs(rows, split, slots, 0), runs(rows, split, first, 1)]);
    Case {
        dst_dtype: DType::I32,
        also_src: Some(2),
        ..case(name, Op::KPoolSelect(p), srcs, [n_sel, rows, 1, 1], 1e-6)
    }
}

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    let glm = KPoolParams {
        n_head: 32,
        head_dim: 128,
        kpool: 4,
        n_top: 512,
        tail: true,
        mode: KPoolMode::SoftmaxGate,
    };
    // QSA: the indexer's 4 heads of 128, budget 2,048 (512 pools), the keys roped as the model's (IMROPE
    // [11, 11, 10] on 64 dims, θ 1e7), every head weighing 1/√128.
    let qsa = KPoolParams {
        n_head: 4,
        mode: KPoolMode::MeanNormRope {
            eps: 1e-6,
            rope: RopeParams::unscaled(RopeMode::Imrope, 64, [11, 11, 10, 0], 1e7),
            scale: 128f32.sqrt().recip(),
        },
        ..glm
    };
    match (op, dtype) {
        (OpKind::KPoolSelect, DType::F32 | DType::F16) => vec![
            select(
                "QSA decode at depth 8,192, 2 slots",
                dtype,
                qsa,
                [8192, 2],
                [2, 1],
                [1, 0],
                [8191, 5000],
            ),
            select(
                "QSA 300 prompt rows, 2 sequences",
                dtype,
                qsa,
                [2048, 3],
                [300, 120],
                [2, 0],
                [1000, 0],
            ),
            select(
                "decode at depth 8,192, 2 slots",
                dtype,
                glm,
                [8192, 2],
                [2, 1],
                [1, 0],
                [8191, 5000],
            ),
            select(
                "300 prompt rows, 2 sequences, 64 kept",
                dtype,
                KPoolParams { n_top: 64, ..glm },
                [2048, 3],
                [300, 120],
                [2, 0],
                [1000, 0],
            ),
            select(
                "8 heads, no tail, 40 rows",
                dtype,
                KPoolParams {
                    n_head: 8,
                    n_top: 4,
                    tail: false,
                    ..glm
                },
                [64, 1],
                [40, 40],
                [0, 0],
                [0, 0],
            ),
        ],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use bloomery_kernels_cpu::dispatch::{run, Backend};
    use bloomery_kernels_cpu::linear::{reference_rows_dot, Serial};
    use bloomery_kernels_cpu::memory::Buffers;
    use bloomery_plugin_api::op::{Op, OpKind};
    use bloomery_plugin_api::tensor::{OpCall, TensorRef};
    use bloomery_plugin_api::DType;
    use rand::SeedableRng;

    /// Each case (the F32 cache; the F16 ones differ in type only) runs on the reference's
    /// dispatch (cpu-scalar's) and lists, for every row, `min(n_top, complete)` distinct pools,
    /// each complete at the row's position: the cases are well formed, so on the card a
    /// difference is the card's.
    #[test]
    fn every_case_runs_on_the_reference_and_selects_complete_pools() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for dtype in [DType::F32] {
            for case in super::cases(OpKind::KPoolSelect, dtype) {
                let buf = Buffers::default();
                let data: Vec<Vec<u8>> = case
                    .srcs
                    .iter()
                    .map(|s| crate::opcheck::fill_bytes(s, &mut rng).unwrap())
                    .collect();
                let srcs: Vec<TensorRef> = case
                    .srcs
                    .iter()
                    .zip(&data)
                    .map(|(s, d)| {
                        let h = buf.alloc(d.len() as u64).unwrap();
                        buf.write(h, 0, d).unwrap();
                        TensorRef {
                            buffer: h,
                            offset: 0,
                            dtype: s.dtype,
                            ne: s.ne,
                            nb: TensorRef::contiguous_strides(s.dtype, s.ne).unwrap(),
                        }
                    })
                    .collect();
                let [n_sel, rows] = [case.dst[0] as usize, case.dst[1] as usize];
                let h = buf.alloc((n_sel * rows * 4) as u64).unwrap();
                let dst = TensorRef {
                    buffer: h,
                    offset: 0,
                    dtype: DType::I32,
                    ne: case.dst,
                    nb: TensorRef::contiguous_strides(DType::I32, case.dst).unwrap(),
                };
                let b = Backend {
                    buffers: &buf,
                    par: &Serial,
                    dot: reference_rows_dot,
                };
                run(&b, &OpCall::new(case.op, &srcs, dst)).unwrap();
                let mut out = vec![0u8; n_sel * rows * 4];
                buf.read(h, 0, &mut out).unwrap();
                let out: Vec<i32> = out
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let Op::KPoolSelect(p) = case.op else {
                    panic!("{}", case.name)
                };
                let pos: Vec<i32> = data[case.srcs.len() - 1]
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let (kpool, n_top) = (p.kpool as i32, p.n_top as usize);
                for (r, row) in out.chunks_exact(n_sel).enumerate() {
                    let complete = (pos[r] + 1) / kpool;
                    let mut pools: Vec<i32> = row[..kpool as usize * n_top]
                        .iter()
                        .filter(|&&v| v >= 0)
                        .map(|&v| v / kpool)
                        .collect();
                    pools.dedup();
                    assert_eq!(pools.len(), n_top.min(complete as usize), "{}", case.name);
                    assert!(pools.iter().all(|&g| g < complete), "{}", case.name);
                    pools.sort_unstable();
                    pools.dedup();
                    assert_eq!(pools.len(), n_top.min(complete as usize), "{}", case.name);
                }
            }
        }
    }
}
