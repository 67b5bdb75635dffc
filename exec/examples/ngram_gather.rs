//! Measures the time a decode pass spends on a hashed n-gram table per token, with and without
//! the prefetch, from host RAM and from disk, at Qwen3.8's real per-token reads (16 rows of 160
//! IQ4_NL values: 1,440 bytes) out of a table of `ROWS` rows (default 20M rows, 1.8 GB; the
//! real table has 320M, 28.8 GB).
//!
//! `cargo run -p bloomery-exec --example ngram_gather -- FILE [ROWS] [TOKENS] [PASS:GAP…]`
//! writes FILE (a GGUF holding only the table) when missing, then for each pair of times in ms
//! (default `5:0 5:1 5:3`) decodes `TOKENS` random tokens (default 300): each step gathers the
//! token's rows (the exposed time, as a pass does when it writes its inputs), busy-waits PASS
//! (the rest of the pass), samples the next token, with the prefetch hands its row ids to the
//! prefetch thread, and busy-waits GAP (what runs between one pass's sampling and the next
//! pass's inputs: bookkeeping, and with MTP drafting the draft passes). Prints the mean and 99th
//! percentile exposed time per token. Not a test: figures for docs/performance.md.

use std::path::Path;
use std::time::{Duration, Instant};

use bloomery_exec::ngram_open::open_tables;
use bloomery_exec::ngram_table::NgramTables;
use bloomery_gguf::{GgufModel, GgufWriter};
use bloomery_plugin_api::abi_stable::std_types::{ROption, RVec};
use bloomery_plugin_api::model::{ModelSpec, WeightClass, WeightDecl, WeightRole};
use bloomery_plugin_api::ngram::NgramSpec;
use bloomery_plugin_api::DType;

const TABLE: &str = "per_layer_token_embd.weight";
/// Values a row of Qwen3.8's PLE table.
const WIDTH: u64 = 160;
/// Heads per n-gram size.
const HEADS: u32 = 8;
/// Longest n-gram.
const NGRAM: u32 = 3;
const VOCAB: u64 = 248_320;

/// xorshift64*: the table bytes and the tokens.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Writes a GGUF of the one IQ4_NL table of `rows` rows, random nibbles under a small scale.
fn write_table(path: &Path, rows: u64) -> Result<(), Box<dyn std::error::Error>> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "ngram-bench")?;
    w.add_tensor(TABLE, DType::IQ4_NL, &[WIDTH, rows])?;
    let mut rng = Rng(7);
    w.write_file(path, |t, sink| {
        let scale = half::f16::from_f32(7e-4).to_le_bytes();
        let mut block = [0u8; 18];
        let mut left = t.size;
        let mut buf = Vec::with_capacity(1 << 20);
        while left > 0 {
            buf.clear();
            while buf.len() + 18 <= 1 << 20 && (buf.len() as u64) < left {
                block[..2].copy_from_slice(&scale);
                for c in block[2..].chunks_mut(8) {
                    c.copy_from_slice(&rng.next().to_le_bytes()[..c.len()]);
                }
                buf.extend_from_slice(&block);
            }
            std::io::Write::write_all(sink, &buf)?;
            left -= buf.len() as u64;
        }
        Ok(())
    })?;
    Ok(())
}

/// Qwen3.8's row-id layout (2- and 3-grams × 8 heads, cut at the end id) over `rows` rows:
/// 16 heads of about `rows / 16` rows each (odd sizes), offsets their running sums.
fn spec(rows: u64) -> ModelSpec {
    let n = 2 * u64::from(HEADS);
    let sizes: Vec<u64> = (0..n).map(|k| (rows / n - 2 * k - 1) | 1).collect();
    let offsets: Vec<u64> = sizes
        .iter()
        .scan(0, |o, &s| {
            let at = *o;
            *o += s;
            Some(at)
        })
        .collect();
    ModelSpec {
        weights: RVec::from(vec![WeightDecl {
            name: TABLE.into(),
            role: WeightRole::Global,
            class: WeightClass::NgramTable,
        }]),
        ngram: ROption::RSome(NgramSpec {
            ngram_size: NGRAM,
            heads_per_ngram: HEADS,
            end_id: 248_044,
            cut_at_end: true,
            tables: 1,
            token_map: RVec::new(),
            multipliers: vec![
                0x9e37_79b9_7f4a_7c15,
                0xc2b2_ae3d_27d4_eb4f,
                0x1656_67b1_9e37_79f9,
            ]
            .into(),
            head_sizes: sizes.into(),
            head_offsets: offsets.into(),
        }),
        ..ModelSpec::default()
    }
}

/// Exposed time per token (mean, 99th percentile) over `tokens` steps.
fn decode(
    t: &NgramTables,
    n: &NgramSpec,
    tokens: usize,
    (pass, gap): (Duration, Duration),
    ahead: bool,
) -> (f64, f64) {
    let mut rng = Rng(11);
    let mut seq: Vec<u32> = vec![(rng.next() % VOCAB) as u32];
    let mut out = vec![0f32; n.n_ids() * WIDTH as usize];
    let mut exposed = Vec::with_capacity(tokens);
    for _ in 0..tokens {
        let mut ids = Vec::new();
        n.extend_rows(&seq[..seq.len() - 1], &seq[seq.len() - 1..], &mut ids);
        let began = Instant::now();
        t.gather(&ids, &mut out).unwrap();
        exposed.push(began.elapsed().as_secs_f64() * 1e3);
        while began.elapsed() < pass {
            std::hint::spin_loop();
        }
        seq.push((rng.next() % VOCAB) as u32);
        if ahead {
            let mut next = Vec::new();
            n.extend_rows(&seq[..seq.len() - 1], &seq[seq.len() - 1..], &mut next);
            t.prefetch(&next);
        }
        let sampled = Instant::now();
        while sampled.elapsed() < gap {
            std::hint::spin_loop();
        }
    }
    exposed.sort_by(f64::total_cmp);
    let mean = exposed.iter().sum::<f64>() / tokens as f64;
    (mean, exposed[(tokens * 99 / 100).min(tokens - 1)])
}

/// A `PASS:GAP` pair of milliseconds.
fn times(a: &str) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
    let (p, g) = a.split_once(':').ok_or("times are PASS:GAP in ms")?;
    let ms = |v: &str| -> Result<Duration, std::num::ParseFloatError> {
        Ok(Duration::from_secs_f64(v.parse::<f64>()? / 1e3))
    };
    Ok((ms(p)?, ms(g)?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: ngram_gather FILE [ROWS] [TOKENS] [PASS:GAP…]";
    let path = Path::new(args.first().ok_or(usage)?);
    let rows: u64 = args.get(1).map_or(Ok(20_000_000), |a| a.parse())?;
    let tokens: usize = args.get(2).map_or(Ok(300), |a| a.parse())?;
    let pairs: Vec<&str> = match args.len() > 3 {
        true => args[3..].iter().map(String::as_str).collect(),
        false => vec!["5:0", "5:1", "5:3"],
    };
    let pairs = pairs
        .into_iter()
        .map(times)
        .collect::<Result<Vec<_>, _>>()?;
    if !path.exists() {
        write_table(path, rows)?;
    }
    let file = GgufModel::open(path)?;
    let spec = spec(rows);
    let n = spec.ngram.clone().into_option().ok_or("no n-gram spec")?;
    for on_disk in [false, true] {
        // From disk without a cache: the tokens are random, so a cache would rarely hit.
        let t = open_tables(&file, &spec, on_disk.then_some(0))?.ok_or("no table")?;
        for &(pass, gap) in &pairs {
            for ahead in [false, true] {
                let (mean, p99) = decode(&t, &n, tokens, (pass, gap), ahead);
                println!(
                    "{:<8} pass {:>4.1} ms gap {:>4.1} ms  prefetch {:<5}  exposed {mean:.4} ms a \
                     token (p99 {p99:.4})",
                    if on_disk { "disk" } else { "host RAM" },
                    pass.as_secs_f64() * 1e3,
                    gap.as_secs_f64() * 1e3,
                    ahead,
                );
            }
        }
    }
    Ok(())
}
