//! The crate's error type: every failure names what was found and what was expected.

/// Errors from building a tokenizer out of GGUF vocabulary metadata or from rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    #[error("tokenizer.ggml.model is `{found}`, but this engine handles `gpt2` (byte-level BPE) and `llama` (SentencePiece)")]
    UnknownModel {
        /// The value found in the vocabulary.
        found: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error("tokenizer.ggml.pre is `{found}`, but this engine knows only {known:?}")]
    UnknownPreTokenizer {
        /// The value found in the vocabulary.
        found: String,
        /// The names this crate accepts.
        known: Vec<&'static str>,
    },
    /// The token list is empty.
    #[error("tokenizer.ggml.tokens is empty; expected at least one token")]
    EmptyVocabulary,
    /// A per-token array has a different length than the token list.
    #[error("{key} has {found} entries, but tokenizer.ggml.tokens has {expected}")]
    LengthMismatch {
        /// The GGUF key of the array.
        key: &'static str,
        /// Its length.
        found: usize,
        /// The number of tokens.
        expected: usize,
    },
    /// A BPE vocabulary has no merges.
    #[error("tokenizer.ggml.merges is missing; a `gpt2` vocabulary needs its merges")]
    MissingMerges,
    /// A merge entry is not two tokens separated by one space.
    #[error(
        "tokenizer.ggml.merges[{index}] is `{found}`; expected two tokens separated by a space"
    )]
    BadMerge {
        /// Index of the entry.
        index: usize,
        /// The entry.
        found: String,
    },
    /// A merge refers to, or produces, a token that is not in the vocabulary.
    #[error("tokenizer.ggml.merges[{index}] (`{merge}`) uses or makes `{token}`, which is not in tokenizer.ggml.tokens")]
    MergeOutsideVocab {
        /// Index of the merge.
        index: usize,
        /// The merge entry.
        merge: String,
        /// The token that is missing.
        token: String,
    },
    /// A special-token flag asks for a token whose id is not set.
    #[error("{flag} is true, but {id_key} is not set or out of range")]
    MissingSpecialToken {
        /// The flag key, e.g. `tokenizer.ggml.add_bos_token`.
        flag: &'static str,
        /// The id key, e.g. `tokenizer.ggml.bos_token_id`.
        id_key: &'static str,
    },
    /// The `tokenizers` library refused the configuration.
    #[error("building the {what} failed: {message}")]
    Library {
        /// What was being built.
        what: &'static str,
        /// The library's message.
        message: String,
    },
    /// A chat template failed to parse.
    #[error("chat template does not parse: {0}")]
    TemplateSyntax(String),
    /// A chat template failed while rendering (including `raise_exception` calls).
    #[error("chat template failed while rendering: {0}")]
    TemplateRender(String),
    /// JSON given to the template renderer is malformed.
    #[error("{what} is not valid JSON: {message}")]
    Json {
        /// Which input was being read.
        what: &'static str,
        /// The parser's message.
        message: String,
    },
}
