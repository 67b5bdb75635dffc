//! Hostile files for a model plugin's tests: a preset's file view with each integer key of its
//! architecture set to values a crafted file could hold, then a fixed-seed loop of random
//! mutations of keys and tensor shapes. The loader must return a named error, or a model whose
//! spec and graphs build; it must never panic or ask for memory the file does not justify.
//! [`check_hostile`] runs them all (a plugin's tests call it on its tiny preset, in a test binary
//! whose allocator is a [`CappedAlloc`]); the fuzz target `fuzz/fuzz_targets/model_load.rs` does
//! the same from arbitrary bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::graph::{BatchShape, GraphKind};
use crate::guard::panic_text;
use crate::meta::{MetaValue, ModelFileView};
use crate::model::{ModelInstance, SynthPreset};
use crate::{DType, PluginError};

/// What [`check_hostile`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostileReport {
    /// Views tried.
    pub cases: usize,
    /// Views the loader accepted (their spec and graphs built).
    pub loaded: usize,
    /// Views refused with a named error.
    pub refused: usize,
}

/// Integers of `v`'s type that a crafted file might hold instead of `v`: 0, 1, 2^31 − 1,
/// 2^32 − 1, `u64::MAX`, −1, `i64::MIN` and `v ± 1`, those the type holds; then the key retyped
/// to u64 `u64::MAX` and to i32 −1.
pub fn hostile_integers(v: &MetaValue) -> Vec<MetaValue> {
    let Some(x) = as_i128(v) else {
        return Vec::new();
    };
    let wide = [
        0,
        1,
        (1 << 31) - 1,
        (1 << 32) - 1,
        i128::from(u64::MAX),
        -1,
        i128::from(i64::MIN),
        x - 1,
        x + 1,
    ];
    let mut out: Vec<MetaValue> = wide.iter().filter_map(|&w| same_type(v, w)).collect();
    out.extend([MetaValue::U64(u64::MAX), MetaValue::I32(-1)]);
    let mut unique: Vec<MetaValue> = Vec::new();
    for o in out {
        if &o != v && !unique.contains(&o) {
            unique.push(o);
        }
    }
    unique
}

fn as_i128(v: &MetaValue) -> Option<i128> {
    Some(match *v {
        MetaValue::U8(x) => x.into(),
        MetaValue::I8(x) => x.into(),
        MetaValue::U16(x) => x.into(),
        MetaValue::I16(x) => x.into(),
        MetaValue::U32(x) => x.into(),
        MetaValue::I32(x) => x.into(),
        MetaValue::U64(x) => x.into(),
        MetaValue::I64(x) => x.into(),
        _ => return None,
    })
}

/// `x` as a value of `like`'s integer type, when it holds it.
fn same_type(like: &MetaValue, x: i128) -> Option<MetaValue> {
    Some(match like {
        MetaValue::U8(_) => MetaValue::U8(x.try_into().ok()?),
        MetaValue::I8(_) => MetaValue::I8(x.try_into().ok()?),
        MetaValue::U16(_) => MetaValue::U16(x.try_into().ok()?),
        MetaValue::I16(_) => MetaValue::I16(x.try_into().ok()?),
        MetaValue::U32(_) => MetaValue::U32(x.try_into().ok()?),
        MetaValue::I32(_) => MetaValue::I32(x.try_into().ok()?),
        MetaValue::U64(_) => MetaValue::U64(x.try_into().ok()?),
        MetaValue::I64(_) => MetaValue::I64(x.try_into().ok()?),
        _ => return None,
    })
}

/// Every view with one key of the architecture `arch` rewritten: each integer to each of
/// [`hostile_integers`], each integer array filled with 0, 1, 2^31 − 1 or 2^32 − 1.
pub fn key_sweep(view: &ModelFileView, arch: &str) -> Vec<(String, ModelFileView)> {
    let prefix = format!("{arch}.");
    let mut out = Vec::new();
    for (i, e) in view.metadata.iter().enumerate() {
        if !e.key.as_str().starts_with(&prefix) {
            continue;
        }
        let values: Vec<MetaValue> = match &e.value {
            MetaValue::Array(a) => [0, 1, (1 << 31) - 1, (1 << 32) - 1]
                .iter()
                .filter_map(|&x| {
                    let filled: Option<Vec<MetaValue>> =
                        a.iter().map(|el| same_type(el, x)).collect();
                    Some(MetaValue::Array(filled?.into()))
                })
                .collect(),
            v => hostile_integers(v),
        };
        for v in values {
            let mut w = view.clone();
            let what = format!("{} = {v:?}", e.key);
            w.metadata[i].value = v;
            out.push((what, w));
        }
    }
    out
}

/// A small deterministic generator (xorshift64*), so that a failing case repeats from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A number near a boundary or near `near`.
    fn hostile(&mut self, near: u64) -> u64 {
        match self.below(6) {
            0 => self.below(4) as u64,
            1 => near.wrapping_add(self.below(3) as u64).wrapping_sub(1),
            2 => (1u64 << self.below(64)).wrapping_sub(self.below(2) as u64),
            3 => near.wrapping_mul(1 + self.below(4) as u64),
            4 => u64::from(u32::MAX) - self.below(2) as u64,
            _ => self.next(),
        }
    }
}

/// `view` with one to three random mutations: an integer key's value, a tensor's extent, a key
/// or a tensor removed. Returns a description of what changed.
fn mutate(view: &ModelFileView, rng: &mut Rng) -> (String, ModelFileView) {
    let mut v = view.clone();
    let mut what = Vec::new();
    for _ in 0..1 + rng.below(3) {
        match rng.below(8) {
            0..=3 if !v.metadata.is_empty() => {
                let i = rng.below(v.metadata.len());
                let Some(old) = v.metadata[i].value.as_u64() else {
                    continue;
                };
                let new = rng.hostile(old);
                let value = match rng.below(3) {
                    0 => MetaValue::U64(new),
                    1 => MetaValue::I32(new as i32),
                    _ => MetaValue::U32(new as u32),
                };
                what.push(format!("{} = {value:?}", v.metadata[i].key));
                v.metadata[i].value = value;
            }
            4..=5 if !v.tensors.is_empty() => {
                let i = rng.below(v.tensors.len());
                let axis = rng.below(4);
                let new = rng.hostile(v.tensors[i].ne[axis]);
                what.push(format!("{}.ne[{axis}] = {new}", v.tensors[i].name));
                v.tensors[i].ne[axis] = new;
            }
            6 if !v.metadata.is_empty() => {
                let i = rng.below(v.metadata.len());
                what.push(format!("{} removed", v.metadata[i].key));
                v.metadata.remove(i);
            }
            7 if !v.tensors.is_empty() => {
                let i = rng.below(v.tensors.len());
                what.push(format!("{} removed", v.tensors[i].name));
                v.tensors.remove(i);
            }
            _ => {}
        }
    }
    (what.join(", "), v)
}

/// Loads `view` with `load`; when it loads, takes its spec and builds the graphs of one row, and
/// of three rows with one output. `Ok(true)` when it loaded, `Ok(false)` when it was refused
/// with a named error, `Err` with the panic's message when anything panicked.
pub fn try_load<M: ModelInstance>(
    view: &ModelFileView,
    load: &impl Fn(&ModelFileView) -> Result<M, PluginError>,
) -> Result<bool, String> {
    let run = || -> Result<(), PluginError> {
        let m = load(view)?;
        let _ = m.spec();
        for (n_rows, n_outputs) in [(1, 1), (3, 1)] {
            let shape = BatchShape {
                n_rows,
                n_outputs,
                kind: GraphKind::Main,
            };
            m.build_graph(shape).into_result()?;
        }
        Ok(())
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(r) => Ok(r.is_ok()),
        Err(payload) => Err(panic_text(payload.as_ref())),
    }
}

/// Runs `load` over the key sweep ([`key_sweep`]) of `preset`'s view of architecture `arch`,
/// then over `random` random mutations of it drawn from `seed`. Every case must load (spec and
/// graphs included) or be refused with a named error; a panic is reported with the case that
/// caused it.
pub fn check_hostile<M: ModelInstance>(
    preset: &SynthPreset,
    arch: &str,
    load: impl Fn(&ModelFileView) -> Result<M, PluginError>,
    random: usize,
    seed: u64,
) -> Result<HostileReport, String> {
    let base = preset.file_view(DType::F32);
    let mut rng = Rng(seed | 1);
    let mut cases = key_sweep(&base, arch);
    cases.extend((0..random).map(|_| mutate(&base, &mut rng)));
    let mut report = HostileReport::default();
    let mut failed = Vec::new();
    for (what, view) in &cases {
        report.cases += 1;
        match try_load(view, &load) {
            Ok(true) => report.loaded += 1,
            Ok(false) => report.refused += 1,
            Err(panic) => failed.push(format!("{what}: panicked: {panic}")),
        }
    }
    if failed.is_empty() {
        Ok(report)
    } else {
        Err(format!(
            "{} of {} hostile views panicked:\n{}",
            failed.len(),
            report.cases,
            failed.join("\n")
        ))
    }
}

/// The global allocator of a plugin's test binary: the system's, refusing any one allocation
/// larger than its limit, so that a loader that sizes a table by a hostile count aborts its test
/// (`memory allocation of N bytes failed`) instead of paging the machine or passing unnoticed.
pub struct CappedAlloc {
    limit: usize,
}

impl CappedAlloc {
    /// An allocator refusing allocations above `limit` bytes.
    pub const fn new(limit: usize) -> Self {
        CappedAlloc { limit }
    }
}

// SAFETY: every call goes to the system allocator with the caller's arguments, except those
// refused, which return null as `GlobalAlloc` allows for an allocation that fails.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > self.limit {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller keeps `alloc`'s contract, which is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > self.limit {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from the system's, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > self.limit {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from the system allocator with `layout`; the caller keeps
        // `realloc`'s contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_integers_keep_the_type_where_it_holds_them_then_retype() {
        let got = hostile_integers(&MetaValue::U32(4));
        let want = [
            MetaValue::U32(0),
            MetaValue::U32(1),
            MetaValue::U32((1 << 31) - 1),
            MetaValue::U32(u32::MAX),
            MetaValue::U32(3),
            MetaValue::U32(5),
            MetaValue::U64(u64::MAX),
            MetaValue::I32(-1),
        ];
        assert_eq!(got, want);
        assert!(hostile_integers(&MetaValue::I64(7)).contains(&MetaValue::I64(i64::MIN)));
        assert!(hostile_integers(&MetaValue::F32(1.0)).is_empty());
    }
}
