//! The host's device wrapper on the CPU plugin: reading several ranges through page-locked staging.

mod common;

use bloomery_devices::Device;
use bloomery_plugin_api::kernel::{DeviceClass, DeviceConfig};

/// Ranges longer than the staging, of its exact size, empty, and starting inside a buffer come
/// back as a direct read of each gives them, through a staging buffer of 100 bytes (so the copies
/// go in turns and a range is split across them).
#[test]
fn ranges_read_through_a_small_staging_equal_direct_reads() {
    let reg = bloomery_devices::Registry::load(&common::plugin_dir())
        .expect("plugin folder (run `cargo xtask plugins` first)");
    let plugin = reg.best_kernel(DeviceClass::Cpu).unwrap();
    let dev = Device::open(
        plugin,
        DeviceConfig {
            index: 0,
            threads: 1,
            pin_threads: false,
        },
    )
    .unwrap();
    let a = dev.alloc(300).unwrap();
    let b = dev.alloc(120).unwrap();
    let fill = |n: usize, seed: u8| -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    };
    dev.write(&a, 0, &fill(300, 7)).unwrap();
    dev.write(&b, 0, &fill(120, 91)).unwrap();
    let ranges = [
        (a.handle, 5, 250),
        (b.handle, 0, 0),
        (b.handle, 20, 100),
        (a.handle, 0, 37),
        (b.handle, 119, 1),
    ];
    let staging = dev.alloc_staging(100).unwrap();
    let got = dev.read_through(&ranges, &staging).unwrap();
    assert_eq!(got.len(), ranges.len());
    for (&(handle, offset, len), part) in ranges.iter().zip(&got) {
        let mut want = vec![0u8; len];
        dev.read(handle, offset, &mut want).unwrap();
        assert_eq!(part, &want, "{len} bytes at {offset}");
    }
    // A range past its buffer is the device's named error, not a short read.
    let err = dev
        .read_through(&[(b.handle, 100, 30)], &staging)
        .unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
}
