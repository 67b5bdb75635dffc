//! Text side of the engine: a tokenizer built from GGUF vocabulary metadata (byte-level BPE and
//! SentencePiece, matching llama.cpp), a streaming decoder, and chat-template rendering that matches
//! Python jinja2 as Hugging Face transformers configures it.

mod bpe;
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
