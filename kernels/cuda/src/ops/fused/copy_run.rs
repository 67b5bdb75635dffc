//! A run of small contiguous copies (the tiered executor's packing of a layer's inputs and its
//! signal to the host) as one kernel (`bl_copy_words` in `cu/copy.cuh`), which writes the last
//! copy only after every other one is visible.

use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::DeviceRepr;

use crate::ops::{cfg, driver_err, Launcher};

/// Most copies one `bl_copy_words` launch takes (`COPY_RUN_MAX` in cu/copy.cuh).
const COPY_RUN_MAX: usize = 8;

/// Most 4-byte words one `bl_copy_words` launch moves (its one block's threads loop over them).
const COPY_RUN_WORDS: u64 = 16 * 1024;

/// One copy of `bl_copy_words`: source, destination, words (cu/copy.cuh's `CopyWords`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CopyWords {
    src: u64,
    dst: u64,
    n: i64,
}

/// The copies of one `bl_copy_words` launch (cu/copy.cuh's `CopyRun`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CopyRun {
    c: [CopyWords; COPY_RUN_MAX],
}

// SAFETY: plain old data laid out as the kernel's struct (eight triples of 8-byte words).
unsafe impl DeviceRepr for CopyRun {}

/// The leading run of `calls` that `bl_copy_words` takes in one launch, as (source,
/// destination) pairs: at least two copies of contiguous 4-byte values (F32 or I32, the type
/// kept), at most [`COPY_RUN_MAX`] and [`COPY_RUN_WORDS`] words in all, none of whose bytes
/// meets another's source or destination (so their order does not matter, except that the
/// kernel writes the last copy after every other one is visible, as a signal needs).
pub(super) fn copy_run(calls: &[OpCall]) -> Vec<(TensorRef, TensorRef)> {
    let mut run: Vec<(TensorRef, TensorRef)> = Vec::new();
    let mut words = 0;
    for c in calls.iter().take(COPY_RUN_MAX) {
        if c.op != Op::Copy || c.n_srcs != 1 {
            break;
        }
        let (x, d) = (c.srcs()[0], c.dst);
        let plain_words = |t: &TensorRef| {
            matches!(t.dtype, DType::F32 | DType::I32)
                && t.is_contiguous()
                && t.span_bytes().is_some()
        };
        let n = x.elements();
        let fits = x.dtype == d.dtype
            && x.ne == d.ne
            && plain_words(&x)
            && plain_words(&d)
            && n > 0
            && words + n <= COPY_RUN_WORDS;
        let apart = !x.shares_bytes(&d)
            && run.iter().all(|(a, b)| {
                [a, b]
                    .into_iter()
                    .all(|t| !t.shares_bytes(&x) && !t.shares_bytes(&d))
            });
        if !(fits && apart) {
            break;
        }
        words += n;
        run.push((x, d));
    }
    if run.len() < 2 {
        run.clear();
    }
    run
}

/// Where the calls of a pass start a run of copies that the bundles launch as one kernel
/// ([`copy_run`]: the tiered executor's packing and signal), with the copies each takes; runs are
/// found as the launcher meets them, from the first call on.
pub fn copy_runs(calls: &[OpCall]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < calls.len() {
        match copy_run(&calls[i..]).len() {
            0 => i += 1,
            n => {
                out.push((i, n));
                i += n;
            }
        }
    }
    out
}

impl Launcher {
    /// Launches the run of copies at the head of `calls` (see [`copy_run`]) as one
    /// `bl_copy_words`, returning how many it took (0: no run).
    pub(super) fn copy_words(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
    ) -> Result<usize, PluginError> {
        let pairs = copy_run(calls);
        let mut run = CopyRun::default();
        for (slot, (x, d)) in run.c.iter_mut().zip(&pairs) {
            *slot = CopyWords {
                src: addr(x)?,
                dst: addr(d)?,
                n: x.elements() as i64,
            };
        }
        if pairs.is_empty() {
            return Ok(0);
        }
        let count = pairs.len() as i32;
        let f = self.func("bl_copy_words")?;
        let mut l = self.args(&f);
        l.arg(&run).arg(&count);
        // SAFETY: each copy's source and destination hold n contiguous 4-byte words (checked
        // spans); the slots past `count` are not read.
        unsafe { l.launch(cfg(1, 512)) }.map_err(driver_err("bl_copy_words"))?;
        Ok(pairs.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::tensor_at;

    fn tensor(buffer: u64, dtype: DType, ne: [u64; 4]) -> TensorRef {
        tensor_at(buffer, 0, dtype, ne)
    }

    #[test]
    fn a_run_of_copies_stops_where_order_would_matter() {
        let at = |buffer, offset, dtype, n| TensorRef {
            offset,
            ..tensor(buffer, dtype, [n, 1, 1, 1])
        };
        let copy = |x: TensorRef, d: TensorRef| OpCall::new(Op::Copy, &[x], d);
        // The tiered executor's packing: x, ids and weights into host memory (buffer 9), then
        // the signal word copied from the word before it.
        let x = copy(at(1, 0, DType::F32, 2048), at(9, 0, DType::F32, 2048));
        let ids = copy(at(2, 0, DType::I32, 8), at(9, 8192, DType::I32, 8));
        let w = copy(at(3, 0, DType::F32, 8), at(9, 8224, DType::F32, 8));
        let signal = copy(at(9, 8256, DType::I32, 1), at(9, 8260, DType::I32, 1));
        let add = OpCall::new(
            Op::Add,
            &[at(1, 0, DType::F32, 8), at(3, 0, DType::F32, 8)],
            at(4, 0, DType::F32, 8),
        );
        let pack = [x, ids, w, signal, add];
        let run = copy_run(&pack);
        assert_eq!(run.len(), 4);
        assert_eq!(run[3], (pack[3].srcs()[0], pack[3].dst));
        // A copy reading what an earlier one writes ends the run before it (it must see the
        // earlier result); so does one writing what an earlier one reads or writes.
        let reads_packed = copy(at(9, 0, DType::F32, 4), at(5, 0, DType::F32, 4));
        assert_eq!(copy_run(&[x, ids, reads_packed, w]).len(), 2);
        let over_source = copy(at(6, 0, DType::F32, 4), at(1, 64, DType::F32, 4));
        assert_eq!(copy_run(&[x, ids, over_source]).len(), 2);
        let over_dst = copy(at(6, 0, DType::I32, 4), at(9, 8200, DType::I32, 4));
        assert!(copy_run(&[ids, over_dst]).is_empty());
        // Conversions, strided views and runs too long for one block are not taken.
        let half = copy(at(1, 0, DType::F32, 8), at(7, 0, DType::F16, 8));
        assert!(copy_run(&[half, ids]).is_empty());
        let strided = OpCall::new(
            Op::Copy,
            &[TensorRef {
                ne: [4, 2, 1, 1],
                nb: [8, 32, 64, 64],
                ..at(1, 0, DType::F32, 8)
            }],
            tensor(7, DType::F32, [4, 2, 1, 1]),
        );
        assert!(copy_run(&[strided, ids]).is_empty());
        let big = copy(
            at(1, 0, DType::F32, 16 * 1024),
            at(8, 0, DType::F32, 16 * 1024),
        );
        assert!(copy_run(&[big, ids]).is_empty());
        assert!(copy_run(&[ids]).is_empty());
    }
}
