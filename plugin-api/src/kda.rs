//! Kimi Delta Attention (KDA) layers, for every architecture that has them (`kimi-linear`,
//! `solar-open2`, GLM-5.3's `glm5-next`): their sizes read from the file, their weights, their
//! per-sequence state and their part of the graph.
//!
//! A KDA layer of `n_head` heads of `head_dim` (`d = n_head·head_dim`), for the normed input `x`:
//!
//! ```text
//! q, k, v = silu(conv_q(attn_q·x)), silu(conv_k(attn_k·x)), silu(conv_v(attn_v·x))   causal, `taps`
//! q, k    = L2-normalised per head
//! f       = ssm_f_b·(ssm_f_a·x) + ssm_dt.bias                                       [head_dim, n_head]
//! g       = A·softplus(f)                      unbounded (A = ssm_a = −e^{A_log}, one per head)
//!         | L·σ(−A·f)                          bounded, L = kda.gate_lower_bound < 0
//! β       = s·σ(ssm_beta·x)                    s = 2 where negative eigenvalues are allowed
//! o       = delta rule (q, k, v, log decay g per (head, dim), β), scale 1/√head_dim
//! out     = attn_output·(rms_norm(o)·ssm_norm ⊙ σ(ssm_g_b·(ssm_g_a·x)))
//! ```
//!
//! The tensor names are those llama.cpp's converter writes for Kimi-Linear (`ssm_conv1d_{q,k,v}`
//! `[taps, 1, d]`, `ssm_a` `[1, n_head]` or `[n_head]`, holding −e^{A_log}: llama.cpp b11434
//! declares `[1, n_head]` for Kimi-Linear and `[n_head]` for GLM-5.3, and refuses the other;
//! [`SsmAShape`] says which one an architecture writes).

use crate::builders::unary;
use crate::graph::{GraphBuilder, TensorId};
use crate::hparams::ArchKeys;
use crate::model::{StateDecl, StateKind, WeightClass as C};
use crate::op::{DeltaRuleParams, Op, UnaryFn};
use crate::weights::{LayerWeights, WeightRef};
use crate::{DType, PluginError};

/// The forget gate's form.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaGate {
    /// `A·softplus(f + dt)` (Kimi-Linear, Solar-Open2).
    Unbounded,
    /// `lower·σ(−A·(f + dt))`, `lower` < 0 (GLM-5.3's `kda.gate_lower_bound`).
    Bounded {
        /// The most negative log decay of one row.
        lower: f32,
    },
}

/// ε of the q/k L2 norms, `x/√(Σx² + ε)`: 1e-6 in the reference implementations (FLA, which
/// transformers' Kimi-Linear and GLM-5.3 follow, and Solar-Open2). llama.cpp's kimi-linear uses
/// the RMS ε there instead, which moves unit-scale logits by about 1e-6.
pub const L2_EPS: f32 = 1e-6;

/// The sizes and options of an architecture's KDA layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaShape {
    /// Heads (keys, values and outputs alike).
    pub n_head: u32,
    /// Elements per head (`kda.head_dim`).
    pub head_dim: u32,
    /// Convolution taps (`ssm.conv_kernel`).
    pub taps: u32,
    /// ε of the output RMS norm (the model's RMS ε).
    pub eps: f32,
    /// ε added to the squared norm of q and k ([`L2_EPS`]).
    pub l2_eps: f32,
    /// The forget gate.
    pub gate: KdaGate,
    /// β's factor: 2 where negative eigenvalues are allowed, else 1.
    pub beta_scale: f32,
}

impl KdaShape {
    /// Reads `kda.head_dim`, `ssm.conv_kernel` and `kda.gate_lower_bound` (absent: unbounded),
    /// with `n_head` heads, checked against the first KDA layer's `ssm_norm` and
    /// `ssm_conv1d_q`. `eps` and `beta_scale` come from the architecture.
    pub fn read(
        keys: &ArchKeys<'_>,
        n_head: u32,
        eps: f32,
        beta_scale: f32,
    ) -> Result<Self, PluginError> {
        let head_dim = keys.positive("kda.head_dim")?;
        keys.carried_by("kda.head_dim", head_dim, "ssm_norm.weight", 0)?;
        let taps = keys.u32("ssm.conv_kernel")?;
        keys.check(taps >= 2, "ssm.conv_kernel", || format!("{taps} taps"))?;
        keys.carried_by("ssm.conv_kernel", taps, "ssm_conv1d_q.weight", 0)?;
        keys.check(
            n_head > 0 && u64::from(n_head) * u64::from(head_dim) <= u64::from(u32::MAX),
            "attention.head_count",
            || format!("{n_head} KDA heads of {head_dim}"),
        )?;
        let gate = match keys.get("kda.gate_lower_bound") {
            None => KdaGate::Unbounded,
            Some(_) => {
                let lower = keys.f32("kda.gate_lower_bound")?;
                keys.check(
                    lower < 0.0 && lower.is_finite(),
                    "kda.gate_lower_bound",
                    || format!("{lower} (a log decay bound must be negative)"),
                )?;
                KdaGate::Bounded { lower }
            }
        };
        Ok(KdaShape {
            n_head,
            head_dim,
            taps,
            eps,
            l2_eps: L2_EPS,
            gate,
            beta_scale,
        })
    }

    /// `n_head · head_dim`: the width of q, k, v and the output.
    pub fn width(&self) -> u64 {
        u64::from(self.n_head) * u64::from(self.head_dim)
    }

    /// The recurrent state of one sequence, f32 elements (`head_dim² · n_head`; 4 MiB at 64
    /// heads of 128).
    pub fn state_elems(&self) -> u64 {
        u64::from(self.head_dim) * self.width()
    }
}

/// The shape of `ssm_a` an architecture's files have (llama.cpp's declaration for it): the one
/// `bloomery synth` writes. Loading accepts either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SsmAShape {
    /// `[1, n_head]` (Kimi-Linear's; Solar-Open2, which llama.cpp lacks, keeps it).
    Row,
    /// `[n_head]` (GLM-5.3's).
    Flat,
}

/// One KDA layer's weights.
pub struct KdaWeights {
    /// Query, key and value projections `[n_embd, d]`.
    pub qkv: [WeightRef; 3],
    /// Their depthwise convolutions `[taps, 1, d]`.
    pub conv: [WeightRef; 3],
    /// Forget gate, low rank: `[n_embd, head_dim]` then `[head_dim, d]`.
    pub f_a: WeightRef,
    /// See `f_a`.
    pub f_b: WeightRef,
    /// Forget gate bias `[d]`.
    pub dt_bias: WeightRef,
    /// `−e^{A_log}` per head.
    pub a: WeightRef,
    /// β projection `[n_embd, n_head]`.
    pub beta: WeightRef,
    /// Output gate, low rank: `[n_embd, head_dim]` then `[head_dim, d]`.
    pub g_a: WeightRef,
    /// See `g_a`.
    pub g_b: WeightRef,
    /// Output RMS norm `[head_dim]`.
    pub norm: WeightRef,
    /// Output projection `[d, n_embd]`.
    pub out: WeightRef,
}

impl KdaWeights {
    /// Declares layer `l`'s KDA weights (`ssm_a` as the file has it, `[1, n_head]` or
    /// `[n_head]`; a synthetic file gets `a_shape`); keys narrower than the values (a
    /// `num_kv_heads` variant) are refused by name.
    pub fn declare(
        l: &mut LayerWeights<'_, '_>,
        s: &KdaShape,
        n_embd: u64,
        a_shape: SsmAShape,
    ) -> Result<Self, PluginError> {
        let (e, d, hd, nh) = (
            n_embd,
            s.width(),
            u64::from(s.head_dim),
            u64::from(s.n_head),
        );
        let (a, r) = (C::Attention, C::Recurrent);
        let taps = u64::from(s.taps);
        if let Some(k) = l.found_shape("attn_k.weight") {
            if k[1] < d {
                return Err(PluginError::unsupported(
                    format!(
                        "layer {}: KDA keys {} wide for values {d} wide (num_kv_heads below \
                         num_heads, whose head repeat order differs between implementations)",
                        l.index(),
                        k[1]
                    ),
                    &["KDA with as many key heads as value heads"],
                ));
            }
        }
        let qkv = [
            l.weight("attn_q", a, &[e, d])?,
            l.weight("attn_k", a, &[e, d])?,
            l.weight("attn_v", a, &[e, d])?,
        ];
        let conv = [
            l.weight("ssm_conv1d_q", r, &[taps, 1, d])?,
            l.weight("ssm_conv1d_k", r, &[taps, 1, d])?,
            l.weight("ssm_conv1d_v", r, &[taps, 1, d])?,
        ];
        Ok(KdaWeights {
            qkv,
            conv,
            f_a: l.weight("ssm_f_a", r, &[e, hd])?,
            f_b: l.weight("ssm_f_b", r, &[hd, d])?,
            dt_bias: l.tensor("ssm_dt.bias", r, &[d])?,
            a: match a_shape {
                SsmAShape::Row => l.tensor_of_shapes("ssm_a", r, &[&[1, nh], &[nh]])?,
                SsmAShape::Flat => l.tensor_of_shapes("ssm_a", r, &[&[nh], &[1, nh]])?,
            },
            beta: l.weight("ssm_beta", r, &[e, nh])?,
            g_a: l.weight("ssm_g_a", a, &[e, hd])?,
            g_b: l.weight("ssm_g_b", a, &[hd, d])?,
            norm: l.norm("ssm_norm", hd)?,
            out: l.weight("attn_output", a, &[d, e])?,
        })
    }
}

/// Where one KDA layer's state lives: indices into the declared state list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdaState {
    /// The last `taps − 1` inputs of the q, k and v convolutions.
    pub conv: [u32; 3],
    /// The `[head_dim, head_dim]` matrix of every head.
    pub recurrent: u32,
}

impl KdaState {
    /// Appends layer `il`'s state buffers to `decls`: three convolution histories, then the
    /// recurrent matrices.
    pub fn declare(decls: &mut Vec<StateDecl>, il: u32, s: &KdaShape) -> Self {
        let mut add = |name: String, kind: StateKind, row_elems: u64| {
            decls.push(StateDecl {
                name: name.into(),
                layer: il,
                kind,
                row_elems,
                window: 0,
                block: 1,
            });
            decls.len() as u32 - 1
        };
        let conv = s.width() * u64::from(s.taps - 1);
        KdaState {
            conv: ["q", "k", "v"].map(|x| add(format!("conv_{x}_l{il}"), StateKind::Conv, conv)),
            recurrent: add(
                format!("ssm_state_l{il}"),
                StateKind::Recurrent,
                s.state_elems(),
            ),
        }
    }
}

/// The batch inputs a KDA layer reads.
#[derive(Clone, Copy, Debug)]
pub struct KdaInputs {
    /// i32 `[rows]` sequence slots.
    pub slots: TensorId,
    /// i32 `[rows]` positions.
    pub positions: TensorId,
    /// A verify pass ([`crate::graph::GraphKind::Verify`]): the convolutions and the delta rule
    /// also write every row's state into their state's row states.
    pub verify: bool,
}

/// `[a, b, rows]` f32 `x` transposed to `[b, a, rows]` (a strided copy).
fn swap01(g: &mut GraphBuilder, name: &str, x: TensorId) -> Result<TensorId, PluginError> {
    const F: u64 = 4;
    let [a, b, rows, _] = g.ne(x);
    let v = g.view(
        x,
        name,
        [b, a, rows, 1],
        [a * F, F, a * b * F, a * b * rows * F],
        0,
    );
    g.op(name, Op::Copy, &[v], DType::F32, [b, a, rows, 1])
}

/// The forget gate, log decays `[head_dim, n_head, rows]`. `ssm_a` scales each head: the gate is
/// transposed to `[n_head, head_dim, rows]` so that it broadcasts as one row, then back.
fn forget_gate(
    g: &mut GraphBuilder,
    s: &KdaShape,
    w: &KdaWeights,
    x: TensorId,
) -> Result<TensorId, PluginError> {
    let rows = g.ne(x)[1];
    let (hd, nh) = (u64::from(s.head_dim), u64::from(s.n_head));
    let fa = g.w(&w.f_a)?;
    let f = g.matmul("kda_f_a", fa, x)?;
    let fb = g.w(&w.f_b)?;
    let f = g.matmul("kda_f_b", fb, f)?;
    let dt = g.w(&w.dt_bias)?;
    let f = g.add("kda_f_biased", f, dt)?;
    let a = g.w(&w.a)?;
    let a = g.reshape(a, [nh, 1, 1, 1])?;
    let f = g.reshape(f, [hd, nh, rows, 1])?;
    let gate = match s.gate {
        KdaGate::Unbounded => {
            let f = unary(g, "kda_f_softplus", f, UnaryFn::Softplus)?;
            let f = swap01(g, "kda_f_by_head", f)?;
            g.mul("kda_g1_by_head", f, a)?
        }
        KdaGate::Bounded { lower } => {
            let f = swap01(g, "kda_f_by_head", f)?;
            let f = g.mul("kda_f_scaled", f, a)?;
            let f = g.scale("kda_f_negated", f, -1.0)?;
            let f = unary(g, "kda_f_sigmoid", f, UnaryFn::Sigmoid)?;
            g.scale("kda_g1_by_head", f, lower)?
        }
    };
    swap01(g, "kda_g1", gate)
}

/// q, k or v: projection, causal convolution with its state, SiLU, `[head_dim, n_head, rows]`.
fn conv_branch(
    g: &mut GraphBuilder,
    s: &KdaShape,
    (proj, conv, state): (&WeightRef, &WeightRef, u32),
    x: TensorId,
    inp: &KdaInputs,
    name: &str,
) -> Result<TensorId, PluginError> {
    let rows = g.ne(x)[1];
    let d = s.width();
    let wp = g.w(proj)?;
    let y = g.matmul(&format!("{name}cur"), wp, x)?;
    let wc = g.w(conv)?;
    let wc = g.reshape(wc, [u64::from(s.taps), d, 1, 1])?;
    let st = g.state(state, &format!("conv_state_{name}"));
    let mut srcs = vec![y, wc, st, inp.slots, inp.positions];
    if inp.verify {
        let width = d * u64::from(s.taps - 1);
        srcs.push(g.row_states(state, &format!("conv_state_{name}_rows"), width, rows)?);
    }
    let y = g.op(
        &format!("kda_{name}_conv"),
        Op::ConvCausal {
            taps: s.taps,
            dilation: 1,
        },
        &srcs,
        DType::F32,
        [d, rows, 1, 1],
    )?;
    let y = unary(g, &format!("kda_{name}_silu"), y, UnaryFn::Silu)?;
    g.reshape(y, [u64::from(s.head_dim), u64::from(s.n_head), rows, 1])
}

/// A KDA layer of the normed input `x` `[n_embd, rows]`: `[n_embd, rows]` (`kda_out`), reading
/// and updating `state` for each row's slot.
pub fn kda_layer(
    g: &mut GraphBuilder,
    s: &KdaShape,
    w: &KdaWeights,
    state: &KdaState,
    x: TensorId,
    inp: &KdaInputs,
) -> Result<TensorId, PluginError> {
    let rows = g.ne(x)[1];
    let (hd, nh) = (u64::from(s.head_dim), u64::from(s.n_head));
    let mut qkv = Vec::with_capacity(3);
    for (i, name) in ["q", "k", "v"].into_iter().enumerate() {
        let parts = (&w.qkv[i], &w.conv[i], state.conv[i]);
        let y = conv_branch(g, s, parts, x, inp, name)?;
        qkv.push(if i < 2 {
            let norm = Op::L2Norm { eps: s.l2_eps };
            g.op(
                &format!("kda_{name}_norm"),
                norm,
                &[y],
                DType::F32,
                [hd, nh, rows, 1],
            )?
        } else {
            y
        });
    }
    let gate = forget_gate(g, s, w, x)?;
    let wb = g.w(&w.beta)?;
    let beta = g.matmul("kda_beta", wb, x)?;
    let beta = unary(g, "kda_beta_sigmoid", beta, UnaryFn::Sigmoid)?;
    let ss = g.state(state.recurrent, "ssm_state");
    let params = DeltaRuleParams {
        n_head_k: s.n_head,
        n_head_v: s.n_head,
        dk: s.head_dim,
        dv: s.head_dim,
        scale: 1.0 / (s.head_dim as f32).sqrt(),
        per_dim_gate: true,
        beta_scale: s.beta_scale,
    };
    let mut srcs = vec![
        qkv[0],
        qkv[1],
        qkv[2],
        gate,
        beta,
        ss,
        inp.slots,
        inp.positions,
    ];
    if inp.verify {
        let rs = g.row_states(state.recurrent, "ssm_state_rows", s.state_elems(), rows)?;
        srcs.push(rs);
    }
    let o = g.op(
        "kda_delta_out",
        Op::DeltaRule(params),
        &srcs,
        DType::F32,
        [hd, nh, rows, 1],
    )?;
    let nw = g.w(&w.norm)?;
    let o = g.rms_norm("kda_normed", o, Some(nw), s.eps)?;
    let ga = g.w(&w.g_a)?;
    let g2 = g.matmul("kda_g_a", ga, x)?;
    let gb = g.w(&w.g_b)?;
    let g2 = g.matmul("kda_g2", gb, g2)?;
    let g2 = g.reshape(g2, [hd, nh, rows, 1])?;
    let g2 = unary(g, "kda_g2_sigmoid", g2, UnaryFn::Sigmoid)?;
    let o = g.mul("kda_gated", o, g2)?;
    let o = g.reshape(o, [hd * nh, rows, 1, 1])?;
    let wo = g.w(&w.out)?;
    g.matmul("kda_out", wo, o)
}
