//! Cases of DeepSeek-V4's compressed rows: Compress (the ratio-4 overlapped compressor at the
//! attention width 512 and the index width 128, a prompt of two sequences, one from position 0
//! and one continuing at 1,000 whose earlier positions come from the random raw ring; the
//! ratio-128 compressor on decode rows, one completing a row and one not) with the cache and the
//! raw ring compared after the run; DeepSeek-V4.1's forms of it, Plain (ratio 2, width 512) and
//! Store (ratios 2 and 1, width 128, the cache compared); and CompSelect (64 heads of 128 ranking 2,048 visible rows
//! for 512 at depth 8,192, and a prompt from position 0) whose lists must be equal.

use bloomery_plugin_api::op::{
    CompSelectParams, CompressForm, CompressParams, Op, OpKind, RopeMode, RopeParams,
};
use bloomery_plugin_api::DType;

use super::{case, f32s, runs, spec};
use crate::opcheck::{Case, Fill};

/// The compressed layers' rope: NORM pairs on the last 64 dims of `width`, θ 1.6e5 with YaRN
/// ×16 over an original 65,536.
fn compressed_rope(width: u32) -> RopeParams {
    RopeParams {
        mode: RopeMode::Norm,
        n_dims: 64,
        offset: width - 64,
        sections: [0; 4],
        freq_base: 160000.0,
        freq_scale: 1.0 / 16.0,
        ext_factor: 1.0,
        attn_factor: 1.0 / (1.0 + 0.1 * 16f32.ln()),
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 65536,
        inverse: false,
    }
}

/// A Compress case: `rows` rows (`split` in slot 0 from `first[0]`, the rest in slot 1 from
/// `first[1]`) into a cache of `len_comp` rows a slot.
fn compress(
    name: &str,
    ratio: u32,
    width: u32,
    [rows, split]: [u64; 2],
    first: [i32; 2],
    len_comp: u64,
) -> Case {
    let overlap = ratio == 4;
    let (w, r) = (u64::from(width), u64::from(ratio));
    let sw = if overlap { 2 * w } else { w };
    let len_raw = if overlap { 2 * r } else { r };
    let p = CompressParams {
        ratio,
        overlap,
        width,
        eps: 1e-6,
        rope: compressed_rope(width),
        form: CompressForm::Pool,
    };
    Case {
        dst_is_src: Some(5),
        also_src: Some(4),
        ..case(
            name,
            Op::Compress(p),
            vec![
                f32s([sw, rows, 1, 1]),
                f32s([sw, rows, 1, 1]),
                spec(DType::F32, [sw, r, 1, 1], Fill::Random(0.5)),
                spec(DType::F32, [w, 1, 1, 1], Fill::Range(0.5, 1.5)),
                f32s([2 * sw, len_raw, 2, 1]),
                f32s([w, len_comp, 2, 1]),
                runs(rows, split, [0, 1], 0),
                runs(rows, split, first, 1),
            ],
            [w, len_comp, 2, 1],
            1e-5,
        )
    }
}

/// A Compress case of DeepSeek-V4.1's one-series ratio-2 compressor at width 512 in its `Plain`
/// form (the normed rows before the rope, one column a row): the prompt case's two sequences.
fn plain(name: &str) -> Case {
    let (w, r, rows, split) = (512u64, 2u64, 20u64, 13u64);
    let p = CompressParams {
        ratio: 2,
        overlap: false,
        width: 512,
        eps: 1e-6,
        rope: compressed_rope(512),
        form: CompressForm::Plain,
    };
    case(
        name,
        Op::Compress(p),
        vec![
            f32s([w, rows, 1, 1]),
            f32s([w, rows, 1, 1]),
            spec(DType::F32, [w, r, 1, 1], Fill::Random(0.5)),
            spec(DType::F32, [w, 1, 1, 1], Fill::Range(0.5, 1.5)),
            f32s([2 * w, r, 2, 1]),
            runs(rows, split, [0, 1], 0),
            runs(rows, split, [0, 1000], 1),
        ],
        [w, rows, 1, 1],
        1e-5,
    )
}

/// A Compress case in its `Store` form (V4.1's index keys, width 128) at `ratio`: the prompt
/// case's two sequences into a cache of 1,024 rows a slot.
fn store(name: &str, ratio: u32) -> Case {
    let (w, rows, split, len) = (128u64, 20u64, 13u64, 1024u64);
    let p = CompressParams {
        ratio,
        overlap: false,
        width: 128,
        eps: 1e-6,
        rope: compressed_rope(128),
        form: CompressForm::Store,
    };
    Case {
        dst_is_src: Some(2),
        ..case(
            name,
            Op::Compress(p),
            vec![
                f32s([w, rows, 1, 1]),
                spec(DType::F32, [w, 1, 1, 1], Fill::Range(0.5, 1.5)),
                f32s([w, len, 2, 1]),
                runs(rows, split, [0, 1], 0),
                runs(rows, split, [0, 1000], 1),
            ],
            [w, len, 2, 1],
            1e-5,
        )
    }
}

/// A CompSelect case of 64 heads of 128 keeping `top_k` over `len` key rows a slot.
fn select(name: &str, top_k: u32, len: u64, [rows, split]: [u64; 2], first: [i32; 2]) -> Case {
    let p = CompSelectParams {
        n_head: 64,
        head_dim: 128,
        ratio: 4,
        top_k,
    };
    Case {
        dst_dtype: DType::I32,
        ..case(
            name,
            Op::CompSelect(p),
            vec![
                f32s([128, 64, rows, 1]),
                spec(DType::F32, [64, rows, 1, 1], Fill::Random(0.1)),
                f32s([128, len, 2, 1]),
                runs(rows, split, [0, 1], 0),
                runs(rows, split, first, 1),
            ],
            [u64::from(top_k), rows, 1, 1],
            0.0,
        )
    }
}

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
        (OpKind::Compress, DType::F32) => vec![
            compress(
                "ratio 4 overlapped, width 512, two sequences (from 0 and 1,000)",
                4,
                512,
                [20, 13],
                [0, 1000],
                256,
            ),
            compress(
                "ratio 4 overlapped, index width 128, two sequences",
                4,
                128,
                [20, 13],
                [0, 1000],
                256,
            ),
            compress(
                "ratio 128, width 512, decode rows (one completing a row)",
                128,
                512,
                [2, 1],
                [255, 300],
                4,
            ),
            plain("Plain form, ratio 2, width 512, two sequences (from 0 and 1,000)"),
            store("Store form, ratio 2, width 128, two sequences", 2),
            store("Store form, ratio 1, width 128, two sequences", 1),
        ],
        (OpKind::CompSelect, DType::F32) => vec![
            select(
                "top 512 of 2,048 visible, decode rows at depth 8,192 and 5,000",
                512,
                2048,
                [2, 1],
                [8191, 5000],
            ),
            select(
                "top 8, a prompt of 40 from position 0",
                8,
                16,
                [40, 40],
                [0, 0],
            ),
        ],
        _ => Vec::new(),
    }
}
