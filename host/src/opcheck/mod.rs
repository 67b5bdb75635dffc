//! Op-by-op checks of a kernel plugin against a reference plugin (cpu-scalar): every `(op, dtype)`
//! pair the plugin claims is run on fresh random inputs on both devices, the destination poisoned
//! before each run, and the results compared by ‖out − ref‖ / ‖ref‖ against a tolerance per case.
//! The cases are tables per op family (`cases/`, one module per family, as the CUDA bundles'
//! launchers); this module fills, runs, compares and reports them. A claimed pair with no case is
//! itself a failure, so a new kernel cannot skip its check. [`check_host_memory`] checks the
//! device's calls using host memory in place; [`check_model`] runs model files end to end.

mod blocks;
mod cache_blocks;
mod cases;
mod host_memory;
mod model;

use std::sync::Arc;

use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef, MAX_SRCS};
use bloomery_plugin_api::{DType, PluginError};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use bloomery_devices::{Buffer, Device};

/// How a source tensor is filled.
#[derive(Clone, Copy, Debug)]
pub enum Fill {
    /// Uniform in `[-scale, scale]` (quantized types: valid random blocks).
    Random(f32),
    /// I32 ids uniform in `[0, n)`.
    Ids(i32),
    /// Distinct I32 ids from `[0, n)` (a random permutation's prefix).
    Distinct(i32),
    /// F32 multiples of 1/127 in `[-1, 1]` with ±1 in every 32-block: quantization to 8 bits is
    /// exact, so a product's check isolates the dot from activation rounding.
    Steps,
    /// F32 uniform in `[lo, hi)` (log decays, write strengths).
    Range(f32, f32),
    /// I32 `(start, end)` pairs of non-empty spans inside `[0, n)` (span means).
    Spans(i32),
    /// I32 in two runs, as a batch of two sequences: element `r` is `first[0] + step·r` before
    /// `split`, then `first[1] + step·(r − split)` (slots with step 0, positions with step 1).
    Runs {
        /// Elements in the first run.
        split: u64,
        /// Each run's first value.
        first: [i32; 2],
        /// Increment along a run.
        step: i32,
    },
}

/// One tensor of a case.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub ne: [u64; 4],
    /// Contents.
    pub fill: Fill,
}

/// A source the op sees through a view of its filled buffer (a strided source).
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// Which source.
    pub src: usize,
    /// Extents.
    pub ne: [u64; 4],
    /// Byte strides.
    pub nb: [u64; 4],
    /// Byte offset of element 0.
    pub offset: u64,
}

/// One check: an op on given sources.
#[derive(Clone, Debug)]
pub struct Case {
    /// What it shows.
    pub name: String,
    /// The op.
    pub op: Op,
    /// Sources.
    pub srcs: Vec<Spec>,
    /// Destination shape (F32), unless `dst_is_src` names a source the op writes in place.
    pub dst: [u64; 4],
    /// The op writes source `i` (a cache): that source is the destination.
    pub dst_is_src: Option<usize>,
    /// A source seen through a strided view.
    pub view: Option<View>,
    /// `Some((i, j))`: source `j` is source `i` again, one tensor passed twice (latent
    /// attention's V source is its K cache); `i < j`, and `j`'s spec is not filled.
    pub alias: Option<(usize, usize)>,
    /// The op also updates source `i` in place (a recurrent state): it is compared after the run
    /// as a second outcome.
    pub also_src: Option<usize>,
    /// Destination type when not a source (F32, or I32 for ids).
    pub dst_dtype: DType,
    /// The destination is a quantized cache, compared block by block ([`cache_blocks`]): `tol`
    /// bounds the share of blocks outside the rounding llama.cpp's CPU and CUDA stores differ
    /// by.
    pub cache_blocks: bool,
    /// Largest accepted relative error.
    pub tol: f64,
}

pub use cases::cases;

/// Random bytes for a tensor.
fn fill_bytes(s: &Spec, rng: &mut StdRng) -> Result<Vec<u8>, PluginError> {
    let n = s.ne.iter().product::<u64>() as usize;
    let bytes = s
        .dtype
        .row_bytes(s.ne[0])
        .ok_or_else(|| PluginError::invalid(format!("{} rows of {}", s.dtype, s.ne[0])))?
        as usize
        * (n / s.ne[0] as usize);
    let mut out = vec![0u8; bytes];
    match (s.dtype, s.fill) {
        (DType::I32, Fill::Distinct(max)) => {
            let mut all: Vec<i32> = (0..max).collect();
            for (i, c) in out.chunks_exact_mut(4).enumerate() {
                let j = rng.gen_range(i..all.len());
                all.swap(i, j);
                c.copy_from_slice(&all[i].to_le_bytes());
            }
        }
        (DType::I32, Fill::Spans(rows)) => {
            for pair in out.chunks_exact_mut(8) {
                let start = rng.gen_range(0..rows.max(1));
                let end = rng.gen_range(start + 1..=rows.max(start + 1));
                pair[..4].copy_from_slice(&start.to_le_bytes());
                pair[4..].copy_from_slice(&end.to_le_bytes());
            }
        }
        (DType::I32, Fill::Ids(max)) => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.gen_range(0..max).to_le_bytes());
            }
        }
        (DType::F32, Fill::Random(a)) => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.gen_range(-a..a).to_le_bytes());
            }
        }
        (DType::F32, Fill::Range(lo, hi)) => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.gen_range(lo..hi).to_le_bytes());
            }
        }
        (DType::I32, Fill::Runs { split, first, step }) => {
            for (r, c) in out.chunks_exact_mut(4).enumerate() {
                let r = r as i32;
                let split = split as i32;
                let v = if r < split {
                    first[0] + step * r
                } else {
                    first[1] + step * (r - split)
                };
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        (DType::F32, Fill::Steps) => {
            for (i, c) in out.chunks_exact_mut(4).enumerate() {
                let v = if i % 32 == 0 {
                    1.0
                } else {
                    rng.gen_range(-127i32..=127) as f32 / 127.0
                };
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        (DType::Q4_K, Fill::Random(a)) => {
            // d·scale·q − dmin·min with 6-bit scales and 4-bit q: d ≈ a/(63·15) keeps |w| ≲ a.
            for b in out.chunks_exact_mut(144) {
                rng.fill(&mut b[4..]);
                let d = f16::from_f32(a / (63.0 * 15.0) * rng.gen_range(0.5..1.0));
                let dmin = f16::from_f32(a / 63.0 * rng.gen_range(0.0..0.5));
                b[..2].copy_from_slice(&d.to_le_bytes());
                b[2..4].copy_from_slice(&dmin.to_le_bytes());
            }
        }
        (DType::F16, Fill::Random(a)) => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(rng.gen_range(-a..a)).to_le_bytes());
            }
        }
        (DType::Q8_0, Fill::Random(a)) => {
            for b in out.chunks_exact_mut(34) {
                rng.fill(&mut b[2..]);
                // Quantizers never write -128 (ggml's SIMD dot products rely on that).
                b[2..]
                    .iter_mut()
                    .filter(|q| **q == 0x80)
                    .for_each(|q| *q = 0x81);
                let d = f16::from_f32(a / 127.0 * rng.gen_range(0.5..1.0));
                b[..2].copy_from_slice(&d.to_le_bytes());
            }
        }
        (t, Fill::Random(a)) if blocks::covers(t) => blocks::fill(t, a, rng, &mut out),
        (t, f) => {
            return Err(PluginError::unsupported(
                format!("opcheck cannot fill {t} with {f:?} yet"),
                &[],
            ))
        }
    }
    Ok(out)
}

/// Random bytes for each source of `case`; none for a source that is another one again.
fn fill_sources(case: &Case, rng: &mut StdRng) -> Result<Vec<Vec<u8>>, PluginError> {
    case.srcs
        .iter()
        .enumerate()
        .map(|(i, s)| match case.alias {
            Some((_, again)) if again == i => Ok(Vec::new()),
            _ => fill_bytes(s, rng),
        })
        .collect()
}

/// A case's tensors on one device.
struct Placed {
    bufs: Vec<Buffer>,
    call: OpCall,
}

impl Placed {
    /// The buffer holding tensor `t`.
    fn buffer(&self, t: TensorRef) -> Result<&Buffer, PluginError> {
        self.bufs
            .iter()
            .find(|b| b.handle == t.buffer)
            .ok_or_else(|| PluginError::invalid("a case's tensor in no buffer of the case"))
    }
}

fn place(dev: &Arc<Device>, case: &Case, data: &[Vec<u8>]) -> Result<Placed, PluginError> {
    let mut bufs = Vec::new();
    let mut srcs = [TensorRef::default(); MAX_SRCS];
    for (i, (s, bytes)) in case.srcs.iter().zip(data).enumerate() {
        if let Some((first, again)) = case.alias.filter(|a| a.1 == i) {
            if first >= again {
                return Err(PluginError::invalid(format!(
                    "source {again} is source {first} again: an earlier source, please"
                )));
            }
            srcs[i] = srcs[first];
            continue;
        }
        let b = dev.alloc(bytes.len() as u64)?;
        dev.write(&b, 0, bytes)?;
        let nb = TensorRef::contiguous_strides(s.dtype, s.ne)
            .ok_or_else(|| PluginError::invalid("no layout"))?;
        srcs[i] = TensorRef {
            buffer: b.handle,
            offset: 0,
            dtype: s.dtype,
            ne: s.ne,
            nb,
        };
        if let Some(v) = case.view.filter(|v| v.src == i) {
            (srcs[i].ne, srcs[i].nb, srcs[i].offset) = (v.ne, v.nb, v.offset);
        }
        bufs.push(b);
    }
    let dst = match case.dst_is_src {
        Some(i) => srcs[i],
        None => {
            let dst_bytes = case
                .dst_dtype
                .row_bytes(case.dst[0])
                .ok_or_else(|| PluginError::invalid("no layout"))?
                * case.dst[1..].iter().product::<u64>();
            let d = dev.alloc(dst_bytes)?;
            // Poison: all-ones bytes are NaN in f32, so an unwritten element cannot pass.
            dev.write(&d, 0, &vec![0xFF; dst_bytes as usize])?;
            let nb = TensorRef::contiguous_strides(case.dst_dtype, case.dst)
                .ok_or_else(|| PluginError::invalid("no layout"))?;
            let t = TensorRef {
                buffer: d.handle,
                offset: 0,
                dtype: case.dst_dtype,
                ne: case.dst,
                nb,
            };
            bufs.push(d);
            t
        }
    };
    Ok(Placed {
        bufs,
        call: OpCall {
            op: case.op,
            n_srcs: case.srcs.len() as u32,
            srcs,
            dst,
        },
    })
}

/// Runs a case: the destination's values, then those of the source it also updates, if any.
fn run_on(dev: &Arc<Device>, case: &Case, data: &[Vec<u8>]) -> Result<Vec<Vec<f32>>, PluginError> {
    let p = place(dev, case, data)?;
    dev.run(std::slice::from_ref(&p.call))?;
    dev.sync()?;
    let mut results = vec![read_values(dev, p.buffer(p.call.dst)?, p.call.dst.dtype)?];
    if let Some(i) = case.also_src {
        let t = p.call.srcs[i];
        results.push(read_values(dev, p.buffer(t)?, t.dtype)?);
    }
    Ok(results)
}

/// Runs a case whose destination is a quantized cache: its bytes.
fn run_bytes(dev: &Arc<Device>, case: &Case, data: &[Vec<u8>]) -> Result<Vec<u8>, PluginError> {
    let p = place(dev, case, data)?;
    dev.run(std::slice::from_ref(&p.call))?;
    dev.sync()?;
    if case.dst_is_src.is_none() {
        return Err(PluginError::invalid("a cache case names no cache source"));
    }
    let d = p.buffer(p.call.dst)?;
    let mut out = vec![0u8; d.bytes as usize];
    dev.read(d.handle, 0, &mut out)?;
    Ok(out)
}

/// The outcome of a cache case: the share of blocks outside [`cache_blocks`]' allowance, and the
/// first element of the first such block as dequantized values.
fn cache_outcome(what: String, case: &Case, dtype: DType, out: &[u8], reference: &[u8]) -> Outcome {
    let diff = cache_blocks::compare(dtype, out, reference);
    let value = |bytes: &[u8], i: usize| {
        let mut v = vec![0f32; 32];
        let per = dtype.layout().map_or(0, |l| l.bytes as usize);
        let block = bytes.get(i / 32 * per..(i / 32 + 1) * per).unwrap_or(&[]);
        match bloomery_kernels_cpu::quant::dequantize_row(dtype, block, &mut v) {
            Ok(()) => v[i % 32],
            Err(_) => f32::NAN,
        }
    };
    match diff {
        Ok(d) => Outcome {
            what,
            rel: d.bad as f64 / d.blocks.max(1) as f64,
            tol: case.tol,
            error: None,
            worst: d.first_bad.map(|i| (i, value(out, i), value(reference, i))),
        },
        Err(e) => Outcome {
            what,
            rel: f64::NAN,
            tol: case.tol,
            error: Some(e),
            worst: None,
        },
    }
}

fn read_values(dev: &Arc<Device>, d: &Buffer, dtype: DType) -> Result<Vec<f32>, PluginError> {
    let mut out = vec![0u8; d.bytes as usize];
    dev.read(d.handle, 0, &mut out)?;
    Ok(match dtype {
        DType::F16 => out
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::I32 => out
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect(),
        // Quantized results (caches) compare as their values.
        t if t.is_quantized() => {
            let n = t
                .layout()
                .map_or(0, |l| out.len() / l.bytes as usize * l.block as usize);
            let mut v = vec![0f32; n];
            bloomery_kernels_cpu::quant::dequantize_row(t, &out, &mut v)
                .map_err(|e| PluginError::invalid(format!("reading a {t} result: {e}")))?;
            v
        }
        _ => out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    })
}

/// The outcome of one case.
#[derive(Debug)]
pub struct Outcome {
    /// `(op, dtype)` and case name.
    pub what: String,
    /// ‖out − ref‖ / ‖ref‖ (infinite when an element is not finite where the reference is).
    pub rel: f64,
    /// The case's tolerance.
    pub tol: f64,
    /// An error instead of a result.
    pub error: Option<String>,
    /// The element furthest from the reference: (index, value, reference).
    pub worst: Option<(usize, f32, f32)>,
}

impl Outcome {
    /// Whether the case passed.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.rel <= self.tol
    }
}

fn worst(out: &[f32], reference: &[f32]) -> Option<(usize, f32, f32)> {
    out.iter()
        .zip(reference)
        .enumerate()
        .map(|(i, (&o, &r))| {
            (
                i,
                o,
                r,
                if o.is_finite() {
                    (o - r).abs()
                } else {
                    f32::INFINITY
                },
            )
        })
        .max_by(|a, b| a.3.total_cmp(&b.3))
        .map(|(i, o, r, _)| (i, o, r))
}

fn relative(out: &[f32], reference: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&o, &r) in out.iter().zip(reference) {
        if r.is_finite() && !o.is_finite() {
            return f64::INFINITY;
        }
        num += (f64::from(o) - f64::from(r)).powi(2);
        den += f64::from(r).powi(2);
    }
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

pub use host_memory::check as check_host_memory;

/// Runs every case of every pair `dev` claims, against `reference`.
pub fn check(dev: &Arc<Device>, reference: &Arc<Device>, seed: u64) -> Vec<Outcome> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut outcomes = Vec::new();
    for support in &dev.capabilities {
        for &dtype in support.dtypes.iter() {
            let what = format!("{} {dtype}", support.op);
            let cases = cases(support.op, dtype);
            if cases.is_empty() {
                outcomes.push(Outcome {
                    what,
                    rel: f64::NAN,
                    tol: 0.0,
                    error: Some("no check written for this pair".into()),
                    worst: None,
                });
                continue;
            }
            for case in cases {
                let what = format!("{what}: {}", case.name);
                if case.cache_blocks {
                    let result = fill_sources(&case, &mut rng).and_then(|data| {
                        Ok((
                            run_bytes(dev, &case, &data)?,
                            run_bytes(reference, &case, &data)?,
                        ))
                    });
                    outcomes.push(match result {
                        Ok((out, reference)) => cache_outcome(what, &case, dtype, &out, &reference),
                        Err(e) => Outcome {
                            what,
                            rel: f64::NAN,
                            tol: case.tol,
                            error: Some(e.to_string()),
                            worst: None,
                        },
                    });
                    continue;
                }
                let result = fill_sources(&case, &mut rng).and_then(|data| {
                    Ok((run_on(dev, &case, &data)?, run_on(reference, &case, &data)?))
                });
                match result {
                    Ok((outs, refs)) => {
                        for (i, (out, reference)) in outs.iter().zip(&refs).enumerate() {
                            outcomes.push(Outcome {
                                what: match i {
                                    0 => what.clone(),
                                    _ => format!("{what}, state after the run"),
                                },
                                rel: relative(out, reference),
                                tol: case.tol,
                                error: None,
                                worst: worst(out, reference),
                            });
                        }
                    }
                    Err(e) => outcomes.push(Outcome {
                        what,
                        rel: f64::NAN,
                        tol: case.tol,
                        error: Some(e.to_string()),
                        worst: None,
                    }),
                }
            }
        }
    }
    outcomes
}

pub use model::check_model;

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::op::OpKind;

    #[test]
    fn relative_error_catches_unwritten_and_wrong_values() {
        assert_eq!(relative(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(relative(&[f32::NAN, 2.0], &[1.0, 2.0]).is_infinite());
        assert!((relative(&[1.1, 2.0], &[1.0, 2.0]) - 0.1 / 5f64.sqrt()).abs() < 1e-7);
    }

    #[test]
    fn a_latent_attention_case_passes_its_k_cache_again() {
        let mut latent = 0;
        for &op in OpKind::ALL {
            for &t in DType::ALL {
                for c in cases(op, t) {
                    if let Some((first, again)) = c.alias {
                        assert!(first < again && again < c.srcs.len(), "{}", c.name);
                        let (a, b) = (c.srcs[first], c.srcs[again]);
                        assert_eq!((a.dtype, a.ne), (b.dtype, b.ne), "{}", c.name);
                    }
                    if let Op::Attention(p) = c.op {
                        if p.v_from_k {
                            assert_eq!(c.alias, Some((1, 2)), "{}", c.name);
                            latent += 1;
                        }
                    }
                }
            }
        }
        // Each of the f32 and f16 caches' latent cases.
        assert!(latent >= 2 * 6, "{latent} latent cases");
    }

    #[test]
    fn every_case_fills_its_sources() {
        let mut rng = StdRng::seed_from_u64(1);
        for (op, t) in [
            (OpKind::Add, DType::F32),
            (OpKind::RmsNorm, DType::F32),
            (OpKind::GetRows, DType::Q8_0),
            (OpKind::GetRows, DType::F16),
            (OpKind::MatMul, DType::Q8_0),
            (OpKind::GetRows, DType::Q6_K),
            (OpKind::MatMul, DType::Q5_K),
            (OpKind::MatMul, DType::Q5_0),
            (OpKind::MatMul, DType::Q4_0),
            (OpKind::MatMul, DType::Q5_1),
            (OpKind::MatMul, DType::IQ4_XS),
            (OpKind::MatMul, DType::IQ4_NL),
            (OpKind::MatMul, DType::MXFP4),
            (OpKind::MatMul, DType::IQ3_XXS),
            (OpKind::MoeExperts, DType::IQ3_XXS),
            (OpKind::MoeExperts, DType::Q3_K),
            (OpKind::MoeExperts, DType::Q6_K),
            (OpKind::MoeExperts, DType::Q5_0),
            (OpKind::ConvCausal, DType::F32),
            (OpKind::DeltaRule, DType::F32),
            (OpKind::Copy, DType::F16),
            (OpKind::L2Norm, DType::F32),
            (OpKind::CacheStore, DType::Q4_1),
            (OpKind::CacheStore, DType::IQ4_NL),
            (OpKind::Attention, DType::Q8_0),
            (OpKind::Attention, DType::Q5_1),
            (OpKind::Attention, DType::F16),
            (OpKind::LayerNorm, DType::F32),
            (OpKind::Softmax, DType::F32),
            (OpKind::Concat, DType::F32),
            (OpKind::SpanMean, DType::F32),
            (OpKind::AttentionDense, DType::F32),
            (OpKind::Sinkhorn, DType::F32),
            (OpKind::StreamMix, DType::F32),
            (OpKind::StreamUpdate, DType::F32),
            (OpKind::GroupDotGate, DType::F32),
            (OpKind::EngramGate, DType::F32),
            (OpKind::KPoolSelect, DType::F32),
            (OpKind::KPoolSelect, DType::F16),
        ] {
            let cs = cases(op, t);
            assert!(!cs.is_empty(), "{op:?} {t}");
            for c in cs {
                for s in &c.srcs {
                    // Each row is filled by the same code, so a source's first few rows cover
                    // its fill (every row of the big caches took a minute in a debug build).
                    let few = Spec {
                        ne: [s.ne[0], s.ne[1].min(4), 1, 1],
                        ..*s
                    };
                    let b = fill_bytes(&few, &mut rng).unwrap();
                    assert_eq!(
                        b.len() as u64,
                        s.dtype.row_bytes(s.ne[0]).unwrap() * few.ne[1]
                    );
                }
            }
        }
    }
}
