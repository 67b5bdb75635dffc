//! Byte views of typed host slices, as device buffers take them.

/// The bytes of an i32 slice in the host's byte order (device buffers hold host-order integers;
/// both supported hosts, x86-64 and aarch64, are little-endian like GGUF). No copy: inputs are
/// written every step.
pub fn i32_bytes(v: &[i32]) -> &[u8] {
    // SAFETY: i32 has no padding and every bit pattern is a valid u8 sequence; the returned slice
    // covers exactly the same memory and borrows `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The bytes of an f32 slice in the host's byte order, as [`i32_bytes`] gives an i32 slice's.
pub fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every bit pattern is a valid u8 sequence; the returned slice
    // covers exactly the same memory and borrows `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}
