//! A real file: the Gemma 3 270M Q4_K_M GGUF, read by our reader, must list the same tensors,
//! types, shapes and offsets as the `gguf` Python package (fixtures/gemma3_270m_tensors.json).
//! Runs only when BLOOMERY_GEMMA3 points at the file.

use bloomery_gguf::{GgufFile, GgufModel};
use serde_json::{json, Value as J};
use std::path::Path;

#[test]
fn gemma3_270m_lists_the_tensors_gguf_py_lists() {
    let Ok(path) = std::env::var("BLOOMERY_GEMMA3") else {
        println!("skipped: BLOOMERY_GEMMA3 not set");
        return;
    };
    let listing =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3_270m_tensors.json");
    let want: J = serde_json::from_str(&std::fs::read_to_string(listing).unwrap()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let h = f.header();
    assert_eq!(json!(h.metadata.len()), want["n_kv"]);
    assert_eq!(json!(h.alignment), want["alignment"]);
    assert_eq!(json!(h.data_offset), want["data_offset"]);
    let ts = want["tensors"].as_array().unwrap();
    assert_eq!(h.tensors.len(), 236);
    assert_eq!(ts.len(), 236);
    for (t, w) in h.tensors.iter().zip(ts) {
        let got = json!([t.name, t.dtype.0, t.shape, t.start, t.size]);
        assert_eq!(&got, w);
        assert_eq!(f.tensor_data(t).unwrap().len() as u64, t.size);
    }
    assert_eq!(
        h.metadata.get_str("general.architecture").unwrap(),
        "gemma3"
    );
    let tokens = h.metadata.get_array("tokenizer.ggml.tokens").unwrap();
    assert!(tokens.len() > 200_000);
    // The one-part model view agrees.
    assert_eq!(GgufModel::open(&path).unwrap().tensors().len(), 236);
    println!(
        "gemma3 270m: {} tensors, {} keys match gguf-py",
        h.tensors.len(),
        h.metadata.len()
    );
}
