//! The fuzz target `fuzz/fuzz_targets/model_load.rs` as a bounded test for CI: the header of each
//! architecture's tiny file, mutated from a fixed seed (an integer key's value or a tensor's
//! extent overwritten with a hostile number, or random bytes changed), parsed as the host parses
//! it and handed through the ABI to the plugin that serves it. A header the reader accepts must
//! load (spec and graphs included) or be refused with a named error; a panic caught at the
//! plugin's boundary fails the test, and an abort ends it.

mod common;

use common::{plugin_dir, tiny_of};

use bloomery::synth::ClassTypes;
use bloomery_devices::Registry;
use bloomery_gguf::{Array, GgufFile, Value};
use bloomery_plugin_api::graph::{BatchShape, GraphKind};
use bloomery_plugin_api::{DType, PluginError};

/// Mutated headers per architecture.
const CASES: usize = 150;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A number near a boundary.
    fn hostile(&mut self) -> u64 {
        match self.below(4) {
            0 => self.below(3) as u64,
            1 => (1u64 << self.below(64)).wrapping_sub(self.below(2) as u64),
            2 => u64::MAX - self.below(2) as u64,
            _ => self.next(),
        }
    }
}

/// Where numbers sit in a header: (byte offset, width) of each.
type Fields = Vec<(usize, usize)>;

/// The numbers of the header: the integer keys of `arch` (array elements included), then the
/// tensors' extents.
fn number_fields(file: &GgufFile, arch: &str) -> (Fields, Fields) {
    let (mut keys, mut dims) = (Vec::new(), Vec::new());
    for e in file.metadata().entries() {
        if !e.key.starts_with(&format!("{arch}.")) {
            continue;
        }
        // Key length (8 bytes), key, value type (4 bytes), then the value; an array's value is
        // its element type (4 bytes), its length (8 bytes), then the elements.
        let value = e.offset as usize + 8 + e.key.len() + 4;
        match &e.value {
            Value::U32(_) | Value::I32(_) => keys.push((value, 4)),
            Value::U64(_) | Value::I64(_) => keys.push((value, 8)),
            Value::Array(Array::U32(a)) => {
                keys.extend((0..a.len()).map(|i| (value + 12 + 4 * i, 4)))
            }
            Value::Array(Array::I32(a)) => {
                keys.extend((0..a.len()).map(|i| (value + 12 + 4 * i, 4)))
            }
            _ => {}
        }
    }
    for t in file.tensors() {
        // Name length (8 bytes), name, dimension count (4 bytes), then one u64 per dimension.
        let at = t.info_offset as usize + 8 + t.name.len() + 4;
        dims.extend((0..t.shape.len()).map(|d| (at + 8 * d, 8)));
    }
    (keys, dims)
}

/// A named error passes; a panic the plugin's boundary caught does not.
fn named(what: &str, r: Result<(), PluginError>) -> Result<(), String> {
    match r {
        Err(e @ PluginError::Panicked { .. }) => Err(format!("{what}: {e}")),
        _ => Ok(()),
    }
}

#[test]
fn mutated_headers_load_or_are_refused_by_name_through_the_abi() {
    let reg = Registry::load(&plugin_dir()).expect("plugin folder (run `cargo xtask plugins`)");
    let dir = tempfile::tempdir().unwrap();
    let f32 = DType::F32;
    let types = ClassTypes {
        experts: f32,
        attention: f32,
        embedding: f32,
        output: f32,
        dense: f32,
    };
    let mut rng = Rng(0x5eed_f00d);
    let mut failed = Vec::new();
    for arch in ["qwen3moe", "gemma3", "qwen35moe", "qwen35"] {
        let path = tiny_of(arch, dir.path(), types);
        let file = GgufFile::open(&path).unwrap();
        let header_len = file.header().data_offset as usize;
        let header = &file.bytes()[..header_len];
        let (keys, dims) = number_fields(&file, arch);
        let plugin = reg.model_for(arch).unwrap();
        let (mut parsed, mut loaded) = (0, 0);
        for case in 0..CASES {
            let mut bytes = header.to_vec();
            // Mostly keys: a tensor grown past its data is refused by the reader already.
            for _ in 0..1 + rng.below(3) {
                let fields = match rng.below(10) {
                    0 => {
                        let at = rng.below(bytes.len());
                        bytes[at] = rng.next() as u8;
                        continue;
                    }
                    1..=2 => &dims,
                    _ => &keys,
                };
                let (at, width) = fields[rng.below(fields.len())];
                let v = rng.hostile().to_le_bytes();
                bytes[at..at + width].copy_from_slice(&v[..width]);
            }
            let Ok(h) = bloomery_gguf::parse_prefix(&bytes, 1 << 40, "mutated.gguf") else {
                continue;
            };
            parsed += 1;
            let view = bloomery_exec::view::header_view(&h.metadata, h.tensors.iter());
            let what = format!("{arch} case {case}");
            let m = match plugin.module.load()(&view).into_result() {
                Ok(m) => m,
                Err(e) => {
                    failed.extend(named(&what, Err(e)).err());
                    continue;
                }
            };
            loaded += 1;
            let _ = m.spec();
            for (n_rows, n_outputs) in [(1, 1), (3, 1)] {
                let shape = BatchShape {
                    n_rows,
                    n_outputs,
                    kind: GraphKind::Main,
                };
                let r = m.build_graph(shape).into_result().map(drop);
                failed.extend(named(&what, r).err());
            }
        }
        println!("{arch}: {CASES} mutated headers, {parsed} parsed, {loaded} loaded");
        assert!(
            parsed > CASES / 2 && loaded > 0,
            "{arch}: too few cases reached the plugin"
        );
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
