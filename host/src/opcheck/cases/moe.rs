//! Cases of the routed experts: F32 and every quantized stack type, separate and fused gate/up,
//! decode rows and batches (the tiled path), SwiGLU plain and clamped (GLM-5.3's limit) and GeGLU.

use bloomery_plugin_api::op::{GluKind, MoeParams, Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, f32s, ids, spec};
use crate::opcheck::{Case, Fill};

/// Routed experts: 2 of 4, hidden rows of 32.
fn moe(fused: bool, glu: GluKind) -> Op {
    Op::MoeExperts(MoeParams {
        n_expert: 4,
        k: 2,
        n_ff: 32,
        glu,
        limit: 0.0,
        fused_gate_up: fused,
        expert_map: false,
    })
}

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
        (OpKind::MoeExperts, t) if t.is_quantized() || t == DType::F32 => {
            // The 256-value types need rows of 256: n_embd = n_ff = 256 there.
            let superblocks = t.layout().is_some_and(|l| l.block > 32);
            let (e, f) = if superblocks { (256, 256) } else { (64, 32) };
            // 256-value types: as for MatMul, Q8_K against Q8_1 activations, twice (x, then the
            // GLU rows); Q4_K seeds 1-3 gave 0.8e-2 to 2.1e-2 on the H200, and a CPU simulation
            // of both roundings 1.9e-2 to 2.3e-2 worst over 12 seeds for each of these types;
            // on the H100, seed 4 gave 3.1e-2 (Q5_K, separate GLU) and seed 7 3.4e-2 (Q4_K,
            // fused GEGLU): the heavy-tailed GLU rows' 8-bit rounding, so 5e-2.
            // The 32-value types: the GLU rows differ from the CPU's in the last bits, which can
            // move one of their 8-bit activations by a step (up to about 2.5e-3 of the output in
            // the 3-row cases, 7e-4 in the 40-row ones); a wrong layout gives errors near 1. F32
            // and Q8_0 keep the bounds they were measured with.
            let tol = match t {
                DType::F32 | DType::Q8_0 => 1e-5,
                _ if superblocks => 5e-2,
                _ => 5e-3,
            };
            let stack = |ne: [u64; 4]| spec(t, ne, Fill::Random(0.1));
            let head = || vec![f32s([e, 3, 1, 1]), ids(2 * 3, 4), f32s([2, 3, 1, 1])];
            let mut split = head();
            split.extend([
                stack([e, f, 4, 1]),
                stack([e, f, 4, 1]),
                stack([f, e, 4, 1]),
            ]);
            let mut fused = head();
            fused.extend([stack([e, 2 * f, 4, 1]), stack([f, e, 4, 1])]);
            // 40 rows take the routed tiled path on the CUDA bundles.
            let mut batch = vec![f32s([e, 40, 1, 1]), ids(2 * 40, 4), f32s([2, 40, 1, 1])];
            batch.extend([
                stack([e, f, 4, 1]),
                stack([e, f, 4, 1]),
                stack([f, e, 4, 1]),
            ]);
            let mut batch_fused = vec![f32s([e, 40, 1, 1]), ids(2 * 40, 4), f32s([2, 40, 1, 1])];
            batch_fused.extend([stack([e, 2 * f, 4, 1]), stack([f, e, 4, 1])]);
            // Few rows (decode with several streams) take the row kernels on the CUDA bundles.
            let few = |rows: u64, fused: bool| {
                let mut s = vec![
                    f32s([e, rows, 1, 1]),
                    ids(2 * rows, 4),
                    f32s([2, rows, 1, 1]),
                ];
                if fused {
                    s.extend([stack([e, 2 * f, 4, 1]), stack([f, e, 4, 1])]);
                } else {
                    s.extend([
                        stack([e, f, 4, 1]),
                        stack([e, f, 4, 1]),
                        stack([f, e, 4, 1]),
                    ]);
                }
                s
            };
            let params = |fused: bool, glu: GluKind| match moe(fused, glu) {
                Op::MoeExperts(p) => Op::MoeExperts(MoeParams {
                    n_ff: f as u32,
                    ..p
                }),
                other => other,
            };
            // GLM-5.3's clamped SwiGLU: the gate and up values here have spreads of about 0.3
            // (0.5 over rows of 256), so a limit of 0.2 clamps many of both.
            let clamped = |fused: bool| match params(fused, GluKind::SwiGlu) {
                Op::MoeExperts(p) => Op::MoeExperts(MoeParams { limit: 0.2, ..p }),
                other => other,
            };
            vec![
                case(
                    "swiglu limit 0.2, separate gate and up",
                    clamped(false),
                    split.clone(),
                    [e, 3, 1, 1],
                    tol,
                ),
                case(
                    "swiglu limit 0.2, fused gate_up, 15 rows",
                    clamped(true),
                    few(15, true),
                    [e, 15, 1, 1],
                    tol,
                ),
                case(
                    "swiglu limit 0.2, 40 rows",
                    clamped(false),
                    batch.clone(),
                    [e, 40, 1, 1],
                    tol,
                ),
                case(
                    "swiglu limit 0.2, fused gate_up, 40 rows",
                    clamped(true),
                    batch_fused.clone(),
                    [e, 40, 1, 1],
                    tol,
                ),
                case(
                    "swiglu, separate gate and up",
                    params(false, GluKind::SwiGlu),
                    split,
                    [e, 3, 1, 1],
                    tol,
                ),
                case(
                    "geglu, fused gate_up",
                    params(true, GluKind::GeGlu),
                    fused,
                    [e, 3, 1, 1],
                    tol.max(1e-3),
                ),
                case(
                    "swiglu, 2 rows",
                    params(false, GluKind::SwiGlu),
                    few(2, false),
                    [e, 2, 1, 1],
                    tol,
                ),
                case(
                    "swiglu, fused gate_up, 15 rows",
                    params(true, GluKind::SwiGlu),
                    few(15, true),
                    [e, 15, 1, 1],
                    tol,
                ),
                case(
                    "swiglu, 40 rows",
                    params(false, GluKind::SwiGlu),
                    batch,
                    [e, 40, 1, 1],
                    tol,
                ),
                case(
                    "swiglu, fused gate_up, 40 rows",
                    params(true, GluKind::SwiGlu),
                    batch_fused,
                    [e, 40, 1, 1],
                    tol,
                ),
            ]
        }
        _ => Vec::new(),
    }
}
