//! Text side of the engine: a tokenizer built from GGUF vocabulary metadata (byte-level BPE and
//! SentencePiece, matching llama.cpp), a streaming decoder, and chat-template rendering that matches
//! Python jinja2 as Hugging Face transformers configures it.
//!
//! Use: fill a [`VocabSpec`] from the GGUF `tokenizer.ggml.*` keys, build a [`Tokenizer`] with
//! [`Tokenizer::from_spec`], render the prompt with [`ChatTemplate::render`] (the template text is the
//! GGUF `tokenizer.chat_template`), trim what the tokenizer adds itself with
//! [`ChatTemplate::strip_added_specials`], then `encode(prompt, true, true)`. Stream generated ids back to
//! text with [`StreamDecoder`] and stop on [`Tokenizer::is_eog`].

#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod bpe;
pub mod builtin;
mod error;
mod pretokenize;
mod pyfmt;
mod special;
mod spm;
mod stream;
mod strftime;
mod template;
mod template_value;
mod tokenizer;
mod vocab;

pub use error::TextError;
pub use pretokenize::KNOWN_PRE;
pub use stream::StreamDecoder;
pub use strftime::CivilTime;
pub use template::{ChatRequest, ChatTemplate};
pub use template_value::TemplateValue;
pub use tokenizer::Tokenizer;
pub use vocab::{SpecialTokens, TokenType, VocabSpec};
