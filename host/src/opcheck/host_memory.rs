//! The device's calls using host memory in place: a page-locked range viewed by `map_pinned`
//! (how the card reads host experts' weights) and a buffer from `alloc_shared` (how the host
//! experts' maps and outputs pass between the devices), each checked bit for bit through `Copy`
//! calls against the values the host wrote or reads.

use std::alloc::Layout;
use std::sync::Arc;

use bloomery_plugin_api::op::Op;
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};

use super::{read_values, relative, worst, Outcome};
use bloomery_devices::{Buffer, Device};

/// Values per check: not a multiple of a block or a page.
const N: usize = 3 * 1024 + 7;

fn values(seed: u32) -> Vec<f32> {
    (0..N as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
        .collect()
}

fn f32s(b: &Buffer) -> TensorRef {
    TensorRef {
        buffer: b.handle,
        offset: 0,
        dtype: DType::F32,
        ne: [N as u64, 1, 1, 1],
        nb: [4, 4 * N as u64, 4 * N as u64, 4 * N as u64],
    }
}

/// Runs one Copy between two buffers and waits for it.
fn copy(dev: &Device, from: &Buffer, to: &Buffer) -> Result<(), PluginError> {
    dev.run(&[OpCall::new(Op::Copy, &[f32s(from)], f32s(to))])?;
    dev.sync()
}

fn outcome(what: &str, got: Result<Vec<f32>, PluginError>, want: &[f32]) -> Outcome {
    let what = format!("host memory: {what}");
    match got {
        Ok(got) => Outcome {
            what,
            rel: relative(&got, want),
            tol: 0.0,
            error: None,
            worst: worst(&got, want),
        },
        Err(e) => Outcome {
            what,
            rel: f64::NAN,
            tol: 0.0,
            error: Some(e.to_string()),
            worst: None,
        },
    }
}

/// A shared buffer read by a call after the host wrote it, and written by a call and then read
/// on the host; a page-locked range of host memory read by a call through its view.
pub fn check(dev: &Arc<Device>) -> Vec<Outcome> {
    let bytes = 4 * N as u64;
    let (first, second, third) = (values(1), values(2), values(3));
    let shared = dev.alloc_shared(bytes).and_then(|(s, at)| {
        let card = dev.alloc(bytes)?;
        Ok((s, at, card))
    });
    let mut out = Vec::new();
    match shared {
        Ok((shared, at, card)) => {
            // SAFETY: `at` addresses the N f32 of `shared` (alloc_shared), alive here; no call
            // uses it until the Copy below.
            unsafe { std::ptr::copy_nonoverlapping(first.as_ptr(), at as *mut f32, N) };
            let got = copy(dev, &shared, &card).and_then(|_| read_values(dev, &card, DType::F32));
            out.push(outcome(
                "a shared buffer read in place by a call",
                got,
                &first,
            ));
            let got = dev
                .write(&card, 0, &f32_bytes(&second))
                .and_then(|_| copy(dev, &card, &shared))
                // SAFETY: as above; the Copy into it finished at its sync.
                .map(|_| unsafe { std::slice::from_raw_parts(at as *const f32, N) }.to_vec());
            out.push(outcome(
                "a shared buffer written in place by a call",
                got,
                &second,
            ));
        }
        Err(e) => out.push(outcome("a shared buffer", Err(e), &first)),
    }
    out.push(outcome(
        "a page-locked range read in place by a call",
        pinned(dev, &third),
        &third,
    ));
    out
}

/// Copies `want` into fresh page-aligned host memory, page-locks it for `dev`, and reads it back
/// through a Copy from its `map_pinned` view. The memory is never freed: it stays page-locked
/// until the device closes (pin_host's contract), which is the end of the check's command.
fn pinned(dev: &Arc<Device>, want: &[f32]) -> Result<Vec<f32>, PluginError> {
    let bytes = 4 * N;
    let layout = Layout::from_size_align(bytes.div_ceil(4096) * 4096, 4096)
        .map_err(|_| PluginError::invalid("host memory layout"))?;
    // SAFETY: the layout has a nonzero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(PluginError::OutOfMemory {
            requested: layout.size() as u64,
            available: 0,
        });
    }
    // SAFETY: `ptr` holds `layout.size()` ≥ 4·N bytes, 4096-aligned, owned here.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), ptr.cast::<f32>(), N) };
    // SAFETY: the memory is never freed or written again (leaked on purpose, see above).
    unsafe { dev.pin_host(ptr, layout.size() as u64) }?;
    // SAFETY: as above.
    let view = unsafe { dev.map_pinned(ptr, bytes as u64) }?;
    let card = dev.alloc(bytes as u64)?;
    copy(dev, &view, &card)?;
    read_values(dev, &card, DType::F32)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
