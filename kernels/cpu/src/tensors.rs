//! Views of op-call tensors as Rust slices, after their bounds were checked against the device's
//! buffer table.

use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::{DType, PluginError};
use half::f16;

use crate::memory::Buffers;

/// Checks that `t` is contiguous and of `dtype`.
pub fn expect(t: &TensorRef, dtype: DType, what: &str) -> Result<(), PluginError> {
    if t.dtype != dtype {
        return Err(PluginError::invalid(format!(
            "{what}: expected {dtype}, found {}",
            t.dtype
        )));
    }
    if !t.is_contiguous() {
        return Err(PluginError::invalid(format!(
            "{what}: strided tensors are not supported here"
        )));
    }
    Ok(())
}

fn elements(t: &TensorRef) -> Result<usize, PluginError> {
    usize::try_from(t.elements()).map_err(|_| PluginError::invalid("tensor too large"))
}

/// The bytes of a tensor whose rows are contiguous (the last row ends at the span).
pub fn bytes<'a>(buf: &Buffers, t: &TensorRef) -> Result<&'a [u8], PluginError> {
    let ptr = buf.check_tensor(t)?;
    let len = usize::try_from(t.span_bytes().unwrap_or(0))
        .map_err(|_| PluginError::invalid("tensor too large"))?;
    // SAFETY: `check_tensor` proved the span lies inside a live buffer; the host keeps buffers
    // alive for the duration of the call and no `&mut` to this tensor exists meanwhile (a node's
    // destination never overlaps a live source, by the host's memory plan).
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The bytes of a destination whose rows are contiguous (a quantized K/V cache).
pub fn bytes_mut<'a>(buf: &Buffers, t: &TensorRef) -> Result<&'a mut [u8], PluginError> {
    let ptr = buf.check_tensor(t)?;
    let len = usize::try_from(t.span_bytes().unwrap_or(0))
        .map_err(|_| PluginError::invalid("tensor too large"))?;
    // SAFETY: `check_tensor` proved the span lies inside a live buffer; the destination is the
    // call's only reference to these bytes, by the host's memory plan, as in [`f32s_mut`].
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// A contiguous f32 tensor.
pub fn f32s<'a>(buf: &Buffers, t: &TensorRef, what: &str) -> Result<&'a [f32], PluginError> {
    expect(t, DType::F32, what)?;
    let ptr = buf.check_tensor(t)?;
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(PluginError::invalid(format!(
            "{what}: misaligned f32 tensor"
        )));
    }
    // SAFETY: bounds checked above, alignment checked, aliasing as in [`bytes`].
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const f32, elements(t)?) })
}

/// A contiguous f32 destination.
pub fn f32s_mut<'a>(
    buf: &Buffers,
    t: &TensorRef,
    what: &str,
) -> Result<&'a mut [f32], PluginError> {
    expect(t, DType::F32, what)?;
    let ptr = buf.check_tensor(t)?;
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(PluginError::invalid(format!(
            "{what}: misaligned f32 tensor"
        )));
    }
    // SAFETY: bounds and alignment checked; the destination of a node is written by this call
    // only and does not overlap its sources (the host's memory plan).
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, elements(t)?) })
}

/// A contiguous i32 tensor.
pub fn i32s<'a>(buf: &Buffers, t: &TensorRef, what: &str) -> Result<&'a [i32], PluginError> {
    expect(t, DType::I32, what)?;
    let ptr = buf.check_tensor(t)?;
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<i32>()) {
        return Err(PluginError::invalid(format!(
            "{what}: misaligned i32 tensor"
        )));
    }
    // SAFETY: bounds and alignment checked; aliasing as in [`bytes`].
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const i32, elements(t)?) })
}

/// A contiguous i32 destination.
pub fn i32s_mut<'a>(
    buf: &Buffers,
    t: &TensorRef,
    what: &str,
) -> Result<&'a mut [i32], PluginError> {
    expect(t, DType::I32, what)?;
    let ptr = buf.check_tensor(t)?;
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<i32>()) {
        return Err(PluginError::invalid(format!(
            "{what}: misaligned i32 tensor"
        )));
    }
    // SAFETY: as in [`f32s_mut`].
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut i32, elements(t)?) })
}

/// A contiguous f16 tensor.
pub fn f16s<'a>(buf: &Buffers, t: &TensorRef, what: &str) -> Result<&'a [f16], PluginError> {
    expect(t, DType::F16, what)?;
    let ptr = buf.check_tensor(t)?;
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<f16>()) {
        return Err(PluginError::invalid(format!(
            "{what}: misaligned f16 tensor"
        )));
    }
    // SAFETY: bounds and alignment checked; aliasing as in [`bytes`].
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const f16, elements(t)?) })
}

/// A contiguous f16 destination.
pub fn f16s_mut<'a>(
    buf: &Buffers,
    t: &TensorRef,
    what: &str,
) -> Result<&'a mut [f16], PluginError> {
    expect(t, DType::F16, what)?;
    let ptr = buf.check_tensor(t)?;
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<f16>()) {
        return Err(PluginError::invalid(format!(
            "{what}: misaligned f16 tensor"
        )));
    }
    // SAFETY: as in [`f32s_mut`].
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut f16, elements(t)?) })
}
