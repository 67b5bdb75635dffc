//! The op checks' cases, one module per op family (as the CUDA bundles' launchers,
//! `kernels/cuda/src/ops/`): each answers for the `(op, dtype)` pairs of its family and for no
//! other, so [`cases`] is the one answer there is. A new op's cases go in its family's module.

use bloomery_plugin_api::op::{Op, OpKind};
use bloomery_plugin_api::DType;

use super::{Case, Fill, Spec};

mod attention;
mod cache_store;
mod compress;
mod copy;
mod dense;
mod elementwise;
mod hyper;
mod kpool;
mod matmul;
mod moe;
mod norm;
mod recurrent;
mod rope;
mod router;

/// Each family's cases for an `(op, dtype)` pair: none for the pairs of other families.
const FAMILIES: [fn(OpKind, DType) -> Vec<Case>; 14] = [
    elementwise::cases,
    copy::cases,
    norm::cases,
    matmul::cases,
    rope::cases,
    cache_store::cases,
    attention::cases,
    router::cases,
    moe::cases,
    recurrent::cases,
    dense::cases,
    hyper::cases,
    kpool::cases,
    compress::cases,
];

/// The cases for one `(op, dtype)` pair; empty when none is written yet.
pub fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    FAMILIES
        .iter()
        .flat_map(|family| family(op, dtype))
        .collect()
}

fn spec(dtype: DType, ne: [u64; 4], fill: Fill) -> Spec {
    Spec { dtype, ne, fill }
}

fn f32s(ne: [u64; 4]) -> Spec {
    spec(DType::F32, ne, Fill::Random(1.0))
}

/// A case of `op` on `srcs` into an F32 destination of extents `dst`, within `tol`.
fn case(name: &str, op: Op, srcs: Vec<Spec>, dst: [u64; 4], tol: f64) -> Case {
    Case {
        name: name.to_owned(),
        op,
        srcs,
        dst,
        dst_is_src: None,
        view: None,
        alias: None,
        also_src: None,
        dst_dtype: DType::F32,
        cache_blocks: false,
        tol,
    }
}

/// An I32 `[n]` source of ids uniform in `[0, max)`.
fn ids(n: u64, max: i32) -> Spec {
    spec(DType::I32, [n, 1, 1, 1], Fill::Ids(max))
}

/// An I32 `[rows]` source of two runs ([`Fill::Runs`]).
fn runs(rows: u64, split: u64, first: [i32; 2], step: i32) -> Spec {
    spec(
        DType::I32,
        [rows, 1, 1, 1],
        Fill::Runs { split, first, step },
    )
}

#[cfg(test)]
mod tests {
    use bloomery_plugin_api::op::OpKind;
    use bloomery_plugin_api::DType;

    #[test]
    fn no_pair_has_cases_in_two_families() {
        for &op in OpKind::ALL {
            for &t in DType::ALL {
                let answering = super::FAMILIES
                    .iter()
                    .filter(|family| !family(op, t).is_empty())
                    .count();
                assert!(answering <= 1, "{op:?} {t}: cases in {answering} families");
            }
        }
    }
}
