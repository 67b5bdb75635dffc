//! Typed hyperparameters of a `qwen3moe` file, parsed once from its metadata.

use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::PluginError;

/// The architecture string.
pub const ARCH: &str = "qwen3moe";

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
    /// RMS norm ε.
    pub eps: f32,
    /// Routed experts.
    pub n_expert: u32,
    /// Experts per token.
    pub n_expert_used: u32,
    /// Expert FFN width.
    pub n_ff_exp: u32,
    /// Expert weight scale (0 or 1 = none).
    pub expert_weights_scale: f32,
    /// Vocabulary rows of the embedding.
    pub n_vocab: u32,
}

fn key(s: &str) -> String {
    format!("{ARCH}.{s}")
}

impl HParams {
    /// Reads the keys; a missing or mistyped key is a named error.
    pub fn from_view(view: &ModelFileView) -> Result<Self, PluginError> {
        let n_embd = view.u32(&key("embedding_length"))?;
        let n_head = view.u32(&key("attention.head_count"))?;
        if n_head == 0 {
            return Err(PluginError::BadKey {
                key: key("attention.head_count").into(),
                message: "must be positive".into(),
            });
        }
        let head_dim = view.u32_or(&key("attention.key_length"), n_embd / n_head)?;
        let n_expert_used = view.u32(&key("expert_used_count"))?;
        let n_expert = view.u32(&key("expert_count"))?;
        if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert {
            return Err(PluginError::BadKey {
                key: key("expert_used_count").into(),
                message: format!("{n_expert_used} experts used of {n_expert}").into(),
            });
        }
        let n_vocab = view
            .tensor("token_embd.weight")
            .map(|t| t.ne[1] as u32)
            .ok_or_else(|| PluginError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let hp = HParams {
            n_layer: view.u32(&key("block_count"))?,
            n_embd,
            n_ctx_train: view.u32_or(&key("context_length"), 0)?,
            n_head,
            n_head_kv: view.u32_or(&key("attention.head_count_kv"), n_head)?,
            head_dim,
            eps: view.f32(&key("attention.layer_norm_rms_epsilon"))?,
            n_expert,
            n_expert_used,
            n_ff_exp: view.u32(&key("expert_feed_forward_length"))?,
            expert_weights_scale: view.f32_or(&key("expert_weights_scale"), 0.0)?,
            n_vocab,
        };
        if hp.n_head_kv == 0 || !hp.n_head.is_multiple_of(hp.n_head_kv) {
            return Err(PluginError::BadKey {
                key: key("attention.head_count_kv").into(),
                message: format!(
                    "{} KV heads do not divide {} heads",
                    hp.n_head_kv, hp.n_head
                )
                .into(),
            });
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
            n_expert: self.n_expert,
            n_expert_used: self.n_expert_used,
            n_ff_exp: self.n_ff_exp,
            n_ff: 0,
        }
    }
}
