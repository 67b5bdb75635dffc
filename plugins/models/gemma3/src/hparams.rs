//! Typed hyperparameters of a `gemma3` file, parsed once from its metadata.

use bloomery_plugin_api::meta::{MetaValue, ModelFileView};
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::PluginError;

/// The architecture string.
pub const ARCH: &str = "gemma3";

/// Period of the sliding/global layer pattern when the file has no
/// `attention.sliding_window_pattern` key: in each period of this many layers all but the last
/// slide (llama.cpp's default for Gemma 3: five sliding layers, then one global layer).
pub const DEFAULT_SWA_PATTERN: u32 = 6;

/// Rope base of the sliding-window layers when the file has no `rope.freq_base_swa` key.
pub const DEFAULT_FREQ_BASE_SWA: f32 = 10_000.0;

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Layers.
    pub n_layer: u32,
    /// Hidden width.
    pub n_embd: u32,
    /// Training context.
    pub n_ctx_train: u32,
    /// Query heads.
    pub n_head: u32,
    /// Key/value heads.
    pub n_head_kv: u32,
    /// Head dim (keys and values).
    pub head_dim: u32,
    /// Dense FFN width.
    pub n_ff: u32,
    /// RMS norm ε.
    pub eps: f32,
    /// Sliding window in positions (0 = every layer global).
    pub sliding_window: u32,
    /// Per layer: does it use the sliding window (and the local rope base)?
    pub is_swa: Vec<bool>,
    /// Rope base of the sliding-window layers.
    pub freq_base_swa: f32,
    /// Attention logit scale applied to the queries.
    pub attn_scale: f32,
    /// Final logit soft cap (0 = none).
    pub final_softcap: f32,
    /// Vocabulary rows of the embedding.
    pub n_vocab: u32,
}

fn key(s: &str) -> String {
    format!("{ARCH}.{s}")
}

fn bad(k: &str, message: String) -> PluginError {
    PluginError::BadKey {
        key: key(k).into(),
        message: message.into(),
    }
}

/// Which layers slide: an explicit per-layer array, or a period where the last layer of each
/// period is global.
fn swa_layers(view: &ModelFileView, n_layer: u32) -> Result<Vec<bool>, PluginError> {
    const K: &str = "attention.sliding_window_pattern";
    if let Some(MetaValue::Array(_)) = view.get(&key(K)) {
        // One flag per layer (booleans or integers; `as_u64` reads both).
        let flags = view.u32_array_or_empty(&key(K))?;
        if flags.len() != n_layer as usize {
            return Err(bad(
                K,
                format!("{} flags for {n_layer} layers", flags.len()),
            ));
        }
        return Ok(flags.iter().map(|&f| f != 0).collect());
    }
    let n = view.u32_or(&key(K), DEFAULT_SWA_PATTERN)?;
    Ok((0..n_layer).map(|il| n == 0 || il % n < n - 1).collect())
}

impl HParams {
    /// Reads the keys; a missing or mistyped key is a named error.
    pub fn from_view(view: &ModelFileView) -> Result<Self, PluginError> {
        let n_layer = view.u32(&key("block_count"))?;
        let n_embd = view.u32(&key("embedding_length"))?;
        let n_head = view.u32(&key("attention.head_count"))?;
        if n_head == 0 {
            return Err(bad("attention.head_count", "must be positive".into()));
        }
        let head_dim = view.u32_or(&key("attention.key_length"), n_embd / n_head)?;
        let v_dim = view.u32_or(&key("attention.value_length"), head_dim)?;
        if v_dim != head_dim || head_dim == 0 {
            return Err(bad(
                "attention.value_length",
                format!("value length {v_dim} must equal key length {head_dim}"),
            ));
        }
        let n_vocab = view
            .tensor("token_embd.weight")
            .map(|t| t.ne[1] as u32)
            .ok_or_else(|| PluginError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let sliding_window = view.u32_or(&key("attention.sliding_window"), 0)?;
        let is_swa = if sliding_window > 0 {
            swa_layers(view, n_layer)?
        } else {
            vec![false; n_layer as usize]
        };
        // gemma_pytorch: the 27B model scales by 1/sqrt(n_embd / n_head) (query_pre_attn_scalar);
        // the others by 1/sqrt(head_dim). llama.cpp tells the 27B by its 62 layers.
        let attn_scale = if n_layer == 62 {
            1.0 / ((n_embd / n_head) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let hp = HParams {
            n_layer,
            n_embd,
            n_ctx_train: view.u32_or(&key("context_length"), 0)?,
            n_head,
            n_head_kv: view.u32_or(&key("attention.head_count_kv"), n_head)?,
            head_dim,
            n_ff: view.u32(&key("feed_forward_length"))?,
            eps: view.f32(&key("attention.layer_norm_rms_epsilon"))?,
            sliding_window,
            is_swa,
            freq_base_swa: view.f32_or(&key("rope.freq_base_swa"), DEFAULT_FREQ_BASE_SWA)?,
            attn_scale,
            final_softcap: view.f32_or(&key("final_logit_softcapping"), 0.0)?,
            n_vocab,
        };
        if hp.n_head_kv == 0 || !hp.n_head.is_multiple_of(hp.n_head_kv) {
            return Err(bad(
                "attention.head_count_kv",
                format!(
                    "{} KV heads do not divide {} heads",
                    hp.n_head_kv, hp.n_head
                ),
            ));
        }
        Ok(hp)
    }

    /// The summary the host shows and plans with.
    pub fn summary(&self) -> Summary {
        Summary {
            n_layer: self.n_layer,
            n_embd: self.n_embd,
            n_vocab: self.n_vocab,
            n_ctx_train: self.n_ctx_train,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_exp: 0,
            n_ff: self.n_ff,
        }
    }
}
