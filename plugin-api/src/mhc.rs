//! The manifold hyper-connections' hyperparameters (GLM-5.3 `glm5-next`, DeepSeek V4
//! `deepseek4`): the keys both architectures write, read and checked once, and the per-layer
//! SwiGLU clamps both read beside them. The ops are `Sinkhorn`, `StreamMix` and `StreamUpdate`.

use crate::hparams::ArchKeys;
use crate::meta::MetaValue;
use crate::PluginError;

/// The most Sinkhorn iterations accepted (the models use 20; a crafted count would stall every
/// pass).
pub const MAX_SINKHORN: u32 = 1000;

/// The manifold hyper-connections (mHC) around every layer's mixer and FFN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HyperConnections {
    /// Residual streams (`hyper_connection.count`; only 4 is built, as in llama.cpp).
    pub n_stream: u32,
    /// Sinkhorn iterations (`hyper_connection.sinkhorn_iterations`).
    pub iters: u32,
    /// ε of the pre weights and of the Sinkhorn steps (`hyper_connection.epsilon`).
    pub eps: f32,
}

impl HyperConnections {
    /// Reads the keys: 4 streams (llama.cpp builds no other count), at most `n_embd` of them, 1
    /// to [`MAX_SINKHORN`] Sinkhorn iterations, a finite ε ≥ 0; `hc_attn_fn` reads all
    /// `4·n_embd` stream values.
    pub fn read(keys: &ArchKeys<'_>, n_embd: u32) -> Result<HyperConnections, PluginError> {
        let n_stream = keys.u32("hyper_connection.count")?;
        keys.check(n_stream == 4, "hyper_connection.count", || {
            format!("{n_stream} streams (only 4 is built, as in llama.cpp)")
        })?;
        // The graphs read the embeddings' first `n` values of each row.
        keys.check(n_embd >= n_stream, "embedding_length", || {
            format!("{n_embd}, narrower than the {n_stream} hyper-connection streams")
        })?;
        let t = keys.view().first_layer_tensor("hc_attn_fn.weight");
        let implied = u64::from(n_embd) * u64::from(n_stream);
        keys.agrees(
            "hyper_connection.count",
            u64::from(n_stream),
            Some(implied),
            t,
            0,
        )?;
        let iters = keys.u32("hyper_connection.sinkhorn_iterations")?;
        keys.check(
            (1..=MAX_SINKHORN).contains(&iters),
            "hyper_connection.sinkhorn_iterations",
            || format!("{iters} (1 to {MAX_SINKHORN})"),
        )?;
        let eps = keys.f32("hyper_connection.epsilon")?;
        keys.check(
            eps.is_finite() && eps >= 0.0,
            "hyper_connection.epsilon",
            || format!("{eps}"),
        )?;
        Ok(HyperConnections {
            n_stream,
            iters,
            eps,
        })
    }

    /// Mixing coefficients per row: `n` pre, `n` post, `n²` comb.
    pub fn n_mix(&self) -> u64 {
        let n = u64::from(self.n_stream);
        (2 + n) * n
    }
}

/// A per-layer SwiGLU clamp (`name`): an array of one value per layer (`n_layer` of them, draft
/// layers included where the file counts them) or one value for all; absent, `default` (or 0, no
/// clamp). Values at most 1e-6 mean no clamp, as in llama.cpp.
pub fn swiglu_clamps(
    keys: &ArchKeys<'_>,
    name: &str,
    n_layer: usize,
    default: Option<&[f32]>,
) -> Result<Vec<f32>, PluginError> {
    let value = |v: &MetaValue| -> Result<f32, PluginError> {
        let x = v
            .as_f64()
            .ok_or_else(|| keys.bad(name, format!("{} is not a number", v.type_name())))?;
        keys.check(!x.is_nan(), name, || "NaN".into())?;
        Ok(if x > 1e-6 { x as f32 } else { 0.0 })
    };
    match keys.get(name) {
        None => Ok(default.map_or_else(|| vec![0.0; n_layer], <[f32]>::to_vec)),
        Some(MetaValue::Array(items)) => {
            keys.check(items.len() == n_layer, name, || {
                format!("{} values for {n_layer} layers", items.len())
            })?;
            items.iter().map(value).collect()
        }
        Some(v) => Ok(vec![value(v)?; n_layer]),
    }
}
