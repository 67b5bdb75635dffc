//! Typed hyperparameters of a `qwen35moe` or `qwen35` file, parsed once from its metadata.

use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::PluginError;

/// The mixture-of-experts architecture string (Qwen3.5/3.6-MoE).
pub const ARCH_MOE: &str = "qwen35moe";
/// The dense architecture string (Qwen3.5 dense, Clef's backbone).
pub const ARCH_DENSE: &str = "qwen35";

/// The feed-forward half of the family.
#[derive(Clone, Debug, PartialEq)]
pub enum Ffn {
    /// Routed experts (softmax router, top-k, renormalised) plus a sigmoid-gated shared expert.
    Moe {
        /// Routed experts.
        n_expert: u32,
        /// Experts per token.
        n_expert_used: u32,
        /// Routed expert FFN width.
        n_ff_exp: u32,
        /// Shared expert FFN width.
        n_ff_shexp: u32,
        /// Expert weight scale (1 = none).
        weights_scale: f32,
    },
    /// One SwiGLU FFN per layer.
    Dense {
        /// FFN width.
        n_ff: u32,
    },
}

/// The Gated DeltaNet (linear attention) layers' sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gdn {
    /// Convolution taps.
    pub taps: u32,
    /// Key heads.
    pub n_head_k: u32,
    /// Value heads (a multiple of the key heads).
    pub n_head_v: u32,
    /// Key dim per head.
    pub dk: u32,
    /// Value dim per head.
    pub dv: u32,
}

impl Gdn {
    /// Channels of the convolution: queries, keys and values side by side.
    pub fn conv_channels(&self) -> u32 {
        2 * self.n_head_k * self.dk + self.n_head_v * self.dv
    }

    /// Width of the value (and output gate) projection.
    pub fn value_width(&self) -> u32 {
        self.n_head_v * self.dv
    }
}

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// `general.architecture`.
    pub arch: &'static str,
    /// Layers run by the main graph (without MTP layers).
    pub n_layer: u32,
    /// MTP layers stored after them (not run).
    pub n_mtp: u32,
    /// Hidden width.
    pub n_embd: u32,
    /// Training context.
    pub n_ctx_train: u32,
    /// Query heads of the attention layers.
    pub n_head: u32,
    /// Key/value heads of the attention layers.
    pub n_head_kv: u32,
    /// Head dim of the attention layers.
    pub head_dim: u32,
    /// RMS norm ε.
    pub eps: f32,
    /// Whether each layer is a Gated DeltaNet layer (else gated attention).
    pub recurrent: Vec<bool>,
    /// The Gated DeltaNet sizes.
    pub gdn: Gdn,
    /// The FFN.
    pub ffn: Ffn,
    /// Vocabulary rows of the embedding.
    pub n_vocab: u32,
}

fn bad(key: String, message: String) -> PluginError {
    PluginError::BadKey {
        key: key.into(),
        message: message.into(),
    }
}

impl HParams {
    /// Reads the keys of a file whose architecture is `arch`; a missing or inconsistent key is a
    /// named error.
    pub fn from_view(view: &ModelFileView, arch: &'static str) -> Result<Self, PluginError> {
        let key = |s: &str| format!("{arch}.{s}");
        let n_embd = view.u32(&key("embedding_length"))?;
        let n_head = view.u32(&key("attention.head_count"))?;
        if n_head == 0 {
            return Err(bad(key("attention.head_count"), "must be positive".into()));
        }
        let head_dim = view.u32_or(&key("attention.key_length"), n_embd / n_head)?;
        let value_length = view.u32_or(&key("attention.value_length"), head_dim)?;
        if value_length != head_dim {
            return Err(bad(
                key("attention.value_length"),
                format!("{value_length} differs from the key length {head_dim}"),
            ));
        }
        let n_all = view.u32(&key("block_count"))?;
        let n_mtp = view.u32_or(&key("nextn_predict_layers"), 0)?;
        if n_mtp >= n_all {
            return Err(bad(
                key("nextn_predict_layers"),
                format!("{n_mtp} MTP layers of {n_all}"),
            ));
        }
        let n_layer = n_all - n_mtp;
        let interval = view.u32_or(&key("full_attention_interval"), 4)?;
        if interval == 0 {
            return Err(bad(
                key("full_attention_interval"),
                "must be positive".into(),
            ));
        }
        let recurrent = (0..n_layer).map(|i| (i + 1) % interval != 0).collect();
        let n_head_v = view.u32(&key("ssm.time_step_rank"))?;
        let n_head_k = view.u32(&key("ssm.group_count"))?;
        let d_state = view.u32(&key("ssm.state_size"))?;
        let d_inner = view.u32(&key("ssm.inner_size"))?;
        if n_head_k == 0 || n_head_v == 0 || !n_head_v.is_multiple_of(n_head_k) {
            return Err(bad(
                key("ssm.group_count"),
                format!("{n_head_k} key heads do not divide {n_head_v} value heads"),
            ));
        }
        if d_inner != n_head_v * d_state {
            return Err(bad(
                key("ssm.inner_size"),
                format!("{d_inner} is not {n_head_v} value heads × {d_state}"),
            ));
        }
        let gdn = Gdn {
            taps: view.u32(&key("ssm.conv_kernel"))?,
            n_head_k,
            n_head_v,
            dk: d_state,
            dv: d_state,
        };
        if gdn.taps < 2 {
            return Err(bad(key("ssm.conv_kernel"), format!("{} taps", gdn.taps)));
        }
        let ffn = if arch == ARCH_MOE {
            let n_expert = view.u32(&key("expert_count"))?;
            let n_expert_used = view.u32(&key("expert_used_count"))?;
            if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert {
                return Err(bad(
                    key("expert_used_count"),
                    format!("{n_expert_used} experts used of {n_expert}"),
                ));
            }
            let n_ff_exp = view.u32(&key("expert_feed_forward_length"))?;
            Ffn::Moe {
                n_expert,
                n_expert_used,
                n_ff_exp,
                n_ff_shexp: view.u32_or(&key("expert_shared_feed_forward_length"), n_ff_exp)?,
                weights_scale: Some(view.f32_or(&key("expert_weights_scale"), 0.0)?)
                    .filter(|&s| s != 0.0)
                    .unwrap_or(1.0),
            }
        } else {
            Ffn::Dense {
                n_ff: view.u32(&key("feed_forward_length"))?,
            }
        };
        let n_vocab = view
            .tensor("token_embd.weight")
            .map(|t| t.ne[1] as u32)
            .ok_or_else(|| PluginError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let hp = HParams {
            arch,
            n_layer,
            n_mtp,
            n_embd,
            n_ctx_train: view.u32_or(&key("context_length"), 0)?,
            n_head,
            n_head_kv: view.u32_or(&key("attention.head_count_kv"), n_head)?,
            head_dim,
            eps: view.f32(&key("attention.layer_norm_rms_epsilon"))?,
            recurrent,
            gdn,
            ffn,
            n_vocab,
        };
        if hp.n_head_kv == 0 || !hp.n_head.is_multiple_of(hp.n_head_kv) {
            return Err(bad(
                key("attention.head_count_kv"),
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
        let (n_expert, n_expert_used, n_ff_exp, n_ff) = match self.ffn {
            Ffn::Moe {
                n_expert,
                n_expert_used,
                n_ff_exp,
                ..
            } => (n_expert, n_expert_used, n_ff_exp, 0),
            Ffn::Dense { n_ff } => (0, 0, 0, n_ff),
        };
        Summary {
            n_layer: self.n_layer,
            n_embd: self.n_embd,
            n_vocab: self.n_vocab,
            n_ctx_train: self.n_ctx_train,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff,
        }
    }
}
