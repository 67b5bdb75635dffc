//! Kernel launches through `cuLaunchKernelEx`. On bundles whose kernels open with
//! `griddepcontrol.wait` (compute capability 9.0 and up, `KERNEL_ENTRY` in cu/kernels.cu) each
//! launch carries the programmatic-stream-serialization attribute: the driver may start a kernel
//! while its predecessor on the stream is still finishing, and the kernel waits on the device for
//! that predecessor's results instead of the host-side launch gap. Captured graphs keep these as
//! programmatic edges.

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, DriverError, LaunchConfig};

/// The arguments of one kernel launch, collected as [`cudarc`]'s launch builder does.
pub struct Args<'a> {
    func: sys::CUfunction,
    stream: &'a CudaStream,
    params: Vec<*mut c_void>,
    overlap: bool,
    _borrow: PhantomData<&'a CudaFunction>,
}

impl<'a> Args<'a> {
    /// Starts the arguments of `func` on `stream`; `overlap` allows the launch to begin before
    /// its predecessor ends (only for kernels that wait for it on the device).
    pub fn new(func: &'a CudaFunction, stream: &'a CudaStream, overlap: bool) -> Args<'a> {
        Args {
            func: func.cu_function(),
            stream,
            params: Vec::with_capacity(24),
            overlap,
            _borrow: PhantomData,
        }
    }

    /// Appends one argument, passed by value to the kernel.
    pub fn arg<T: DeviceRepr>(&mut self, v: &'a T) -> &mut Self {
        self.params.push(v as *const T as *mut c_void);
        self
    }

    /// Launches the kernel with `cfg`.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and type, and every
    /// address among them must cover what the kernel touches for this configuration.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        // SAFETY: a zeroed attribute is a valid "ignore" entry; the two fields set below are the
        // attribute id and its value.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.overlap),
        };
        // SAFETY: the caller vouches for the arguments; `params` points at values borrowed for
        // 'a, alive during the call, which copies them.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func,
                self.params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }
}
