//! A pinned worker pool for data-parallel kernels.
