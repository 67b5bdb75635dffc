//! Times the routed-expert FFN of one decoded row (`linear::moe_experts` with this plugin's row
//! kernel on the pinned pool) over expert stacks held in three kinds of memory: anonymous pages,
//! anonymous memory advised to use transparent huge pages, and a file mapped from tmpfs (what a
//! model in /dev/shm or the page cache gives). A plain multi-threaded sum over the same memory
//! gives each kind's read ceiling. The shape is Qwen3-30B-A3B's (2048 → 768, 128 experts, top 8,
//! Q4_K); GB/s counts the weight bytes of the chosen experts.
//!
//! A table runs the decode with the caller busy for a while between layers (what the card's
//! attention costs the host-expert path), once with the pool's default spin before workers park
//! and once with a spin longer than the gap. A last one times prompts of several row counts
//! through every layer (random top-8 routing, so each expert serves about rows·8/128 rows): the
//! cores' cost per expert that decides how many of a streamed prompt layer's experts the CPU
//! should take while the rest cross PCIe. Another reads some of each layer's experts ahead in
//! the gap (a right guess of its routing) and times the layer's experts after it.
//!
//! Run with `cargo run --release -p bloomery-kernel-cpu-avx2 --example moe_bench [layers] [steps]
//! [threads,…] [dir for the mapped file] [gap µs] [prompt rows,…]`. A leading `--avx2` uses `rows_dot_avx2` (the
//! AVX2 kernels only) instead of `rows_dot` (AVX-512 kernels where the CPU has them), for A/B
//! comparisons.

use std::hint::black_box;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bloomery_kernel_cpu_avx2::dot::{rows_dot, rows_dot_avx2};
use bloomery_kernels_cpu::linear::RowsDot;
use bloomery_kernels_cpu::linear::{moe_experts, ExpertStacks};
use bloomery_kernels_cpu::pool::{Pinning, Pool, PoolOptions};
use bloomery_kernels_cpu::quant::bits::f32_to_f16;
use bloomery_plugin_api::{DType, PluginError};
use memmap2::{Advice, MmapMut, MmapOptions};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

const N_EMBD: usize = 2048;
const N_FF: usize = 768;
const N_EXPERT: usize = 128;
const TOP_K: usize = 8;
const Q4K_BLOCK: usize = 144;

/// Bytes of one layer's gate, up and down stacks (Q4_K).
fn layer_bytes() -> (usize, usize) {
    let row = N_EMBD / 256 * Q4K_BLOCK;
    let down_row = N_FF / 256 * Q4K_BLOCK;
    (N_EXPERT * N_FF * row, N_EXPERT * N_EMBD * down_row)
}

/// Layer `l`'s gate, up and down stacks in `m` (layers back to back).
fn layer_stacks(m: &[u8], l: usize) -> ExpertStacks<'_> {
    let (gu, down) = layer_bytes();
    let at = l * (2 * gu + down);
    ExpertStacks {
        gate: &m[at..at + gu],
        gate_t: DType::Q4_K,
        up: Some((&m[at + gu..at + 2 * gu], DType::Q4_K)),
        down: &m[at + 2 * gu..at + 2 * gu + down],
        down_t: DType::Q4_K,
        n_embd: N_EMBD,
        n_ff: N_FF,
        n_expert: N_EXPERT,
    }
}

/// The routed FFN of layer `l` in `m` for rows `x` routed to `ids` with `weights` (top-8 each).
fn layer_ffn(
    pool: &Pool,
    kernel: RowsDot,
    m: &[u8],
    l: usize,
    (x, ids, weights): (&[f32], &[i32], &[f32]),
    out: &mut [f32],
) -> anyhow::Result<()> {
    let stacks = layer_stacks(m, l);
    moe_experts(
        pool, kernel, &stacks, x, ids, weights, TOP_K, None, &silu_glu, out,
    )
    .map_err(|e| anyhow::anyhow!("{e:?}"))
}

/// SwiGLU: `h = silu(g) · u`.
fn silu_glu(g: &[f32], u: &[f32], h: &mut [f32]) -> Result<(), PluginError> {
    for ((h, &g), &u) in h.iter_mut().zip(g).zip(u) {
        *h = g / (1.0 + (-g).exp()) * u;
    }
    Ok(())
}

/// Fills `m` with random Q4_K blocks whose scales are sane f16 values, in parallel.
fn fill(pool: &Pool, m: &mut [u8]) {
    let blocks = m.len() / Q4K_BLOCK;
    let per_task = 1 << 16;
    let base = m.as_mut_ptr() as usize;
    pool.parallel_for(blocks.div_ceil(per_task), |t| {
        let mut rng = StdRng::seed_from_u64(t as u64);
        let (lo, hi) = (t * per_task, ((t + 1) * per_task).min(blocks));
        // SAFETY: task t writes blocks lo..hi only, all inside `m`.
        let s = unsafe {
            std::slice::from_raw_parts_mut(
                (base + lo * Q4K_BLOCK) as *mut u8,
                (hi - lo) * Q4K_BLOCK,
            )
        };
        rng.fill(s);
        for b in s.chunks_exact_mut(Q4K_BLOCK) {
            b[0..2].copy_from_slice(&f32_to_f16(1e-3).to_le_bytes());
            b[2..4].copy_from_slice(&f32_to_f16(7e-3).to_le_bytes());
        }
    });
}

/// Sums `m` as u64 words on every thread: the memory's read rate in GB/s.
fn read_rate(pool: &Pool, m: &[u8]) -> f64 {
    let chunk = 1 << 22;
    let total = AtomicU64::new(0);
    let t0 = Instant::now();
    pool.parallel_for(m.len().div_ceil(chunk), |t| {
        let s = &m[t * chunk..((t + 1) * chunk).min(m.len())];
        let mut acc = [0u64; 8];
        for c in s.chunks_exact(64) {
            for (a, w) in acc.iter_mut().zip(c.chunks_exact(8)) {
                *a = a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
            }
        }
        total.fetch_add(acc.iter().fold(0, |x, y| x ^ y), Ordering::Relaxed);
    });
    black_box(total.load(Ordering::Relaxed));
    m.len() as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// A decoded row's inputs (seeded): its activations, its output, equal routing weights, and the
/// generator its random routings come from.
struct DecodeRow {
    rng: StdRng,
    x: Vec<f32>,
    out: Vec<f32>,
    weights: Vec<f32>,
}

impl DecodeRow {
    fn new() -> Self {
        let mut rng = StdRng::seed_from_u64(7);
        let x = (0..N_EMBD).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        DecodeRow {
            rng,
            x,
            out: vec![0f32; N_EMBD],
            weights: vec![1.0f32 / TOP_K as f32; TOP_K],
        }
    }

    /// A random top-k routing.
    fn route(&mut self) -> Vec<i32> {
        sample(&mut self.rng, N_EXPERT, TOP_K)
            .into_iter()
            .map(|e| e as i32)
            .collect()
    }

    /// The routed FFN of layer `l` in `m` for this row routed to `ids`.
    fn ffn(
        &mut self,
        pool: &Pool,
        kernel: RowsDot,
        m: &[u8],
        l: usize,
        ids: &[i32],
    ) -> anyhow::Result<()> {
        layer_ffn(
            pool,
            kernel,
            m,
            l,
            (&self.x, ids, &self.weights),
            &mut self.out,
        )?;
        black_box(&self.out);
        Ok(())
    }
}

/// GB/s of the expert weights `steps` decoded rows read through `layers` layers in `secs`.
fn decode_gbps(steps: usize, layers: usize, secs: f64) -> f64 {
    let (gu, down) = layer_bytes();
    (steps * layers * TOP_K * (2 * gu + down) / N_EXPERT) as f64 / secs / 1e9
}

/// Decodes `steps` rows through `layers` layers of experts held in `m`, the caller busy for `gap`
/// before each layer (not counted); returns GB/s of expert weights read.
fn decode_rate(
    pool: &Pool,
    m: &[u8],
    layers: usize,
    steps: usize,
    hot: bool,
    gap: Duration,
    kernel: RowsDot,
) -> anyhow::Result<f64> {
    let mut row = DecodeRow::new();
    let fixed: Vec<i32> = (0..TOP_K as i32).collect();
    let t0 = Instant::now();
    let mut busy = Duration::ZERO;
    for _ in 0..steps {
        for l in 0..layers {
            let g = Instant::now();
            while g.elapsed() < gap {
                std::hint::spin_loop();
            }
            busy += g.elapsed();
            let ids = if hot { fixed.clone() } else { row.route() };
            row.ffn(pool, kernel, m, l, &ids)?;
        }
    }
    Ok(decode_gbps(
        steps,
        layers,
        (t0.elapsed() - busy).as_secs_f64(),
    ))
}

/// How the read-ahead of [`decode_ahead`] brings an expert's bytes near the cores.
#[derive(Clone, Copy, Debug)]
enum Touch {
    /// A load of every 64-byte line (the line lands in the reading core's L1 and L2).
    Load,
    /// `prefetcht1` of every line (into the core's L2).
    PrefetchL2,
    /// A load, then `cldemote` of the line (from the core's caches towards the shared L3; a
    /// no-op hint on CPUs without it).
    Demote,
}

/// Brings `regions` (byte ranges of `m`) near the pool's cores: the bytes split evenly among
/// `pool.threads() * 2` tasks, each touching its lines in order.
fn read_ahead(pool: &Pool, m: &[u8], regions: &[(usize, usize)], touch: Touch) {
    let total: usize = regions.iter().map(|r| r.1).sum();
    let tasks = pool.threads() * 2;
    let per = total.div_ceil(tasks).next_multiple_of(64);
    let sink = AtomicU64::new(0);
    pool.parallel_for(tasks, |t| {
        let (mut lo, hi) = (t * per, ((t + 1) * per).min(total));
        let mut acc = 0u64;
        let mut base = 0;
        for &(at, len) in regions {
            while lo < hi && lo < base + len {
                let p = &m[at + lo - base..];
                match touch {
                    Touch::Load => acc = acc.wrapping_add(u64::from(p[0])),
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: a prefetch of an address inside `m` (mapped); it reads nothing
                    // the program sees.
                    Touch::PrefetchL2 => unsafe {
                        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                        _mm_prefetch::<_MM_HINT_T1>(p.as_ptr().cast());
                    },
                    #[cfg(target_arch = "x86_64")]
                    Touch::Demote => {
                        acc = acc.wrapping_add(u64::from(black_box(p[0])));
                        // SAFETY: `cldemote` of an address inside `m` (mapped) only moves the
                        // line between caches.
                        unsafe {
                            std::arch::asm!("cldemote [{0}]", in(reg) p.as_ptr(), options(nostack, preserves_flags));
                        }
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    Touch::PrefetchL2 | Touch::Demote => acc = acc.wrapping_add(u64::from(p[0])),
                }
                lo += 64;
            }
            base += len;
        }
        sink.fetch_add(acc, Ordering::Relaxed);
    });
    black_box(sink.load(Ordering::Relaxed));
}

/// The byte ranges of expert `e`'s gate, up and down rows in layer `l` of `m`.
fn expert_regions(l: usize, e: usize) -> [(usize, usize); 3] {
    let (gu, down) = layer_bytes();
    let at = l * (2 * gu + down);
    let (g, d) = (gu / N_EXPERT, down / N_EXPERT);
    [
        (at + e * g, g),
        (at + gu + e * g, g),
        (at + 2 * gu + e * d, d),
    ]
}

/// Decodes as [`decode_rate`] with a gap before each layer, during which the pool first reads
/// ahead `ahead` of the layer's routed experts (what a right guess of the layer's routing could
/// do while the card computes its attention), then the caller spins out the gap. Returns GB/s
/// of the expert time and the read-ahead's mean µs.
fn decode_ahead(
    pool: &Pool,
    m: &[u8],
    (layers, steps): (usize, usize),
    gap: Duration,
    (ahead, touch): (usize, Touch),
    kernel: RowsDot,
) -> anyhow::Result<(f64, f64)> {
    let mut row = DecodeRow::new();
    let (mut experts, mut reading) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..steps {
        for l in 0..layers {
            let ids = row.route();
            let g = Instant::now();
            if ahead > 0 {
                let regions: Vec<(usize, usize)> = ids[..ahead.min(TOP_K)]
                    .iter()
                    .flat_map(|&e| expert_regions(l, e as usize))
                    .collect();
                read_ahead(pool, m, &regions, touch);
                reading += g.elapsed();
            }
            while g.elapsed() < gap {
                std::hint::spin_loop();
            }
            let t = Instant::now();
            row.ffn(pool, kernel, m, l, &ids)?;
            experts += t.elapsed();
        }
    }
    Ok((
        decode_gbps(steps, layers, experts.as_secs_f64()),
        reading.as_secs_f64() * 1e6 / (steps * layers) as f64,
    ))
}

/// Runs a prompt of `rows` rows (random top-k routing) through `layers` layers of experts held in
/// `m`; returns µs per layer and per expert of a layer.
fn prompt_cost(
    pool: &Pool,
    m: &[u8],
    layers: usize,
    rows: usize,
    kernel: RowsDot,
) -> anyhow::Result<(f64, f64)> {
    let mut rng = StdRng::seed_from_u64(11);
    let x: Vec<f32> = (0..N_EMBD * rows)
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    let mut out = vec![0f32; N_EMBD * rows];
    let weights = vec![1.0f32 / TOP_K as f32; TOP_K * rows];
    let ids: Vec<i32> = (0..rows)
        .flat_map(|_| {
            sample(&mut rng, N_EXPERT, TOP_K)
                .into_iter()
                .map(|e| e as i32)
        })
        .collect();
    let t0 = Instant::now();
    for l in 0..layers {
        layer_ffn(pool, kernel, m, l, (&x, &ids, &weights), &mut out)?;
    }
    black_box(&out);
    let layer_us = t0.elapsed().as_secs_f64() * 1e6 / layers as f64;
    Ok((layer_us, layer_us / N_EXPERT as f64))
}

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().collect();
    let kernel: RowsDot = if args.get(1).is_some_and(|a| a == "--avx2") {
        args.remove(1);
        rows_dot_avx2
    } else {
        rows_dot
    };
    let layers: usize = args.get(1).map_or(Ok(16), |s| s.parse())?;
    let steps: usize = args.get(2).map_or(Ok(40), |s| s.parse())?;
    let threads: Vec<usize> = match args.get(3) {
        Some(s) => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![std::thread::available_parallelism().map_or(1, |n| n.get())],
    };
    let dir = args.get(4).map_or("/dev/shm", String::as_str);
    let gap = Duration::from_micros(args.get(5).map_or(Ok(100), |s| s.parse())?);
    let prompt_rows: Vec<usize> = match args.get(6) {
        Some(s) => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![64, 512],
    };
    let (gu, down) = layer_bytes();
    let len = layers * (2 * gu + down);
    println!(
        "{layers} layers of Q4_K experts ({:.2} GB), {steps} decoded rows each; GB/s",
        len as f64 / 1e9
    );
    println!("memory      threads  read  decode  hot-decode");
    let path = std::path::Path::new(dir).join(format!("moe_bench.{}", std::process::id()));
    for kind in ["anon-4k", "anon-thp", "file"] {
        let fill_pool = Pool::with_threads(threads[threads.len() - 1])?;
        let mut anon;
        let map;
        let m: &[u8] = if kind == "file" {
            {
                let mut f = std::fs::File::create(&path).context("creating the mapped file")?;
                let mut buf = MmapMut::map_anon(len)?;
                fill(&fill_pool, &mut buf);
                f.write_all(&buf)?;
            }
            let f = std::fs::File::open(&path)?;
            // SAFETY: the file is ours alone and not changed while mapped.
            map = unsafe { MmapOptions::new().populate().map(&f)? };
            &map
        } else {
            anon = MmapMut::map_anon(len)?;
            anon.advise(if kind == "anon-thp" {
                Advice::HugePage
            } else {
                Advice::NoHugePage
            })?;
            fill(&fill_pool, &mut anon);
            &anon
        };
        drop(fill_pool);
        for &t in &threads {
            let mut o = PoolOptions::new(t);
            o.pinning = Pinning::Auto;
            let pool = Pool::new(o)?;
            let read = read_rate(&pool, m).max(read_rate(&pool, m));
            decode_rate(&pool, m, layers, 2, false, Duration::ZERO, kernel)?;
            let dec = decode_rate(&pool, m, layers, steps, false, Duration::ZERO, kernel)?;
            let hot = decode_rate(&pool, m, 1, steps * layers, true, Duration::ZERO, kernel)?;
            println!("{kind:<10} {t:>8} {read:>5.1} {dec:>7.1} {hot:>11.1}");
        }
        if kind == "file" {
            println!(
                "decode with {} µs of other work before each layer (GB/s of the expert time):",
                gap.as_micros()
            );
            let t = threads[threads.len() - 1];
            for spin in [Duration::from_micros(50), 4 * gap] {
                let mut o = PoolOptions::new(t);
                o.pinning = Pinning::Auto;
                o.spin = spin;
                let pool = Pool::new(o)?;
                let dec = decode_rate(&pool, m, layers, steps, false, gap, kernel)?;
                println!(
                    "  {t} threads, workers spin {:>5} µs: {dec:.1}",
                    spin.as_micros()
                );
            }
            println!(
                "the next layer's first N experts read ahead in the gap ({t} threads): \
                 GB/s of the expert time, µs of the read"
            );
            let mut o = PoolOptions::new(t);
            o.pinning = Pinning::Auto;
            o.spin = 4 * gap;
            let pool = Pool::new(o)?;
            for round in 0..2 {
                for (ahead, touch) in [
                    (0, Touch::Load),
                    (1, Touch::Load),
                    (2, Touch::Load),
                    (3, Touch::Load),
                    (2, Touch::PrefetchL2),
                    (2, Touch::Demote),
                    (3, Touch::Demote),
                    (8, Touch::Demote),
                    (8, Touch::Load),
                ] {
                    let (dec, us) =
                        decode_ahead(&pool, m, (layers, steps), gap, (ahead, touch), kernel)?;
                    println!("  round {round}, N = {ahead} ({touch:?}): {dec:>6.1} {us:>6.1}");
                }
            }
            println!("prompts through every layer ({t} threads): µs per layer, per expert");
            let mut o = PoolOptions::new(t);
            o.pinning = Pinning::Auto;
            let pool = Pool::new(o)?;
            for &rows in &prompt_rows {
                let (layer, expert) = prompt_cost(&pool, m, layers, rows, kernel)?;
                println!(
                    "  {rows:>5} rows (≈ {:.1} an expert): {layer:>9.0} {expert:>7.1}",
                    (rows * TOP_K) as f64 / N_EXPERT as f64
                );
            }
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}
