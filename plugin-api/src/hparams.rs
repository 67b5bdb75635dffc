//! Reading a model's hyperparameters from its GGUF metadata: keys under the architecture's prefix
//! with errors that name them, the checks every transformer needs (head counts, expert counts),
//! per-layer patterns, the rotary settings, and the sizes read from the tensors the file holds.
//!
//! Every count a plugin sizes a table or a shape by is checked against the tensor that carries it
//! before anything is allocated ([`ArchKeys::agrees`], [`ArchKeys::carried_by`]): a crafted file
//! whose `block_count` is 2^31 − 1 or whose head count overflows a width is a named error (the
//! key, its value and what the tensor says), not an allocation that ends the process.
//!
//! A plugin's `hparams.rs` reads the common part with [`LmHParams::read`] and adds the keys its
//! architecture has on top, through the same [`ArchKeys`].

use crate::meta::{MetaValue, ModelFileView, TensorInfo};
use crate::model::HParams as Summary;
use crate::op::{AttentionParams, RopeMode, RopeParams};
use crate::PluginError;

/// The keys of one architecture: every name is read as `{arch}.{name}`, and every error names the
/// full key.
#[derive(Clone, Copy, Debug)]
pub struct ArchKeys<'a> {
    view: &'a ModelFileView,
    arch: &'a str,
}

impl<'a> ArchKeys<'a> {
    /// The keys of `arch` in `view`.
    pub fn new(view: &'a ModelFileView, arch: &'a str) -> Self {
        ArchKeys { view, arch }
    }

    /// The file view the keys are read from.
    pub fn view(&self) -> &'a ModelFileView {
        self.view
    }

    /// The full key of `name`: `{arch}.{name}`.
    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch)
    }

    /// The value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<&'a MetaValue> {
        self.view.get(&self.key(name))
    }

    /// A required `u32`.
    pub fn u32(&self, name: &str) -> Result<u32, PluginError> {
        self.view.u32(&self.key(name))
    }

    /// An optional `u32`: `default` when absent.
    pub fn u32_or(&self, name: &str, default: u32) -> Result<u32, PluginError> {
        self.view.u32_or(&self.key(name), default)
    }

    /// A required `u32` that must be positive.
    pub fn positive(&self, name: &str) -> Result<u32, PluginError> {
        let v = self.u32(name)?;
        self.check(v > 0, name, || "must be positive".into())?;
        Ok(v)
    }

    /// An optional `u32` (`default` when absent) that must be positive.
    pub fn positive_or(&self, name: &str, default: u32) -> Result<u32, PluginError> {
        let v = self.u32_or(name, default)?;
        self.check(v > 0, name, || "must be positive".into())?;
        Ok(v)
    }

    /// A required number, as `f32`.
    pub fn f32(&self, name: &str) -> Result<f32, PluginError> {
        self.view.f32(&self.key(name))
    }

    /// An optional number: `default` when absent.
    pub fn f32_or(&self, name: &str, default: f32) -> Result<f32, PluginError> {
        self.view.f32_or(&self.key(name), default)
    }

    /// An array of exactly `n` unsigned integers under `name` (missing, another type, another
    /// length or a negative or non-integer item: named errors).
    pub fn u64_array(&self, name: &str, n: usize) -> Result<Vec<u64>, PluginError> {
        let items = match self.get(name) {
            Some(MetaValue::Array(items)) => items,
            Some(v) => return Err(self.bad(name, format!("{}, not an array", v.type_name()))),
            None => return Err(self.bad(name, "missing")),
        };
        self.check(items.len() == n, name, || {
            format!("{} values, {n} expected", items.len())
        })?;
        items
            .iter()
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    self.bad(
                        name,
                        format!("{} is not an unsigned integer", v.type_name()),
                    )
                })
            })
            .collect()
    }

    /// An optional array of integers; empty when absent.
    pub fn u32_array_or_empty(&self, name: &str) -> Result<Vec<u32>, PluginError> {
        self.view.u32_array_or_empty(&self.key(name))
    }

    /// A [`PluginError::BadKey`] naming the full key of `name`.
    pub fn bad(&self, name: &str, message: impl Into<String>) -> PluginError {
        PluginError::BadKey {
            key: self.key(name).into(),
            message: message.into().into(),
        }
    }

    /// `Ok` when `ok` holds, else [`ArchKeys::bad`] with the message `why` makes.
    pub fn check(
        &self,
        ok: bool,
        name: &str,
        why: impl FnOnce() -> String,
    ) -> Result<(), PluginError> {
        if ok {
            Ok(())
        } else {
            Err(self.bad(name, why()))
        }
    }

    /// Checks `name`'s `value` against the file's tensors: `implied`, the extent the value gives
    /// (`None` when computing it overflowed), must equal extent `axis` of `tensor`. A file
    /// without the tensor passes: the weight table names a missing tensor.
    pub fn agrees(
        &self,
        name: &str,
        value: u64,
        implied: Option<u64>,
        tensor: Option<&TensorInfo>,
        axis: usize,
    ) -> Result<(), PluginError> {
        let Some(t) = tensor else {
            return Ok(());
        };
        let extent = t.ne.get(axis).copied().unwrap_or(1);
        if implied == Some(extent) {
            return Ok(());
        }
        let gives = match implied {
            Some(x) if x == value => String::new(),
            Some(x) => format!(" (the value gives {x})"),
            None => " (the value overflows it)".to_owned(),
        };
        Err(self.bad(
            name,
            format!(
                "{value} disagrees with tensor `{}`, whose extent {axis} is {extent}{gives}",
                t.name
            ),
        ))
    }

    /// Checks `name`'s `value` against extent `axis` of the lowest layer's `blk.N.{suffix}`
    /// tensor, the tensor that carries it ([`ArchKeys::agrees`]); returns the value.
    pub fn carried_by(
        &self,
        name: &str,
        value: u32,
        suffix: &str,
        axis: usize,
    ) -> Result<u32, PluginError> {
        let v = u64::from(value);
        let t = self.view.first_layer_tensor(suffix);
        self.agrees(name, v, Some(v), t, axis)?;
        Ok(value)
    }

    /// A required positive `u32` (an FFN's width) checked against extent `axis` of the lowest
    /// layer's `blk.N.{suffix}` tensor ([`ArchKeys::carried_by`]).
    pub fn width(&self, name: &str, suffix: &str, axis: usize) -> Result<u32, PluginError> {
        let v = self.positive(name)?;
        self.carried_by(name, v, suffix, axis)
    }

    /// One flag per layer from `name`: an array of one flag per layer (booleans or integers), or a
    /// period as [`periodic_flags`] reads it (`default_period` when the key is absent).
    pub fn layer_flags(
        &self,
        name: &str,
        n_layer: u32,
        default_period: u32,
    ) -> Result<Vec<bool>, PluginError> {
        if let Some(MetaValue::Array(_)) = self.get(name) {
            let flags = self.u32_array_or_empty(name)?;
            self.check(flags.len() == n_layer as usize, name, || {
                format!("{} flags for {n_layer} layers", flags.len())
            })?;
            return Ok(flags.iter().map(|&f| f != 0).collect());
        }
        Ok(periodic_flags(n_layer, self.u32_or(name, default_period)?))
    }
}

/// One flag per layer for a repeating pattern: in each period of `period` layers every layer but
/// the last is flagged (period 4: three flagged layers, then one not); period 0 flags every layer.
pub fn periodic_flags(n_layer: u32, period: u32) -> Vec<bool> {
    (0..n_layer)
        .map(|il| period == 0 || il % period < period - 1)
        .collect()
}

/// The rows of the token embedding `token_embd.weight`: the vocabulary, read from the tensor the
/// file holds rather than from a key.
pub fn vocab_rows(view: &ModelFileView) -> Result<u32, PluginError> {
    const NAME: &str = "token_embd.weight";
    let t = view
        .tensor(NAME)
        .ok_or_else(|| PluginError::MissingTensor { name: NAME.into() })?;
    u32::try_from(t.ne[1]).map_err(|_| PluginError::BadTensor {
        name: NAME.into(),
        message: format!("{} rows do not fit in u32", t.ne[1]).into(),
    })
}

/// The heads of a grouped-query attention layer whose keys and values share one head size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: u32,
    /// Key/value heads (they divide the query heads).
    pub n_head_kv: u32,
    /// Elements per head, of keys and values alike.
    pub head_dim: u32,
}

impl AttentionShape {
    /// Reads `attention.head_count` (positive), `attention.head_count_kv` (default: the query
    /// heads; must divide them), `attention.key_length` (default `n_embd / n_head`) and
    /// `attention.value_length` (default and only value: the key length), each checked against
    /// the first attention layer's tensors: the key length against `attn_k_norm` (when the file
    /// has one), the query width against `attn_output`, the key width against `attn_k`.
    pub fn read(keys: &ArchKeys<'_>, n_embd: u32) -> Result<Self, PluginError> {
        let n_head = keys.positive("attention.head_count")?;
        let head_dim = keys.u32_or("attention.key_length", n_embd / n_head)?;
        let v_dim = keys.u32_or("attention.value_length", head_dim)?;
        keys.check(
            v_dim == head_dim && head_dim > 0,
            "attention.value_length",
            || format!("value length {v_dim} must equal key length {head_dim}"),
        )?;
        let n_head_kv = keys.u32_or("attention.head_count_kv", n_head)?;
        keys.check(
            n_head_kv > 0 && n_head.is_multiple_of(n_head_kv),
            "attention.head_count_kv",
            || format!("{n_head_kv} KV heads do not divide {n_head} heads"),
        )?;
        let first = |suffix: &str| keys.view().first_layer_tensor(suffix);
        keys.carried_by("attention.key_length", head_dim, "attn_k_norm.weight", 0)?;
        let hd = u64::from(head_dim);
        let (nh, nkv) = (u64::from(n_head), u64::from(n_head_kv));
        let q = first("attn_output.weight");
        keys.agrees("attention.head_count", nh, hd.checked_mul(nh), q, 0)?;
        let k = first("attn_k.weight");
        keys.agrees("attention.head_count_kv", nkv, hd.checked_mul(nkv), k, 1)?;
        Ok(AttentionShape {
            n_head,
            n_head_kv,
            head_dim,
        })
    }

    /// Width of the queries: `head_dim · n_head`.
    pub fn q_width(&self) -> u64 {
        u64::from(self.head_dim) * u64::from(self.n_head)
    }

    /// Width of the keys, and of the values: `head_dim · n_head_kv`.
    pub fn kv_width(&self) -> u64 {
        u64::from(self.head_dim) * u64::from(self.n_head_kv)
    }

    /// The attention op's parameters (scale `1/sqrt(head_dim)`, causal, no window).
    pub fn gqa(&self) -> AttentionParams {
        AttentionParams::gqa(self.n_head, self.n_head_kv, self.head_dim)
    }
}

/// The hyperparameters every causal LM file has.
#[derive(Clone, Debug, PartialEq)]
pub struct LmHParams {
    /// Layers the main graph runs.
    pub n_layer: u32,
    /// Hidden width.
    pub n_embd: u32,
    /// Training context (0 when the file does not say).
    pub n_ctx_train: u32,
    /// Vocabulary rows of the embedding.
    pub n_vocab: u32,
    /// RMS norm ε.
    pub eps: f32,
    /// The attention heads.
    pub attn: AttentionShape,
}

impl LmHParams {
    /// Reads `block_count` (at most the layers the tensors name), `embedding_length` (the
    /// embedding's columns), `context_length` (optional), the attention heads
    /// ([`AttentionShape::read`]) and `attention.layer_norm_rms_epsilon`, and the vocabulary from
    /// the embedding's rows ([`vocab_rows`]).
    pub fn read(keys: &ArchKeys<'_>) -> Result<Self, PluginError> {
        Self::read_trunk(keys, 0)
    }

    /// [`LmHParams::read`] for a file whose last `n_mtp` of `block_count` layers are MTP draft
    /// layers the main graph does not run: `n_layer` counts the others (at least one), and only
    /// they must be named by the tensors (a file converted without its MTP weights keeps the
    /// count).
    pub fn read_trunk(keys: &ArchKeys<'_>, n_mtp: u32) -> Result<Self, PluginError> {
        let n_all = keys.u32("block_count")?;
        keys.check(n_mtp == 0 || n_mtp < n_all, "nextn_predict_layers", || {
            format!("{n_mtp} MTP layers of {n_all} (the main graph needs one)")
        })?;
        let n_layer = n_all - n_mtp;
        let named = keys.view().layers_named();
        keys.check(u64::from(n_layer) <= named, "block_count", || {
            format!("{n_layer} layers, but the file's tensors name {named}")
        })?;
        let n_embd = keys.positive("embedding_length")?;
        let e = u64::from(n_embd);
        let embd = keys.view().tensor("token_embd.weight");
        keys.agrees("embedding_length", e, Some(e), embd, 0)?;
        Ok(LmHParams {
            n_layer,
            n_embd,
            n_ctx_train: keys.u32_or("context_length", 0)?,
            n_vocab: vocab_rows(keys.view())?,
            eps: keys.f32("attention.layer_norm_rms_epsilon")?,
            attn: AttentionShape::read(keys, n_embd)?,
        })
    }

    /// The summary of a model with a dense FFN of `n_ff`.
    pub fn dense_summary(&self, n_ff: u32) -> Summary {
        Summary {
            n_ff,
            ..self.summary()
        }
    }

    /// The summary of a model with routed experts.
    pub fn moe_summary(&self, e: &Experts) -> Summary {
        Summary {
            n_expert: e.n_expert,
            n_expert_used: e.n_expert_used,
            n_ff_exp: e.n_ff_exp,
            ..self.summary()
        }
    }

    fn summary(&self) -> Summary {
        Summary {
            n_layer: self.n_layer,
            n_embd: self.n_embd,
            n_vocab: self.n_vocab,
            n_ctx_train: self.n_ctx_train,
            n_head: self.attn.n_head,
            n_head_kv: self.attn.n_head_kv,
            head_dim: self.attn.head_dim,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_exp: 0,
            n_ff: 0,
        }
    }
}

/// The routed experts of a mixture-of-experts FFN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Experts {
    /// Routed experts.
    pub n_expert: u32,
    /// Experts per token (1 to `n_expert`).
    pub n_expert_used: u32,
    /// Expert FFN width.
    pub n_ff_exp: u32,
    /// Factor on the chosen experts' weights (1 when the file has none or 0).
    pub weights_scale: f32,
}

impl Experts {
    /// Reads `expert_count` (the router's rows), `expert_used_count` (1 to the expert count),
    /// `expert_feed_forward_length` (the down stacks' columns) and `expert_weights_scale`
    /// (optional).
    pub fn read(keys: &ArchKeys<'_>) -> Result<Self, PluginError> {
        let n_expert_used = keys.u32("expert_used_count")?;
        let n_expert = keys.u32("expert_count")?;
        keys.check(
            n_expert > 0 && n_expert_used > 0 && n_expert_used <= n_expert,
            "expert_used_count",
            || format!("{n_expert_used} experts used of {n_expert}"),
        )?;
        keys.carried_by("expert_count", n_expert, "ffn_gate_inp.weight", 1)?;
        let scale = keys.f32_or("expert_weights_scale", 0.0)?;
        Ok(Experts {
            n_expert,
            n_expert_used,
            n_ff_exp: keys.width("expert_feed_forward_length", "ffn_down_exps.weight", 0)?,
            weights_scale: if scale == 0.0 { 1.0 } else { scale },
        })
    }
}

/// Rotary settings read from the common GGUF keys of an architecture.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    /// Parameters for [`crate::op::Op::Rope`].
    pub params: RopeParams,
}

impl RopeConfig {
    /// Reads `rope.dimension_count` (default `head_dim`; even and at most `head_dim`),
    /// `rope.freq_base`, and linear or YaRN scaling (`rope.scaling.type`, linear when absent as
    /// llama.cpp reads it; `.factor`, else the older `rope.scale_linear`;
    /// `.original_context_length`; `.attn_factor`), then YaRN's mix as llama.cpp's context sets
    /// it ([`yarn_mix`]).
    pub fn read(keys: &ArchKeys<'_>, mode: RopeMode, head_dim: u32) -> Result<Self, PluginError> {
        let n_dims = keys.u32_or("rope.dimension_count", head_dim)?;
        keys.check(
            n_dims <= head_dim && n_dims.is_multiple_of(2),
            "rope.dimension_count",
            || format!("{n_dims} rotated dims of a {head_dim}-wide head (even, at most the head)"),
        )?;
        let freq_base = keys.f32_or("rope.freq_base", 10000.0)?;
        let scaling = match keys.get("rope.scaling.type") {
            Some(v) => v.as_str().unwrap_or("none").to_owned(),
            None => "linear".to_owned(),
        };
        let factor = match keys.get("rope.scaling.factor") {
            Some(_) => keys.f32("rope.scaling.factor")?,
            None => keys.f32_or("rope.scale_linear", 1.0)?,
        };
        // llama.cpp's `ropescale == 0 ? 1 : 1 / ropescale`.
        let factor = if factor == 0.0 { 1.0 } else { factor };
        keys.check(
            factor.is_finite() && factor > 0.0,
            "rope.scaling.factor",
            || format!("{factor} (a positive scale)"),
        )?;
        let n_ctx_train = keys.u32_or("context_length", 0)?;
        let n_ctx_orig = keys.u32_or("rope.scaling.original_context_length", n_ctx_train)?;
        let freq_scale = match scaling.as_str() {
            "linear" | "yarn" => 1.0 / factor,
            "none" => 1.0,
            other => {
                return Err(keys.bad(
                    "rope.scaling.type",
                    format!("unsupported rope scaling `{other}` (supported: none, linear, yarn)"),
                ))
            }
        };
        let mut params = RopeParams {
            freq_scale,
            n_ctx_orig,
            ..RopeParams::unscaled(mode, n_dims, [0; 4], freq_base)
        };
        yarn_mix(keys, scaling == "yarn", &mut params)?;
        Ok(RopeConfig { params })
    }
}

/// YaRN's mix on `p` (whose `freq_scale` is set), as llama.cpp b11434's context sets it
/// (`llama_context`'s constructor) from `--yarn-ext-factor`, `--yarn-attn-factor`,
/// `--yarn-beta-fast` and `--yarn-beta-slow`, which reach the plugins as the keys
/// `rope.scaling.yarn_ext_factor`, `.yarn_attn_factor`, `.yarn_beta_fast` and `.yarn_beta_slow`
/// (llama.cpp's names for them; a negative value is unset): the extrapolation mix is the given
/// one, else 1 under YaRN and 0 otherwise; with a mix, the magnitude is `m(s) / (1 + 0.1 ln s)`
/// with `m(s) = 1 + 0.1 ln s` above a scale `s` of 1 and 1 below (the kernel's own YaRN factor
/// cancelled), else the given factor, else 1; then times `rope.scaling.attn_factor` (default 1).
fn yarn_mix(keys: &ArchKeys<'_>, yarn: bool, p: &mut RopeParams) -> Result<(), PluginError> {
    let set = |name: &str| -> Result<Option<f32>, PluginError> {
        Ok(Some(keys.f32_or(name, -1.0)?).filter(|v| *v >= 0.0))
    };
    p.ext_factor = set("rope.scaling.yarn_ext_factor")?.unwrap_or(if yarn { 1.0 } else { 0.0 });
    p.attn_factor = if p.ext_factor != 0.0 {
        let scale = 1.0 / p.freq_scale;
        let m = if scale <= 1.0 {
            1.0
        } else {
            0.1 * scale.ln() + 1.0
        };
        m / (1.0 + 0.1 * scale.ln())
    } else {
        set("rope.scaling.yarn_attn_factor")?.unwrap_or(1.0)
    };
    p.attn_factor *= keys.f32_or("rope.scaling.attn_factor", 1.0)?;
    p.beta_fast = set("rope.scaling.yarn_beta_fast")?.unwrap_or(p.beta_fast);
    p.beta_slow = set("rope.scaling.yarn_beta_slow")?.unwrap_or(p.beta_slow);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{MetaEntry, TensorInfo};
    use crate::DType;

    /// A view of `entries` (under the architecture `a`) whose tensors are the embedding
    /// `[64, 100]` and one norm in each of layers 0 to 2.
    fn view(entries: &[(&str, MetaValue)]) -> ModelFileView {
        let tensor = |name: &str, ne: [u64; 4]| TensorInfo {
            name: name.into(),
            dtype: DType::F32,
            n_dims: 2,
            ne,
        };
        let mut tensors = vec![tensor("token_embd.weight", [64, 100, 1, 1])];
        tensors.extend((0..3).map(|il| tensor(&format!("blk.{il}.attn_norm.weight"), [64; 4])));
        ModelFileView {
            metadata: entries
                .iter()
                .map(|(k, v)| MetaEntry::new(&format!("a.{k}"), v.clone()))
                .collect(),
            tensors: tensors.into(),
        }
    }

    fn lm(extra: &[(&str, MetaValue)]) -> Result<LmHParams, PluginError> {
        let mut e = vec![
            ("block_count", MetaValue::U32(3)),
            ("embedding_length", MetaValue::U32(64)),
            ("attention.head_count", MetaValue::U32(4)),
            ("attention.layer_norm_rms_epsilon", MetaValue::F32(1e-6)),
        ];
        e.extend(extra.iter().cloned());
        let v = view(&e);
        LmHParams::read(&ArchKeys::new(&v, "a"))
    }

    #[test]
    fn the_common_keys_default_as_llama_cpp_does_and_the_vocabulary_comes_from_the_tensor() {
        let hp = lm(&[]).unwrap();
        assert_eq!(
            hp.attn,
            AttentionShape {
                n_head: 4,
                n_head_kv: 4,
                head_dim: 16
            }
        );
        assert_eq!((hp.n_layer, hp.n_vocab, hp.n_ctx_train), (3, 100, 0));
        assert_eq!(hp.dense_summary(7).n_ff, 7);
    }

    #[test]
    fn head_counts_that_do_not_fit_are_named_errors() {
        let bad = |extra: &[(&str, MetaValue)], key: &str| {
            let e = lm(extra).unwrap_err();
            assert!(
                matches!(&e, PluginError::BadKey { key: k, .. } if k.as_str() == key),
                "{e}"
            );
        };
        bad(
            &[("attention.head_count_kv", MetaValue::U32(3))],
            "a.attention.head_count_kv",
        );
        bad(
            &[("attention.head_count_kv", MetaValue::U32(0))],
            "a.attention.head_count_kv",
        );
        bad(
            &[("attention.value_length", MetaValue::U32(8))],
            "a.attention.value_length",
        );
        let v = view(&[("attention.head_count", MetaValue::U32(0))]);
        let e = AttentionShape::read(&ArchKeys::new(&v, "a"), 64).unwrap_err();
        assert_eq!(
            e.to_string(),
            "metadata key `a.attention.head_count`: must be positive"
        );
    }

    #[test]
    fn counts_the_tensors_contradict_are_named_errors_with_what_the_tensor_says() {
        let err = |extra: &[(&str, MetaValue)], view_edit: &dyn Fn(&mut ModelFileView)| {
            let mut e = vec![
                ("block_count", MetaValue::U32(3)),
                ("embedding_length", MetaValue::U32(64)),
                ("attention.head_count", MetaValue::U32(4)),
                ("attention.layer_norm_rms_epsilon", MetaValue::F32(1e-6)),
            ];
            e.retain(|(k, _)| extra.iter().all(|(x, _)| x != k));
            e.extend(extra.iter().cloned());
            let mut v = view(&e);
            view_edit(&mut v);
            LmHParams::read(&ArchKeys::new(&v, "a"))
                .unwrap_err()
                .to_string()
        };
        let none = |_: &mut ModelFileView| {};
        assert_eq!(
            err(&[("block_count", MetaValue::U32(i32::MAX as u32))], &none),
            "metadata key `a.block_count`: 2147483647 layers, but the file's tensors name 3"
        );
        assert_eq!(
            err(&[("embedding_length", MetaValue::U32(65))], &none),
            "metadata key `a.embedding_length`: 65 disagrees with tensor `token_embd.weight`, \
             whose extent 0 is 64"
        );
        let attn_output = |v: &mut ModelFileView| {
            v.tensors.push(TensorInfo {
                name: "blk.1.attn_output.weight".into(),
                dtype: DType::F32,
                n_dims: 2,
                ne: [64, 64, 1, 1],
            })
        };
        let huge = [
            ("attention.head_count", MetaValue::U32(u32::MAX)),
            ("attention.key_length", MetaValue::U32(u32::MAX)),
            ("attention.value_length", MetaValue::U32(u32::MAX)),
            ("attention.head_count_kv", MetaValue::U32(1)),
        ];
        assert_eq!(
            err(&huge, &attn_output),
            "metadata key `a.attention.head_count`: 4294967295 disagrees with tensor \
             `blk.1.attn_output.weight`, whose extent 0 is 64 (the value gives \
             18446744065119617025)"
        );
        // A layer missing in the middle: only the layers before it count.
        let gap = |v: &mut ModelFileView| v.tensors.retain(|t| !t.name.starts_with("blk.1."));
        assert!(err(&[], &gap).contains("3 layers, but the file's tensors name 1"));
    }

    #[test]
    fn experts_used_must_be_between_one_and_the_expert_count() {
        let keys = |used: u32| {
            view(&[
                ("expert_count", MetaValue::U32(8)),
                ("expert_used_count", MetaValue::U32(used)),
                ("expert_feed_forward_length", MetaValue::U32(32)),
            ])
        };
        let v = keys(2);
        let x = Experts::read(&ArchKeys::new(&v, "a")).unwrap();
        assert_eq!((x.n_expert, x.n_expert_used, x.weights_scale), (8, 2, 1.0));
        for used in [0, 9] {
            let v = keys(used);
            let e = Experts::read(&ArchKeys::new(&v, "a")).unwrap_err();
            assert!(e.to_string().contains("a.expert_used_count"), "{e}");
        }
        let mut v = keys(2);
        v.tensors.push(TensorInfo {
            name: "blk.0.ffn_gate_inp.weight".into(),
            dtype: DType::F32,
            n_dims: 2,
            ne: [64, 4, 1, 1],
        });
        let e = Experts::read(&ArchKeys::new(&v, "a")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "metadata key `a.expert_count`: 8 disagrees with tensor `blk.0.ffn_gate_inp.weight`, \
             whose extent 1 is 4"
        );
    }

    #[test]
    fn layer_flags_read_an_array_or_a_period() {
        assert_eq!(
            periodic_flags(8, 4),
            [true, true, true, false, true, true, true, false]
        );
        assert_eq!(periodic_flags(2, 0), [true, true]);
        assert_eq!(periodic_flags(2, 1), [false, false]);
        let flags = [1u32, 0, 1].map(MetaValue::U32).into_iter().collect();
        let v = view(&[("p", MetaValue::Array(flags))]);
        let keys = ArchKeys::new(&v, "a");
        assert_eq!(keys.layer_flags("p", 3, 6).unwrap(), [true, false, true]);
        assert!(keys.layer_flags("p", 4, 6).is_err());
        assert_eq!(
            keys.layer_flags("absent", 3, 2).unwrap(),
            [true, false, true]
        );
    }
}
