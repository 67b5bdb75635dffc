//! Names on the Hugging Face Hub as llama.cpp b11434 checks them (`common/download.cpp`,
//! `common/hf-cache.cpp`): `-hf user/model[:quant]` split into repository and tag, and the
//! validity rules for repository ids, commits, object ids and tokens.

use anyhow::bail;

/// A repository and the quantization tag after its `:` (empty without one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoTag {
    /// `user/model`.
    pub repo: String,
    /// What follows the last `:` (`Q4_K_M`), or empty.
    pub tag: String,
}

/// Splits `user/model[:quant]` as llama-server does: the tag is the part after the last `:`, the
/// repository the part before the first, which must hold exactly one `/`.
pub fn split_repo_tag(spec: &str) -> anyhow::Result<RepoTag> {
    let parts: Vec<&str> = spec.split(':').collect();
    let tag = if parts.len() > 1 {
        parts[parts.len() - 1]
    } else {
        ""
    };
    let repo = parts[0];
    if repo.split('/').count() != 2 {
        bail!("-hf {spec}: invalid HF repo format, expected <user>/<model>[:quant]");
    }
    Ok(RepoTag {
        repo: repo.to_owned(),
        tag: tag.to_owned(),
    })
}

/// Whether `id` is a repository id the Hub can hold: letters, digits and `_`, with single `/`,
/// `.` or `-` between them, exactly one `/`, at most 256 bytes.
pub fn valid_repo_id(id: &str) -> bool {
    if id.is_empty() || id.len() > 256 {
        return false;
    }
    let (mut slashes, mut after_special) = (0, true);
    for c in id.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            after_special = false;
        } else if matches!(c, '/' | '.' | '-') {
            if after_special {
                return false;
            }
            slashes += usize::from(c == '/');
            after_special = true;
        } else {
            return false;
        }
    }
    !after_special && slashes == 1
}

/// Whether `s` is `len` hexadecimal digits.
fn hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `s` is a commit id (40 hex digits).
pub fn valid_commit(s: &str) -> bool {
    hex(s, 40)
}

/// Whether `s` is an object id: a git blob's (40 hex digits) or an LFS file's sha256 (64).
pub fn valid_oid(s: &str) -> bool {
    hex(s, 40) || hex(s, 64)
}

/// Whether `token` looks like a Hub token (`hf_` then 34 to 253 letters and digits); the Hub's
/// API calls carry only such a token.
pub fn valid_token(token: &str) -> bool {
    (37..=256).contains(&token.len())
        && token.starts_with("hf_")
        && token[3..].bytes().all(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_and_tag_split_as_llama_server_splits_them() {
        let t = split_repo_tag("ggml-org/GLM-4.7-Flash-GGUF:q4_k_m").unwrap();
        assert_eq!(
            (t.repo.as_str(), t.tag.as_str()),
            ("ggml-org/GLM-4.7-Flash-GGUF", "q4_k_m")
        );
        let t = split_repo_tag("a/b").unwrap();
        assert_eq!((t.repo.as_str(), t.tag.as_str()), ("a/b", ""));
        // The tag is after the last colon, the repository before the first.
        let t = split_repo_tag("a/b:x:Q8_0").unwrap();
        assert_eq!((t.repo.as_str(), t.tag.as_str()), ("a/b", "Q8_0"));
        for bad in ["model", "a/b/c", "a/b/c:Q8_0"] {
            let e = split_repo_tag(bad).unwrap_err().to_string();
            assert!(
                e.contains("invalid HF repo format, expected <user>/<model>[:quant]"),
                "{e}"
            );
        }
    }

    #[test]
    fn repository_ids_follow_the_hubs_rules() {
        for ok in ["a/b", "ggml-org/GLM-4.7-Flash-GGUF", "u_1/m.2-x"] {
            assert!(valid_repo_id(ok), "{ok}");
        }
        for bad in [
            "", "ab", "a/b/c", "/a", "a/", "a//b", "a/.b", "a/b.", "a/b c", "a/b:c", "..//x",
        ] {
            assert!(!valid_repo_id(bad), "{bad}");
        }
        assert!(!valid_repo_id(&format!("a/{}", "b".repeat(255))));
    }

    #[test]
    fn ids_and_tokens_are_checked_by_form() {
        assert!(valid_commit(&"a".repeat(40)) && !valid_commit(&"a".repeat(39)));
        assert!(!valid_commit(&"g".repeat(40)));
        assert!(
            valid_oid(&"0".repeat(40)) && valid_oid(&"F".repeat(64)) && !valid_oid(&"0".repeat(50))
        );
        assert!(valid_token(&format!("hf_{}", "a".repeat(34))));
        assert!(!valid_token(&format!("hf_{}", "a".repeat(33))));
        assert!(!valid_token(&format!("xx_{}", "a".repeat(34))));
        assert!(!valid_token(&format!("hf_{}-", "a".repeat(34))));
    }
}
