//! Model plugin for Qwen3.8-Flash-Next (GGUF architecture `qwen4exp`, llama.cpp b11434
//! `src/models/qwen4exp.cpp`; reference `tests/oracle/hf_qwen4exp.py`, whose docstring lists
//! every key and tensor the b11434 converter writes): Gated DeltaNet layers and, every fourth
//! layer, gated GQA over the QSA indexer's block selection; gated hyper-connections (4 residual
//! streams, low-rank mixers, no Sinkhorn) in place of every norm; 512 softmax-routed experts
//! plus a sigmoid-gated shared expert in every layer; the PLE n-gram table added on one layer;
//! the MTP block, from the trunk file or from a separate MTP-only file.
//!
//! This crate reads and checks the hyperparameters ([`hparams`], [`layers`], [`ple`]), declares
//! every weight ([`weights`]) and the state ([`state`]), builds the trunk's forward graph
//! ([`graph`]; with per-row states as the verify graph) and the MTP block's draft graph
//! ([`mtp`]), and offers `synth` presets ([`synth`]). The n-gram table's row ids are hashed by
//! the host from the constants [`ModelSpec::ngram`] declares (`bloomery_plugin_api::ngram`).
//! The CPU bundles and the CUDA bundles run every op of the trunk (on an H100, session 61, the
//! tiny file's model cases match cpu-scalar and its greedy text is the CPU's).
//!
//! # Design note: the graph's ops against the ABI
//!
//! Sources: the numerics section of `tests/oracle/hf_qwen4exp.py` and b11434's
//! `src/models/qwen4exp.cpp` (`build_hc_mix`, `build_hc_combine`, `build_qsa_sel`, `build_ple`,
//! `llm_graph_input_qwen4exp_ple::set_input`, `graph_mtp`); the ABI as `plugin-api/src/op.rs`
//! documents it on main when this was written. `n` = `n_embd`, `s` = `n_stream` (4), `T` rows.
//!
//! ## What maps onto existing ops
//!
//! * **Streams.** The residual is `[s·n, T]` (stream-major within a row, as the grouped norms'
//!   gammas are stored). Its start, `s` copies of the embedding row (`GetRows`), is two
//!   `Concat`s (doubling).
//! * **Grouped RMSNorm** (`hc_*_norm`, `ple_norm_*`, `nextn.hnorm`): reshape to `[n, s·T]`,
//!   `RmsNorm` without weight, reshape back, `Mul` by the `[s·n]` gamma (one row broadcast).
//! * **Mixer projections**: `g = σ(up · silu(down · xn / s))` and the injection
//!   `2·σ(inject · xn / s)` are `MatMul`, `Scale`, `Unary` (Silu, Sigmoid).
//! * **Gated DeltaNet**: as `qwen35` (`MatMul`, `ConvCausal` with 4 taps, `Unary` Silu,
//!   `L2Norm`, `DeltaRule` with tiled value heads, decay `a·softplus(alpha + dt_bias)`, `β = σ`),
//!   but the output gate is `RmsNorm(o)·ssm_norm·σ(z)`: `Unary` Sigmoid in place of Silu.
//! * **Gated GQA**: `attn_q` split per head into query and gate (views), per-head `RmsNorm`
//!   with `attn_q_norm`/`attn_k_norm`, `Rope` IMROPE on the first 64 dims (sections
//!   [11, 11, 10, 0]), `CacheStore`, `Attention` with `selected` (the QSA selection as the
//!   positions it lists, −1 padded, exactly the form `KPoolSelect` gives), `Mul` by `σ(gate)`,
//!   `MatMul` `attn_output`. The indexer query `RmsNorm(q_proj x)·q_norm` per head, roped at the
//!   row's position, is `MatMul`, `RmsNorm`, `Rope` before the selection op.
//! * **MoE**: `RouterTopK`/`RouterWeights` with `Gating::Softmax`, renormalised, scale 1;
//!   `MoeExperts` (fused or separate stacks); shared expert `Glu` SwiGlu, scaled by
//!   `σ(ffn_gate_inp_shexp · x)` (`MatMul` to `[1, T]`, `Unary`, `Mul` one value per row).
//! * **Final mixer**: `output_hc_*` as a layer mixer without injection, then `MatMul` `output`.
//! * **The table read**: `per_layer_token_embd` is `WeightClass::NgramTable` (ABI 17): the host
//!   gathers the 16 rows per token the row ids name (from the mapped file, or the tiering's
//!   reader when host RAM is short, with token t+1's rows fetched ahead) into
//!   `BatchInput::NgramEmbd` `[head_dim, 16, T]`, reshaped to `[n, T]`; no card holds the table.
//!
//! ## What mapped only at a cost (extended in ABI 12)
//!
//! * **The mixer's gated mean** `Σ_j σ(g)_j·xn_j / s` over streams: `StreamMix` takes one weight
//!   per stream and row (`[s, T]`), not per element. With existing ops it is `Mul`, then `s`
//!   `Copy`s of strided stream views, `s − 1` `Add`s and a `Scale` (about `2s` extra passes over
//!   `s·n` per mixer, three mixers per layer). Built: `StreamMix` also accepts per-element
//!   weights `w [n, s, T]`: `out[:, r] = Σ_j w[:, j, r]·streams[:, j, r]` (the graph passes
//!   `σ(g)/s`), which llama.cpp fuses the same way (`ggml_dsv4_hc_pre_gated`).
//! * **The combine** `x_j += w_j·y`: `StreamUpdate` needs a comb matrix `[s, s, T]`, here the
//!   identity, which the graph cannot make (no constant tensors). With existing ops it is `y`
//!   concatenated `s` times, reshaped to `[n, s·T]`, `Mul` by `w` as `[1, s·T]`, `Add`.
//!   Built: `StreamUpdate` with the comb source absent (three sources) meaning the identity:
//!   `out[:, i, r] = streams[:, i, r] + post[i, r]·y[:, r]`.
//!
//! ## What needed a new or extended op or input (1, 3 and 4 built in ABI 12, 2 in ABI 13)
//!
//! 1. **QSA block selection.** `KPoolSelect` pools differently (a softmax over each pool's
//!    positions gated per dimension with `ape`, rows `[key | gate | pooled]` of `3·dh`) and
//!    weighs heads by a per-row `w`. QSA: cache rows `[raw key | pooled key]` of `2·dh` (the
//!    raw key `k_proj x` stored without norm or rope); block `g` = positions `g·r .. g·r + r`
//!    (`r` the compress ratio), complete once its last position is stored; its pooled key is
//!    `rope(RmsNorm(mean of its r raw keys)·k_norm)`, roped at the block's FIRST position
//!    `g·r` with the model's rope (IMROPE, first `rope.dimension_count` dims), written into the
//!    pooled half of the block's last row; score `Σ_h relu(q_h · pooled_g) / √dh` (no head
//!    weights); keep the `min(top_k / r, complete)` best (ties: lower block), then every
//!    position after the last complete block: output as `KPoolSelect`'s,
//!    `n_sel = r·(top_k / r) + r − 1`, so up to `top_k + r − 1` visible positions it is dense.
//!    Built: `KPoolParams::mode`, `KPoolMode::MeanNormRope { eps, rope, scale }` with srcs
//!    `[q, k_norm, cache, slots, positions]` (`k_norm` the `dh` gamma; the cache stays source
//!    2) and every head weighing `scale` (`1/√dh`). llama.cpp forms blocks from the
//!    visible cells in cache order
//!    (`kpool_by_order`); with positional caches that start at 0 and have no holes that is
//!    position order, but a context shift or a cache edit that moves positions must re-pool
//!    the blocks it touches (or be refused for this model).
//! 2. **PLE row ids** (built in ABI 13, on the host). Semantics (b11434 `set_input`,
//!    transformers' n-gram module): `ctx_0` = the token, `ctx_j` = the token `j` back; once a
//!    predecessor is missing or equals the end id (`ple.eos_token_id`), it and every older one
//!    read as the end id (the token's own end id does not cut its context); for `m = 2 ..=
//!    ngram_size`, `h = XOR_{j<m} ctx_j·mult_j` in u64, and each of that size's heads `k` reads
//!    row `h mod head_vocab_sizes[k] + head_offsets[k]`. An op would need the hash constants (3
//!    multipliers, 16 sizes and offsets), which no source can carry (no constant tensors) and
//!    which would grow every `Op` as parameters, plus the sequence's last tokens as state; the
//!    host has both the sequence record and the need (it fetches token t+1's table rows ahead),
//!    as llama.cpp computes them in `set_input`. So the model declares the constants
//!    (`ModelSpec::ngram`), the host hashes (`NgramSpec::extend_rows`) into the batch input
//!    `NgramRows`; ABI 13 dropped the unimplemented `NgramHash` op and the never-filled
//!    `TokenHistory` input. Since ABI 17 the host also gathers the table rows the ids name
//!    (`BatchInput::NgramEmbd`), so the graph never reads the table itself.
//! 3. **PLE gate.** Per stream `d = Σ(kn_j·qn_j) / √n` over each `n`-wide stream, then
//!    `σ(sign(d)·√max(|d|, 1e-6))`: the ABI has no reduction over a row and no sign, abs or sqrt
//!    function. Built: `GroupDotGate { scale: 1/√n, floor: 1e-6 }` (the group is `ne[0]`), srcs
//!    `[a [n, s, T], b [n, s, T]]` → `[s, T]`. The gated value `gate_j·value` is then the
//!    identity `StreamUpdate` of zero streams by `post` = the gate and `y` = value (exact).
//! 4. **Dilated causal convolution** (PLE, kernel `ple.conv_kernel` 4, dilation `ngram_size` 3):
//!    `ConvCausal` had no dilation. Built: `ConvCausal { taps, dilation }`, `y[t, c] =
//!    Σ_j w[j, c]·x[t − (taps − 1 − j)·dilation, c]` (zero before the sequence start), the state
//!    holding the last `(taps − 1)·dilation` inputs oldest first (the `ple_conv_state` declared
//!    here); dilation 1 is today's op.
//! 5. **MTP hidden input.** The MTP block reads the trunk's `s·n`-wide residual before the final
//!    mixer, not a final-norm row of `n`. Built: `BatchInput::Hidden` takes the width the draft
//!    graph declares (`[s·n, T]` here), and both graphs name those rows of their output rows
//!    `NEXTN_HIDDEN` (`h_nextn`, as llama.cpp's `t_h_nextn`), which the host reads as it reads
//!    `FINAL_NORM`.

pub mod graph;
pub mod hparams;
pub mod layers;
pub mod mtp;
pub mod ple;
pub mod state;
pub mod synth;
pub mod weights;

use abi_stable::std_types::{RResult, RVec};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphKind};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{ModelCaps, ModelInstance, ModelSpec, StateDecl};
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::PluginError;

use hparams::{HParams, ARCH};
use state::LayerState;
use weights::Weights;

/// A loaded Qwen3.8-Flash-Next file (trunk, MTP-only, or both).
pub struct Qwen4Exp {
    hp: HParams,
    weights: Weights,
    state: Vec<StateDecl>,
    layer_state: Vec<Option<LayerState>>,
}

impl Qwen4Exp {
    /// Reads hyperparameters and weights from the file view.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        view.expect_architecture(ARCH)?;
        let hp = HParams::from_view(view)?;
        let weights = weights::declare(&mut WeightTable::new(view), &hp)?;
        let (state, layer_state) = state::declare(&hp, weights.nextn.is_some());
        Ok(Qwen4Exp {
            hp,
            weights,
            state,
            layer_state,
        })
    }

    /// The hyperparameters.
    pub fn hparams(&self) -> &HParams {
        &self.hp
    }

    /// The weights.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Where layer `il`'s state is (`None` for a layer the file does not hold).
    pub fn layer_state(&self, il: u32) -> Option<LayerState> {
        self.layer_state.get(il as usize).copied().flatten()
    }
}

impl ModelInstance for Qwen4Exp {
    fn spec(&self) -> ModelSpec {
        ModelSpec {
            architecture: ARCH.into(),
            hparams: self.hp.summary(),
            weights: self.weights.decls.clone().into(),
            state: RVec::from(self.state.clone()),
            caps: ModelCaps {
                recurrent: true,
                n_mtp_layers: u32::from(self.weights.nextn.is_some()),
                max_context: u64::from(self.hp.lm.n_ctx_train),
            },
            ngram: self.hp.ple.as_ref().map(ple::Ple::spec).into(),
        }
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        let m = graph::Model {
            hp: &self.hp,
            w: &self.weights,
            state: &self.layer_state,
            verify: shape.kind == GraphKind::Verify,
        };
        match shape.kind {
            GraphKind::Main | GraphKind::Verify => graph::build(&m, shape),
            GraphKind::Mtp => mtp::build(&m, shape),
        }
        .into()
    }
}

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH],
    synth_presets: synth::presets,
    load: Qwen4Exp::load,
}

/// The test binary refuses any one allocation over 1 GiB, so that the hostile-file test fails
/// on a table sized by a hostile count.
#[cfg(test)]
#[global_allocator]
static ALLOC: bloomery_plugin_api::hostile::CappedAlloc =
    bloomery_plugin_api::hostile::CappedAlloc::new(1 << 30);

#[cfg(test)]
mod tests;
