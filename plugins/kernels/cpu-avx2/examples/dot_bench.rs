//! Times the portable reference `quant::vec_dot` against the plugin's AVX2 `row_dot` for every
//! hand-written type: one thread, a 2048 × 4096 weight matrix (random payload, sane scales) times
//! one quantized activation row, best of several passes, in GB/s of weight bytes.
//!
//! Run with `cargo run --release -p bloomery-kernel-cpu-avx2 --example dot_bench [--avx2] [rows]
//! [cols] [types]` (types separated by spaces or commas). The plugin's column is `row_dot`, which
//! takes the AVX-512 kernels where the CPU has them; `--avx2` times `rows_dot_avx2` instead (the
//! AVX2 kernels only), for A/B comparisons. The last column times every row in one call of the
//! rows kernel (`rows_dot`, or `rows_dot_avx2` with `--avx2`): its own loop and prefetch.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bloomery_kernel_cpu_avx2::dot::{row_dot, rows_dot, rows_dot_avx2, HAND_WRITTEN};
use bloomery_kernels_cpu::linear::RowsDot;
use bloomery_kernels_cpu::quant::{self, bits::f32_to_f16, QuantError};
use bloomery_plugin_api::DType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Byte offsets of the f16 scales in one block of `t`.
fn f16_scale_offsets(t: DType) -> &'static [usize] {
    match t {
        DType::Q4_0
        | DType::Q5_0
        | DType::Q8_0
        | DType::IQ4_NL
        | DType::IQ4_XS
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        DType::TQ2_0 => &[64],
        _ => &[],
    }
}

/// `rows` random weight rows of `cols` elements of `t`, back to back.
fn weights(t: DType, rows: usize, cols: usize, rng: &mut StdRng) -> anyhow::Result<Vec<u8>> {
    let n = rows * cols;
    let len = t.row_bytes(n as u64).context("row size")? as usize;
    let mut w = vec![0u8; len];
    if !t.is_quantized() {
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        quant::quantize_row(t, &x, &mut w)?;
        return Ok(w);
    }
    rng.fill(&mut w[..]);
    let bytes = t.layout().context("layout")?.bytes as usize;
    for b in w.chunks_exact_mut(bytes) {
        for &o in f16_scale_offsets(t) {
            let d = rng.gen_range(1.0f32..2.0) * 2f32.powi(rng.gen_range(-10..-4));
            b[o..o + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        }
        if t == DType::MXFP4 {
            b[0] = rng.gen_range(118..=130);
        }
        if t == DType::IQ1_M {
            // The f16 block scale lives in the top nibbles of the four scale words.
            let d = f32_to_f16(rng.gen_range(1.0f32..2.0) * 2f32.powi(rng.gen_range(-10..-4)));
            for k in 0..4 {
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0f) | ((((d >> (4 * k)) & 0x0f) as u8) << 4);
            }
        }
    }
    Ok(w)
}

type Dot = fn(DType, usize, &[u8], &[u8]) -> Result<f32, QuantError>;

/// One row through `rows_dot_avx2` (`row_dot` without the AVX-512 kernels).
fn row_dot_avx2(t: DType, n: usize, w: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    let mut out = [0f32];
    rows_dot_avx2(t, n, w, w.len(), act, &mut out)?;
    Ok(out[0])
}

/// One weight matrix and its activation row.
struct Case<'a> {
    t: DType,
    cols: usize,
    row_bytes: usize,
    w: &'a [u8],
    act: &'a [u8],
}

/// The best time of one pass over all rows, over passes filling about `budget`; and the sum.
fn time(f: Dot, c: &Case, budget: Duration) -> (f64, f32) {
    let Case {
        t,
        cols,
        row_bytes,
        w,
        act,
    } = *c;
    let (mut best, mut sum, start) = (f64::INFINITY, 0f32, Instant::now());
    let mut passes = 0;
    while passes < 3 || start.elapsed() < budget {
        let t0 = Instant::now();
        sum = 0.0;
        for r in w.chunks_exact(row_bytes) {
            sum += f(black_box(t), cols, black_box(r), act).unwrap_or(f32::NAN);
        }
        best = best.min(t0.elapsed().as_secs_f64());
        passes += 1;
    }
    (best, sum)
}

/// The best time of one call of `f` over all rows at once (the rows kernel's own loop), over
/// passes filling about `budget`.
fn time_rows(f: RowsDot, c: &Case, budget: Duration) -> f64 {
    let mut out = vec![0f32; c.w.len() / c.row_bytes];
    let (mut best, start) = (f64::INFINITY, Instant::now());
    let mut passes = 0;
    while passes < 3 || start.elapsed() < budget {
        let t0 = Instant::now();
        f(c.t, c.cols, black_box(c.w), c.row_bytes, c.act, &mut out).ok();
        black_box(&out);
        best = best.min(t0.elapsed().as_secs_f64());
        passes += 1;
    }
    best
}

fn main() -> anyhow::Result<()> {
    let features = ["avx2", "fma", "f16c"];
    if !(is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c"))
    {
        bail!("this CPU lacks one of {features:?}");
    }
    let all: Vec<String> = std::env::args().skip(1).collect();
    let force_avx2 = all.iter().any(|a| a == "--avx2");
    let (plugin, rows_fn, label): (Dot, RowsDot, &str) = if force_avx2 {
        (row_dot_avx2, rows_dot_avx2, "avx2")
    } else {
        (row_dot, rows_dot, "row_dot")
    };
    let mut args = all.into_iter().filter(|a| a != "--avx2");
    let rows: usize = args.next().map_or(Ok(2048), |a| a.parse())?;
    let cols: usize = args.next().map_or(Ok(4096), |a| a.parse())?;
    let mut rng = StdRng::seed_from_u64(1);
    println!("{rows} rows x {cols} columns, one thread, best pass; GB/s of weight bytes");
    println!(
        "{:<7} {:>9} {:>10} {:>10} {:>8}  rel. diff {:>10}",
        "type", "MiB", "reference", label, "speedup", "all rows"
    );
    // Optional type names after the sizes restrict the run.
    let only: Vec<DType> = args
        .flat_map(|a| a.split(',').map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|a| DType::from_name(&a))
        .collect();
    for &t in HAND_WRITTEN
        .iter()
        .filter(|t| only.is_empty() || only.contains(t))
    {
        let w = weights(t, rows, cols, &mut rng)?;
        let at = quant::vec_dot_type(t).context("vec_dot_type")?;
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut act = vec![0u8; at.row_bytes(cols as u64).context("activation size")? as usize];
        quant::quantize_row(at, &x, &mut act)?;
        let budget = Duration::from_millis(400);
        let row_bytes = t.row_bytes(cols as u64).context("row size")? as usize;
        let case = Case {
            t,
            cols,
            row_bytes,
            w: &w,
            act: &act,
        };
        let (t_ref, s_ref) = time(quant::vec_dot, &case, budget);
        let (t_avx, s_avx) = time(plugin, &case, budget);
        let t_rows = time_rows(rows_fn, &case, budget);
        let gb = w.len() as f64 / 1e9;
        println!(
            "{:<7} {:>9.2} {:>10.2} {:>10.2} {:>7.1}x  {:.1e} {:>10.2}",
            t.to_string(),
            w.len() as f64 / (1 << 20) as f64,
            gb / t_ref,
            gb / t_avx,
            t_ref / t_avx,
            ((s_ref - s_avx) / s_ref).abs(),
            gb / t_rows
        );
    }
    Ok(())
}
