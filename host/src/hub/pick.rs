//! Which of a repository's files `-hf` loads, as llama.cpp b11434 picks them
//! (`common/download.cpp`: `find_best_model`, `get_split_files`, `gguf_filename_is_model`):
//! with a tag, the first model file whose path holds the tag followed by `.` or `-` (any case);
//! without one, `Q4_K_M`, then `Q8_0`, then the first model file. Of a split model only the first
//! part is picked, and every part is fetched.

use regex::RegexBuilder;

/// A path's split form: `prefix-00001-of-00003.gguf` is part 1 of 3 of `prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitInfo {
    /// The path without `.gguf` and without the split suffix.
    pub prefix: String,
    /// The quant tag ending the prefix after a `-` or `.` (letters, digits and `_`, upper-cased),
    /// or empty.
    pub tag: String,
    /// Which part (1-based; 1 for a single file).
    pub index: u32,
    /// How many parts (1 for a single file).
    pub count: u32,
}

/// The split form of `path`, or None when it does not end in `.gguf`.
pub fn split_info(path: &str) -> Option<SplitInfo> {
    let prefix = path.strip_suffix(".gguf")?;
    let suffix = prefix
        .len()
        .checked_sub("-00001-of-00001".len())
        .and_then(|at| {
            let tail = &prefix[at..];
            let b = tail.as_bytes();
            let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
            (at > 0
                && b[0] == b'-'
                && digits(1..6)
                && tail[6..10].eq_ignore_ascii_case("-of-")
                && digits(10..15))
            .then(|| (at, tail[1..6].parse().ok(), tail[10..15].parse().ok()))
        });
    let (prefix, index, count) = match suffix {
        Some((at, Some(index), Some(count))) => (&prefix[..at], index, count),
        _ => (prefix, 1, 1),
    };
    Some(SplitInfo {
        prefix: prefix.to_owned(),
        tag: tag_of(prefix),
        index,
        count,
    })
}

/// The quant tag a name without `.gguf` ends in: the run of letters, digits and `_` after its
/// last `-` or `.`, upper-cased (`m-Q4_K_M` gives `Q4_K_M`), or empty.
fn tag_of(prefix: &str) -> String {
    let run = prefix
        .bytes()
        .rev()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
        .count();
    let at = prefix.len() - run;
    if run == 0 || at == 0 || !matches!(prefix.as_bytes()[at - 1], b'-' | b'.') {
        return String::new();
    }
    prefix[at..].to_ascii_uppercase()
}

/// Whether `path` names a model file: a `.gguf` whose file name is not a projector, an
/// importance matrix or a draft sidecar (`mmproj`, `imatrix`, `mtp-`, `eagle3-`, `dflash-`,
/// `dspark-`).
pub fn is_model_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.ends_with(".gguf")
        && !["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"]
            .iter()
            .any(|k| name.contains(k))
}

/// Whether `path` may be picked as a model: a model file, and a split model's first part.
fn pickable(path: &str) -> bool {
    is_model_file(path) && split_info(path).is_some_and(|s| s.count <= 1 || s.index == 1)
}

/// The index in `paths` of the model file `-hf` loads for `tag` (empty: the default tags, then
/// the first model file), or None.
pub fn best_model(paths: &[&str], tag: &str) -> Option<usize> {
    let tags: &[&str] = if tag.is_empty() {
        &["Q4_K_M", "Q8_0"]
    } else {
        &[tag]
    };
    for t in tags {
        let pattern = RegexBuilder::new(&format!("{}[.-]", regex::escape(t)))
            .case_insensitive(true)
            .build()
            .ok()?;
        if let Some(i) = paths
            .iter()
            .position(|p| pickable(p) && pattern.is_match(p))
        {
            return Some(i);
        }
    }
    if tag.is_empty() {
        return paths.iter().position(|p| pickable(p));
    }
    None
}

/// The indices in `paths` of every part of `paths[primary]`'s split model (itself alone when it
/// is a single file).
pub fn split_parts(paths: &[&str], primary: usize) -> Vec<usize> {
    match split_info(paths[primary]) {
        Some(s) if s.count > 1 => (0..paths.len())
            .filter(|&i| {
                split_info(paths[i]).is_some_and(|o| o.count == s.count && o.prefix == s.prefix)
            })
            .collect(),
        _ => vec![primary],
    }
}

/// Every part's name of the split model a URL or path names (`…-00001-of-00003.gguf` gives three),
/// or the name alone.
pub fn all_parts(name: &str) -> Vec<String> {
    match split_info(name) {
        Some(s) if s.count > 1 => (1..=s.count)
            .map(|i| format!("{}-{i:05}-of-{:05}.gguf", s.prefix, s.count))
            .collect(),
        _ => vec![name.to_owned()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_forms_are_read_from_the_name() {
        let s = split_info("d/m-Q2_K-00002-of-00003.gguf").unwrap();
        assert_eq!((s.prefix.as_str(), s.index, s.count), ("d/m-Q2_K", 2, 3));
        assert_eq!(s.tag, "Q2_K");
        assert_eq!(split_info("Qwen3-8B.q8_0.gguf").unwrap().tag, "Q8_0");
        assert_eq!(split_info("model.gguf").unwrap().tag, "");
        assert_eq!(split_info("d/x-.gguf").unwrap().tag, "");
        let s = split_info("m-Q4_K_M.gguf").unwrap();
        assert_eq!((s.prefix.as_str(), s.index, s.count), ("m-Q4_K_M", 1, 1));
        assert_eq!(split_info("README.md"), None);
        assert_eq!(split_info("-00001-of-00002.gguf").unwrap().count, 1);
        assert_eq!(
            all_parts("http://h/m-00001-of-00002.gguf"),
            [
                "http://h/m-00001-of-00002.gguf",
                "http://h/m-00002-of-00002.gguf"
            ]
        );
    }

    #[test]
    fn the_model_is_picked_as_llama_server_picks_it() {
        let paths = [
            "README.md",
            "mmproj-m-Q4_K_M.gguf",
            "m-F16.gguf",
            "m-Q8_0.gguf",
            "m-Q4_K_M.gguf",
            "sub/m-Q2_K-00002-of-00002.gguf",
            "sub/m-Q2_K-00001-of-00002.gguf",
            "mtp-m-Q8_0.gguf",
        ];
        assert_eq!(best_model(&paths, ""), Some(4));
        assert_eq!(best_model(&paths, "q8_0"), Some(3));
        assert_eq!(best_model(&paths, "F16"), Some(2));
        assert_eq!(best_model(&paths, "Q2_K"), Some(6));
        assert_eq!(split_parts(&paths, 6), [5, 6]);
        assert_eq!(split_parts(&paths, 2), [2]);
        assert_eq!(best_model(&paths, "IQ1_S"), None);
        // Without the default tags, the first model file (never a projector or a draft).
        assert_eq!(best_model(&["mmproj-x.gguf", "x-F32.gguf"], ""), Some(1));
        // The tag must be followed by `.` or `-`: Q4_K does not pick Q4_K_M.
        assert_eq!(
            best_model(&["m-Q4_K_M.gguf", "m-Q4_K.gguf"], "Q4_K"),
            Some(1)
        );
    }
}
