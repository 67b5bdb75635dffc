//! Shared graph builders: the blocks forward graphs are made of (norms, projections, attention
//! over the host's cache, gated FFNs, routed experts, the head, a pre-norm layer, the frame of a
//! causal LM) and the K/V cache declarations they read. A model plugin's graph function strings
//! these together; an architecture that needs a block no other uses builds it from
//! [`GraphBuilder::op`] directly.

use abi_stable::std_types::RVec;

use crate::graph::{BatchInput, BatchShape, Graph, GraphBuilder, TensorId};
use crate::hparams::LmHParams;
use crate::model::{StateDecl, StateKind};
use crate::op::{AttentionParams, GluKind, MoeParams, Op, RopeParams, RouterParams, UnaryFn};
use crate::weights::{
    AttentionWeights, ExpertWeights, GluFfnWeights, LmGlobals, PreNormLayer, WeightRef,
};
use crate::{DType, PluginError};

/// State indices of layer `il`'s key and value caches, as [`kv_cache_decls`] declares them.
pub fn kv_cache_indices(il: u32) -> (u32, u32) {
    (2 * il, 2 * il + 1)
}

/// A key cache and a value cache for each of `n_layer` attention layers, rows of `row_elems`
/// elements, with `window(layer)` positions kept (0 = the whole context).
pub fn kv_cache_decls(
    n_layer: u32,
    row_elems: u64,
    window: impl Fn(u32) -> u32,
) -> RVec<StateDecl> {
    (0..n_layer)
        .flat_map(|il| {
            [(StateKind::Keys, "cache_k"), (StateKind::Values, "cache_v")].map(|(kind, name)| {
                StateDecl {
                    name: format!("{name}_l{il}").into(),
                    layer: il,
                    kind,
                    row_elems,
                    window: window(il),
                    block: 1,
                }
            })
        })
        .collect()
}

/// One attention layer over the host's K/V cache.
pub struct AttentionBlock<'a> {
    /// Query projection `[n_embd, head_dim·n_head]`.
    pub wq: &'a WeightRef,
    /// Key projection.
    pub wk: &'a WeightRef,
    /// Value projection.
    pub wv: &'a WeightRef,
    /// Output projection.
    pub wo: &'a WeightRef,
    /// Per-head RMS norm of queries (QK-norm).
    pub q_norm: Option<&'a WeightRef>,
    /// Per-head RMS norm of keys.
    pub k_norm: Option<&'a WeightRef>,
    /// Biases added to the query, key and value projections (GLM), each `[width]`.
    pub qkv_bias: [Option<&'a WeightRef>; 3],
    /// RMS ε of the QK-norms.
    pub norm_eps: f32,
    /// Rotary embedding, if any.
    pub rope: Option<RopeParams>,
    /// Attention parameters.
    pub params: AttentionParams,
    /// State index of the key cache.
    pub k_cache: u32,
    /// State index of the value cache.
    pub v_cache: u32,
}

impl AttentionWeights {
    /// The attention block of layer `layer`, over the caches [`kv_cache_decls`]
    /// declares for it, its QK-norms with ε `norm_eps`.
    pub fn block(
        &self,
        layer: u32,
        params: AttentionParams,
        rope: Option<RopeParams>,
        norm_eps: f32,
    ) -> AttentionBlock<'_> {
        let (k_cache, v_cache) = kv_cache_indices(layer);
        AttentionBlock {
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            wo: &self.wo,
            q_norm: Some(&self.q_norm),
            k_norm: Some(&self.k_norm),
            qkv_bias: [None; 3],
            norm_eps,
            rope,
            params,
            k_cache,
            v_cache,
        }
    }
}

impl ExpertWeights {
    /// The experts' block with router parameters `route` and activation `glu` (no selection
    /// bias, no clamp).
    pub fn block(&self, route: RouterParams, glu: GluKind) -> MoeBlock<'_> {
        MoeBlock {
            router: &self.router,
            router_bias: None,
            route,
            gate: &self.gate,
            up: self.up.as_ref(),
            down: &self.down,
            glu,
            limit: 0.0,
        }
    }
}

/// The routed experts of one layer.
pub struct MoeBlock<'a> {
    /// Router `[n_embd, n_expert]`.
    pub router: &'a WeightRef,
    /// Selection bias `[n_expert]`, if the model has one.
    pub router_bias: Option<&'a WeightRef>,
    /// Router parameters.
    pub route: RouterParams,
    /// Gate stack, or the fused gate+up stack.
    pub gate: &'a WeightRef,
    /// Up stack (`None` when fused into `gate`).
    pub up: Option<&'a WeightRef>,
    /// Down stack.
    pub down: &'a WeightRef,
    /// Activation and clamp.
    pub glu: GluKind,
    /// SwiGLU clamp (0 = none).
    pub limit: f32,
}

/// The per-pass inputs every causal LM graph uses.
#[derive(Clone, Copy, Debug)]
pub struct LmInputs {
    /// i32 `[rows]` token ids.
    pub tokens: TensorId,
    /// i32 `[rows]` positions.
    pub positions: TensorId,
    /// i32 `[rows]` sequence slots.
    pub slots: TensorId,
    /// i32 `[n_outputs]` rows wanted.
    pub out_rows: TensorId,
}

/// A layer's place in the graph [`causal_lm`] builds.
#[derive(Clone, Copy, Debug)]
pub struct LayerAt<'a> {
    /// Layer index.
    pub index: u32,
    /// Whether it is the last layer (where only the wanted output rows go on).
    pub last: bool,
    /// The pass's inputs.
    pub inp: &'a LmInputs,
}

/// How the attention of a [`PreNormLayer`] runs.
#[derive(Clone, Copy, Debug)]
pub struct LayerSettings {
    /// Attention parameters.
    pub attn: AttentionParams,
    /// Rotary embedding, if any.
    pub rope: Option<RopeParams>,
    /// RMS ε of the layer's norms (pre-attention, QK, pre-FFN).
    pub eps: f32,
}

impl LayerSettings {
    /// GQA over the heads of `lm` (scale `1/sqrt(head_dim)`, no window) with the rotary embedding
    /// `rope` and ε of `lm`.
    pub fn new(lm: &LmHParams, rope: RopeParams) -> Self {
        LayerSettings {
            attn: lm.attn.gqa(),
            rope: Some(rope),
            eps: lm.eps,
        }
    }
}

/// The graph of a causal LM for `shape`: the batch inputs, the token embeddings, then `layer`
/// for each of `layers` in turn (its input the previous layer's output, the graph's current
/// layer set to its index), then the final norm and what `outputs` names.
pub fn causal_lm_with<L>(
    shape: BatchShape,
    globals: &LmGlobals,
    eps: f32,
    layers: &[L],
    outputs: LmOutputs,
    mut layer: impl FnMut(&mut GraphBuilder, LayerAt<'_>, &L, TensorId) -> Result<TensorId, PluginError>,
) -> Result<Graph, PluginError> {
    let mut g = GraphBuilder::new();
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let mut x = g.embed(globals, &inp)?;
    for (il, l) in layers.iter().enumerate() {
        g.set_layer(il as i32);
        let at = LayerAt {
            index: il as u32,
            last: il + 1 == layers.len(),
            inp: &inp,
        };
        x = layer(&mut g, at, l, x)?;
    }
    g.set_layer(-1);
    let norm = g.w(&globals.output_norm)?;
    let hidden = g.rms_norm("result_norm", x, Some(norm), eps)?;
    if outputs != LmOutputs::Hidden {
        let head = g.w(&globals.output)?;
        let logits = g.matmul("result_output", head, hidden)?;
        g.output("logits", logits);
    }
    if outputs != LmOutputs::Logits {
        g.output("hidden", hidden);
    }
    Ok(g.finish())
}

/// What a causal LM's graph ends in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LmOutputs {
    /// The output head: `logits` `[n_vocab, n_outputs]`.
    Logits,
    /// The final-norm rows, without the output head: `hidden` `[n_embd, n_outputs]` (a backbone
    /// whose rows a decision head reads).
    Hidden,
    /// Both `logits` and `hidden` (a generative model that may also serve a decision head).
    LogitsAndHidden,
}

/// [`causal_lm_with`] ending in the output head ([`LmOutputs::Logits`]).
pub fn causal_lm<L>(
    shape: BatchShape,
    globals: &LmGlobals,
    eps: f32,
    layers: &[L],
    layer: impl FnMut(&mut GraphBuilder, LayerAt<'_>, &L, TensorId) -> Result<TensorId, PluginError>,
) -> Result<Graph, PluginError> {
    causal_lm_with(shape, globals, eps, layers, LmOutputs::Logits, layer)
}

impl GraphBuilder {
    /// Declares the token, position, slot and output-row inputs.
    pub fn lm_inputs(&mut self, n_rows: u32, n_outputs: u32) -> Result<LmInputs, PluginError> {
        let r = u64::from(n_rows);
        Ok(LmInputs {
            tokens: self.input(BatchInput::Tokens, [r, 1, 1, 1])?,
            positions: self.input(BatchInput::Positions, [r, 1, 1, 1])?,
            slots: self.input(BatchInput::Slots, [r, 1, 1, 1])?,
            out_rows: self.input(BatchInput::OutputRows, [u64::from(n_outputs), 1, 1, 1])?,
        })
    }

    /// Declares a weight found by [`crate::weights::WeightTable`].
    pub fn w(&mut self, w: &WeightRef) -> Result<TensorId, PluginError> {
        self.weight(w.index, &w.name, w.dtype, w.ne)
    }

    /// Rows of a table (embedding lookup): `[n, ids]` f32, or i32 from an i32 table.
    pub fn get_rows(
        &mut self,
        name: &str,
        table: TensorId,
        ids: TensorId,
    ) -> Result<TensorId, PluginError> {
        let n = self.ne(table)[0];
        let k = self.ne(ids)[0];
        let dtype = match self.decl(table).dtype {
            DType::I32 => DType::I32,
            _ => DType::F32,
        };
        self.op(name, Op::GetRows, &[table, ids], dtype, [n, k, 1, 1])
    }

    /// `W·x` for a weight `[k, n]` and `x` `[k, rows...]`: `[n, rows]`.
    pub fn matmul(
        &mut self,
        name: &str,
        w: TensorId,
        x: TensorId,
    ) -> Result<TensorId, PluginError> {
        let wn = self.ne(w);
        let xn = self.ne(x);
        if wn[0] != xn[0] {
            return Err(PluginError::invalid(format!(
                "{name}: weight has {} inputs, x has {}",
                wn[0], xn[0]
            )));
        }
        self.op(
            name,
            Op::MatMul,
            &[w, x],
            DType::F32,
            [wn[1], xn[1] * xn[2] * xn[3], 1, 1],
        )
    }

    /// Same-shape (or single-row broadcast) element-wise op.
    fn binary(
        &mut self,
        name: &str,
        op: Op,
        a: TensorId,
        b: TensorId,
    ) -> Result<TensorId, PluginError> {
        let ne = self.ne(a);
        self.op(name, op, &[a, b], DType::F32, ne)
    }

    /// `a + b`.
    pub fn add(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, PluginError> {
        self.binary(name, Op::Add, a, b)
    }

    /// `a · b`.
    pub fn mul(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, PluginError> {
        self.binary(name, Op::Mul, a, b)
    }

    /// `s · x`.
    pub fn scale(&mut self, name: &str, x: TensorId, s: f32) -> Result<TensorId, PluginError> {
        let ne = self.ne(x);
        self.op(name, Op::Scale { s }, &[x], DType::F32, ne)
    }

    /// RMS norm over ne0, times `weight` when given.
    pub fn rms_norm(
        &mut self,
        name: &str,
        x: TensorId,
        weight: Option<TensorId>,
        eps: f32,
    ) -> Result<TensorId, PluginError> {
        let ne = self.ne(x);
        let srcs: Vec<TensorId> = std::iter::once(x).chain(weight).collect();
        self.op(name, Op::RmsNorm { eps }, &srcs, DType::F32, ne)
    }

    /// A gated linear unit of two same-shape tensors.
    pub fn glu(
        &mut self,
        name: &str,
        gate: TensorId,
        up: TensorId,
        kind: GluKind,
        limit: f32,
    ) -> Result<TensorId, PluginError> {
        let ne = self.ne(gate);
        self.op(name, Op::Glu { kind, limit }, &[gate, up], DType::F32, ne)
    }

    /// A gated FFN of `x` `[n_embd, rows]`: `down · (act(gate · x) ⊙ (up · x))`, its nodes named
    /// `{prefix}gate`, `{prefix}up`, `{prefix}swiglu` or `{prefix}geglu`, `{prefix}down`.
    pub fn glu_ffn(
        &mut self,
        prefix: &str,
        f: &GluFfnWeights,
        kind: GluKind,
        x: TensorId,
    ) -> Result<TensorId, PluginError> {
        let gate = self.w(&f.gate)?;
        let up = self.w(&f.up)?;
        let down = self.w(&f.down)?;
        let a = self.matmul(&format!("{prefix}gate"), gate, x)?;
        let b = self.matmul(&format!("{prefix}up"), up, x)?;
        let act = match kind {
            GluKind::SwiGlu => "swiglu",
            GluKind::GeGlu => "geglu",
        };
        let h = self.glu(&format!("{prefix}{act}"), a, b, kind, 0.0)?;
        self.matmul(&format!("{prefix}down"), down, h)
    }

    /// One pre-norm layer of `x`: `h = x + attention(rms_norm(x))` (nodes `attn_norm`,
    /// `ffn_inp`), then `h + ffn(rms_norm(h))` (`ffn_norm`, `l_out`). In the last layer only the
    /// wanted output rows go on after attention.
    pub fn pre_norm_layer<F>(
        &mut self,
        l: &PreNormLayer<F>,
        at: LayerAt<'_>,
        s: LayerSettings,
        x: TensorId,
        ffn: impl FnOnce(&mut GraphBuilder, &F, TensorId) -> Result<TensorId, PluginError>,
    ) -> Result<TensorId, PluginError> {
        let an = self.w(&l.attn_norm)?;
        let cur = self.rms_norm("attn_norm", x, Some(an), s.eps)?;
        let blk = l.attn.block(at.index, s.attn, s.rope, s.eps);
        let mut cur = self.attention_block(&blk, cur, at.inp)?;
        let mut x = x;
        if at.last {
            cur = self.select_outputs(cur, at.inp)?;
            x = self.select_outputs(x, at.inp)?;
        }
        let ffn_inp = self.add("ffn_inp", cur, x)?;
        let fnorm = self.w(&l.ffn_norm)?;
        let cur = self.rms_norm("ffn_norm", ffn_inp, Some(fnorm), s.eps)?;
        let cur = ffn(self, &l.ffn, cur)?;
        self.add("l_out", cur, ffn_inp)
    }

    /// Attention over the host's cache, from the normed input `x` `[n_embd, rows]` to the output
    /// projection's result `[n_embd, rows]`. Node names follow llama.cpp (`Qcur`, `Kcur`, `kqv_out`).
    pub fn attention_block(
        &mut self,
        blk: &AttentionBlock<'_>,
        x: TensorId,
        inp: &LmInputs,
    ) -> Result<TensorId, PluginError> {
        let p = blk.params;
        let rows = self.ne(x)[1];
        let (nh, nkv) = (u64::from(p.n_head), u64::from(p.n_head_kv));
        let (dk, dv) = (u64::from(p.dk), u64::from(p.dv));
        let wq = self.w(blk.wq)?;
        let wk = self.w(blk.wk)?;
        let wv = self.w(blk.wv)?;
        let mut q = self.matmul("Qcur", wq, x)?;
        let mut k = self.matmul("Kcur", wk, x)?;
        let mut v = self.matmul("Vcur", wv, x)?;
        // The biases after all three products, so that a kernel plugin still sees the products
        // of one input side by side.
        for ((t, b), name) in [&mut q, &mut k, &mut v]
            .into_iter()
            .zip(blk.qkv_bias)
            .zip(["Qcur_b", "Kcur_b", "Vcur_b"])
        {
            if let Some(b) = b {
                let b = self.w(b)?;
                *t = self.add(name, *t, b)?;
            }
        }
        let mut q = self.reshape(q, [dk, nh, rows, 1])?;
        let mut k = self.reshape(k, [dk, nkv, rows, 1])?;
        // Each of q and k is normed and then rotated, in that order, so that a kernel plugin can
        // take the two calls (and k's cache store after them) as one.
        if let Some(n) = blk.q_norm {
            let w = self.w(n)?;
            q = self.rms_norm("Qcur_normed", q, Some(w), blk.norm_eps)?;
        }
        if let Some(rope) = blk.rope {
            q = self.op(
                "Qcur_rope",
                Op::Rope(rope),
                &[q, inp.positions],
                DType::F32,
                [dk, nh, rows, 1],
            )?;
        }
        if let Some(n) = blk.k_norm {
            let w = self.w(n)?;
            k = self.rms_norm("Kcur_normed", k, Some(w), blk.norm_eps)?;
        }
        if let Some(rope) = blk.rope {
            k = self.op(
                "Kcur_rope",
                Op::Rope(rope),
                &[k, inp.positions],
                DType::F32,
                [dk, nkv, rows, 1],
            )?;
        }
        let k2 = self.reshape(k, [dk * nkv, rows, 1, 1])?;
        let kc = self.state(blk.k_cache, "cache_k");
        let vc = self.state(blk.v_cache, "cache_v");
        // A quantized cache stores rows rotated as the attention reading it expects.
        let (kst, vst) = (
            Op::CacheStore { rot: p.rot_k },
            Op::CacheStore { rot: p.rot_v },
        );
        self.op_into(kst, &[k2, kc, inp.slots, inp.positions], kc)?;
        self.op_into(vst, &[v, vc, inp.slots, inp.positions], vc)?;
        let a = self.op(
            "kqv_out",
            Op::Attention(p),
            &[q, kc, vc, inp.slots, inp.positions],
            DType::F32,
            [dv, nh, rows, 1],
        )?;
        let a = self.reshape(a, [dv * nh, rows, 1, 1])?;
        let wo = self.w(blk.wo)?;
        self.matmul("attn_out", wo, a)
    }

    /// Routed experts of the normed input `x` `[n_embd, rows]`: `[n_embd, rows]`.
    pub fn moe_block(&mut self, blk: &MoeBlock<'_>, x: TensorId) -> Result<TensorId, PluginError> {
        let route = self.moe_route(blk, x)?;
        self.moe_experts(blk, x, route)
    }

    /// The router's choice for `x`: expert ids and their weights, `[k, rows]` each
    /// (`ffn_moe_topk`, `ffn_moe_weights`). Calls that do not need the experts' sum (a shared
    /// expert) may come between this and [`GraphBuilder::moe_experts`]: with experts on the
    /// host they run on the card while the host computes.
    pub fn moe_route(
        &mut self,
        blk: &MoeBlock<'_>,
        x: TensorId,
    ) -> Result<(TensorId, TensorId), PluginError> {
        let rows = self.ne(x)[1];
        let k = u64::from(blk.route.k);
        let router = self.w(blk.router)?;
        let logits = self.matmul("ffn_moe_logits", router, x)?;
        let mut sel = vec![logits];
        if let Some(b) = blk.router_bias {
            sel.push(self.w(b)?);
        }
        let ids = self.op(
            "ffn_moe_topk",
            Op::RouterTopK(blk.route),
            &sel,
            DType::I32,
            [k, rows, 1, 1],
        )?;
        let weights = self.op(
            "ffn_moe_weights",
            Op::RouterWeights(blk.route),
            &[logits, ids],
            DType::F32,
            [k, rows, 1, 1],
        )?;
        Ok((ids, weights))
    }

    /// The routed experts' weighted sum for `x` and the router's choice `(ids, weights)`
    /// (`ffn_moe_out`).
    pub fn moe_experts(
        &mut self,
        blk: &MoeBlock<'_>,
        x: TensorId,
        (ids, weights): (TensorId, TensorId),
    ) -> Result<TensorId, PluginError> {
        let [n_embd, rows, _, _] = self.ne(x);
        let gate = self.w(blk.gate)?;
        let down = self.w(blk.down)?;
        let n_ff = blk.down.ne[0];
        let params = MoeParams {
            n_expert: blk.route.n_expert,
            k: blk.route.k,
            n_ff: n_ff as u32,
            glu: blk.glu,
            limit: blk.limit,
            fused_gate_up: blk.up.is_none(),
            expert_map: false,
        };
        let mut srcs = vec![x, ids, weights, gate];
        if let Some(up) = blk.up {
            srcs.push(self.w(up)?);
        }
        srcs.push(down);
        self.op(
            "ffn_moe_out",
            Op::MoeExperts(params),
            &srcs,
            DType::F32,
            [n_embd, rows, 1, 1],
        )
    }

    /// The token embeddings of the batch's tokens: `[n_embd, rows]` (`inp_embd`).
    pub fn embed(&mut self, globals: &LmGlobals, inp: &LmInputs) -> Result<TensorId, PluginError> {
        let table = self.w(&globals.tok_embd)?;
        self.get_rows("inp_embd", table, inp.tokens)
    }

    /// The final RMS norm of `x` and the output head: logits `[n_vocab, rows]` (`result_norm`,
    /// [`crate::graph::FINAL_NORM`], which the host reads as embeddings; `result_output`), outside
    /// any layer.
    pub fn lm_head(
        &mut self,
        globals: &LmGlobals,
        x: TensorId,
        eps: f32,
    ) -> Result<TensorId, PluginError> {
        self.set_layer(-1);
        let norm = self.w(&globals.output_norm)?;
        let x = self.rms_norm(crate::graph::FINAL_NORM, x, Some(norm), eps)?;
        let head = self.w(&globals.output)?;
        self.matmul("result_output", head, x)
    }

    /// Keeps only the wanted output rows of `x` `[n, rows]` (skipped when every row is wanted).
    pub fn select_outputs(&mut self, x: TensorId, inp: &LmInputs) -> Result<TensorId, PluginError> {
        if self.ne(inp.out_rows)[0] == self.ne(x)[1] {
            return Ok(x);
        }
        self.get_rows("out_rows", x, inp.out_rows)
    }
}

/// `f` applied to every element of `x`.
pub fn unary(
    g: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    f: UnaryFn,
) -> Result<TensorId, PluginError> {
    let ne = g.ne(x);
    g.op(name, Op::Unary { f }, &[x], DType::F32, ne)
}

/// A contiguous copy of `[ne0, heads, rows]` f32 elements of `base`, heads `head_stride` and
/// rows `row_stride` elements apart, starting `offset` elements in (splits interleaved
/// projections).
pub fn slice(
    g: &mut GraphBuilder,
    name: &str,
    base: TensorId,
    ne: [u64; 4],
    (head_stride, row_stride): (u64, u64),
    offset: u64,
) -> Result<TensorId, PluginError> {
    const F: u64 = 4;
    let nb = [F, head_stride * F, row_stride * F, row_stride * F * ne[2]];
    let v = g.view(base, name, ne, nb, offset * F);
    g.op(name, Op::Copy, &[v], DType::F32, ne)
}
