//! A decision head run by the host beside its backbone: Clef's joint schema head, read from the
//! `clef` file that carries it or from a `joint_head.safetensors` beside a `qwen35` file
//! ([`head_file`]), and run as a graph of ABI ops on the device [`placement`] chooses: the
//! backbone's by default, or the CPU beside a backbone on the card. Every kernel plugin with the
//! ops (LayerNorm, Softmax, AttentionDense, SpanMean, ...: the CPU plugins and the CUDA bundles)
//! runs it; a device without them is refused at load, naming what it lacks.
//!
//! The head reads one prompt's final-norm rows ([`crate::LoadedModel::forward_hidden`]), the
//! prompt's token ids and its question and option spans, and gives one score per option; several
//! prompts' requests run stacked in one graph ([`DecisionHead::scores_batch`]).

pub mod head_file;
pub mod placement;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use bloomery_devices::bytes::{f32_bytes, i32_bytes};
use bloomery_devices::{Buffer, Device};
use bloomery_plugin_api::decision::graph::HEAD_INPUTS;
use bloomery_plugin_api::decision::graph::{self as head_graph, HeadInput, HeadModel, HeadShape};
use bloomery_plugin_api::decision::weights::{declare, HeadWeights};
use bloomery_plugin_api::decision::HeadHParams;
use bloomery_plugin_api::graph::Graph;
use bloomery_plugin_api::graph::{BatchShape, GraphKind};
use bloomery_plugin_api::hparams::ArchKeys;
use bloomery_plugin_api::op::OpSupport;
use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::weights::{WeightRef, WeightTable};
use bloomery_plugin_api::DType;

use crate::executor::{ArenaSource, BatchInputs, Bindings, Executor};
use crate::model::LoadedModel;
use crate::support::{missing_kernels, MissingKernel};
use crate::view::file_view;
use placement::HeadHome;

/// Why a decision head could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    /// The head's file, keys or tensors are not a head this build runs.
    #[error("{source_name}: {message}")]
    Load {
        /// The file or form the head came from.
        source_name: String,
        /// What is wrong, naming the key or tensor.
        message: String,
    },
    /// A request's layout does not fit the head (spans outside the prompt, an empty span).
    #[error("decision head: {0}")]
    Layout(String),
    /// Preparing or running the head's graph failed.
    #[error("decision head: {0}")]
    Exec(#[from] crate::ExecError),
    /// The device failed.
    #[error("decision head: {context}: {message}")]
    Device {
        /// What was being done.
        context: String,
        /// The device's error.
        message: String,
    },
}

fn device_err(
    context: &str,
) -> impl FnOnce(bloomery_plugin_api::PluginError) -> DecisionError + '_ {
    move |e| DecisionError::Device {
        context: context.to_owned(),
        message: e.to_string(),
    }
}

/// A question's span of prompt rows and its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuestionSpan {
    /// Type index: noul 0, choice 1, score 2 (rows of `token_types.weight`).
    pub kind: u32,
    /// First row.
    pub start: u32,
    /// One past the last row.
    pub end: u32,
}

/// An option's span of prompt rows and the question it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionSpan {
    /// Index of its question.
    pub question: u32,
    /// First row.
    pub start: u32,
    /// One past the last row.
    pub end: u32,
}

/// What the head reads for one prompt.
#[derive(Clone, Copy, Debug)]
pub struct HeadRequest<'a> {
    /// The backbone's final-norm rows, `n_embd` per prompt row.
    pub hidden: &'a [f32],
    /// The prompt's token ids.
    pub tokens: &'a [i32],
    /// Question spans, in prompt order.
    pub questions: &'a [QuestionSpan],
    /// Option spans, in prompt order (each question's options after it).
    pub options: &'a [OptionSpan],
}

/// Head graphs kept prepared (one per list of requests' counts of rows, questions and options).
const MAX_EXECUTORS: usize = 4;

/// A prepared head graph with the buffer its per-request inputs are written to.
struct Prepared {
    exec: Executor,
    inputs: Buffer,
    /// Each input's offset in `inputs`.
    offsets: Vec<u64>,
    tick: u64,
}

/// A loaded decision head.
pub struct DecisionHead {
    /// Sizes.
    pub hp: HeadHParams,
    weights: HeadWeights,
    scales: [f32; 3],
    /// The backbone's output head, bound after the head's weights.
    output: WeightRef,
    /// The head's weights then the output head, resolved on `device`.
    bound: Vec<TensorRef>,
    /// The head's prepared graphs (dropped before the buffers and device they use).
    prepared: Mutex<(HashMap<Vec<HeadShape>, Prepared>, u64)>,
    /// Where the head's weights were uploaded (the safetensors form).
    _weights_buffer: Option<Buffer>,
    /// The device the head runs on.
    home: HeadHome,
    /// Where the head came from, for messages.
    pub source_name: String,
}

impl DecisionHead {
    /// Whether the model's file declares a decision head (`{arch}.decision.type`), as
    /// [`DecisionHead::from_model`] reads it.
    pub fn declared_in(model: &LoadedModel) -> bool {
        let key = format!("{}.decision.type", model.spec.architecture);
        model.file.metadata().get(&key).is_some()
    }

    /// The head in the model's own file (`{arch}.decision.*` keys), run on `home`: `None` when
    /// the file has none. The weights are the model's, as its plugin declared them, resolved on
    /// `home`'s device.
    pub fn from_model(
        model: &LoadedModel,
        home: HeadHome,
    ) -> Result<Option<DecisionHead>, DecisionError> {
        let view = file_view(&model.file);
        let arch = model.spec.architecture.to_string();
        let source_name = format!("{arch} model file");
        let load = |message: String| DecisionError::Load {
            source_name: source_name.clone(),
            message,
        };
        let keys = ArchKeys::new(&view, &arch);
        let Some(hp) =
            HeadHParams::read(&keys, model.spec.hparams.n_embd).map_err(|e| load(e.to_string()))?
        else {
            return Ok(None);
        };
        let mut table = WeightTable::new(&view);
        let weights = declare(&mut table, &hp).map_err(|e| load(e.to_string()))?;
        let mut bound = Vec::new();
        for d in table.decls() {
            bound.push(home.weight(model, d.name.as_str())?.ok_or_else(|| {
                load(format!(
                    "tensor `{}` is not a weight of the loaded model",
                    d.name
                ))
            })?);
        }
        let scales = read_scales(&home.device, &bound[weights.scales.index as usize])?;
        let head =
            DecisionHead::assemble(model, home, hp, weights, scales, bound, None, source_name)?;
        Ok(Some(head))
    }

    /// Adds the backbone's output head to `bound` and wraps the rest; refuses a device that lacks
    /// a kernel of the head's graph, naming each.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        model: &LoadedModel,
        home: HeadHome,
        hp: HeadHParams,
        weights: HeadWeights,
        scales: [f32; 3],
        mut bound: Vec<TensorRef>,
        buffer: Option<Buffer>,
        source_name: String,
    ) -> Result<DecisionHead, DecisionError> {
        let name = ["output.weight", "token_embd.weight"]
            .into_iter()
            .find(|n| model.weight_ref(n).is_some())
            .ok_or_else(|| DecisionError::Load {
                source_name: source_name.clone(),
                message: "the backbone has no output head to read option rows from".into(),
            })?;
        let r = home
            .weight(model, name)?
            .ok_or_else(|| DecisionError::Load {
                source_name: source_name.clone(),
                message: format!("no `{name}`"),
            })?;
        if r.ne[0] != u64::from(hp.n_embd) {
            return Err(DecisionError::Load {
                source_name,
                message: format!(
                    "the head reads rows of {} values, the backbone's `{name}` has {}",
                    hp.n_embd, r.ne[0]
                ),
            });
        }
        let output = WeightRef {
            index: bound.len() as u32,
            name: name.to_owned(),
            dtype: r.dtype,
            ne: r.ne,
        };
        bound.push(r);
        let head = DecisionHead {
            hp,
            weights,
            scales,
            output,
            bound,
            prepared: Mutex::new((HashMap::new(), 0)),
            _weights_buffer: buffer,
            home,
            source_name,
        };
        let missing = head.missing_kernels(&head.home.device.capabilities)?;
        if !missing.is_empty() {
            let list: Vec<String> = missing.iter().map(|m| m.to_string()).collect();
            return Err(DecisionError::Load {
                source_name: head.source_name.clone(),
                message: format!(
                    "the decision head's device ({}) lacks {}",
                    head.home.device.plugin,
                    list.join(", ")
                ),
            });
        }
        Ok(head)
    }

    /// The kernel plugin the head runs on.
    pub fn device_plugin(&self) -> &str {
        &self.home.device.plugin
    }

    /// The `(op, dtype)` pairs of the head's graph that `supported` lacks (none: a device with
    /// these capabilities runs the head).
    pub fn missing_kernels(
        &self,
        supported: &[OpSupport],
    ) -> Result<Vec<MissingKernel>, DecisionError> {
        // Any counts give the same ops: the graph's shape depends on them, its nodes do not;
        // one request and two stacked ones cover both forms of the graph.
        let probe = HeadShape {
            n_rows: 2,
            n_questions: 1,
            n_options: 2,
        };
        let mut missing = missing_kernels(&self.graph(&[probe])?, supported);
        for m in missing_kernels(&self.graph(&[probe, probe])?, supported) {
            if !missing.contains(&m) {
                missing.push(m);
            }
        }
        Ok(missing)
    }

    /// `decision.scales`' values: prior scale, joint scale, residual gate.
    pub fn scales(&self) -> [f32; 3] {
        self.scales
    }

    /// One score per option of `req` (in `req.options` order).
    pub fn scores(&self, req: &HeadRequest<'_>) -> Result<Vec<f32>, DecisionError> {
        let mut all = self.scores_batch(std::slice::from_ref(req))?;
        all.pop()
            .ok_or_else(|| DecisionError::Layout("no scores".into()))
    }

    /// One score per option of each of `reqs` (each in its `options` order), from one run of
    /// the head over all of them stacked: every weight is read once for the batch, and each
    /// request's attention sees only its own rows, so each request's scores are its scores
    /// alone (to the summation order of the products).
    pub fn scores_batch(&self, reqs: &[HeadRequest<'_>]) -> Result<Vec<Vec<f32>>, DecisionError> {
        let parts = reqs
            .iter()
            .map(|r| self.check(r))
            .collect::<Result<Vec<_>, _>>()?;
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let shape = HeadShape::total(&parts);
        let mut guard = self
            .prepared
            .lock()
            .map_err(|_| DecisionError::Layout("head state poisoned".into()))?;
        let (cache, clock) = &mut *guard;
        *clock += 1;
        let now = *clock;
        if !cache.contains_key(&parts) {
            while cache.len() >= MAX_EXECUTORS {
                let oldest = cache
                    .iter()
                    .min_by_key(|(_, p)| p.tick)
                    .map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => cache.remove(&k),
                    None => break,
                };
            }
            let p = self.prepare(&parts)?;
            cache.insert(parts.clone(), p);
        }
        let p = cache
            .get_mut(&parts)
            .ok_or_else(|| DecisionError::Layout("head cache lost an entry".into()))?;
        p.tick = now;
        let device = &self.home.device;
        write_inputs(device, p, reqs, shape)?;
        let batch = BatchInputs {
            tokens: reqs.iter().flat_map(|r| r.tokens.iter().copied()).collect(),
            ..BatchInputs::default()
        };
        p.exec.run(device, &batch)?;
        let scores = p.exec.read_f32(device, "scores")?;
        tracing::debug!(
            "decision head on {}: {} requests, {} rows, {} questions, {} options in {:.3} ms",
            device.plugin,
            reqs.len(),
            shape.n_rows,
            shape.n_questions,
            shape.n_options,
            started.elapsed().as_secs_f64() * 1e3
        );
        let mut out = Vec::with_capacity(reqs.len());
        let mut at = 0;
        for r in reqs {
            let n = r.options.len();
            let s = scores
                .get(at..at + n)
                .ok_or_else(|| DecisionError::Layout("the head gave too few scores".into()))?;
            out.push(s.to_vec());
            at += n;
        }
        Ok(out)
    }

    /// The head's graph for requests of the counts `parts`, stacked.
    pub fn graph(&self, parts: &[HeadShape]) -> Result<Graph, DecisionError> {
        let m = HeadModel {
            hp: &self.hp,
            w: &self.weights,
            output: &self.output,
            inputs_base: self.bound.len() as u32,
            scales: self.scales,
        };
        head_graph::build_batch(&m, parts).map_err(|e| DecisionError::Layout(e.to_string()))
    }

    /// The head graph for requests of the counts `parts`, prepared with a buffer for its inputs.
    fn prepare(&self, parts: &[HeadShape]) -> Result<Prepared, DecisionError> {
        let shape = HeadShape::total(parts);
        let graph = self.graph(parts)?;
        let device = &self.home.device;
        let mut offsets = Vec::new();
        let mut total = 0u64;
        let mut layouts = Vec::new();
        for input in HEAD_INPUTS {
            let (dtype, ne) = input.layout(&self.hp, shape);
            let bytes = ne.iter().product::<u64>() * 4;
            offsets.push(total);
            layouts.push((dtype, ne, total));
            total += bytes.div_ceil(64) * 64;
        }
        let inputs = device
            .alloc(total)
            .map_err(device_err("allocating the head's inputs"))?;
        let mut bound = self.bound.clone();
        for (dtype, ne, offset) in layouts {
            let nb = TensorRef::contiguous_strides(dtype, ne)
                .ok_or_else(|| DecisionError::Layout(format!("no layout for an input {ne:?}")))?;
            bound.push(TensorRef {
                buffer: inputs.handle,
                offset,
                dtype,
                ne,
                nb,
            });
        }
        let batch = BatchShape {
            n_rows: shape.n_rows,
            n_outputs: shape.n_options,
            kind: GraphKind::Main,
        };
        let bind = Bindings {
            weights: &bound,
            state: &[],
            tier: None,
            row_states: &[],
            ngram: None,
        };
        let exec = Executor::prepare(device, batch, &graph, &bind, false, ArenaSource::Own)?;
        // The inputs of ones are the same for every run: written once.
        for (input, n) in [
            (HeadInput::OnesEmbd, self.hp.n_embd),
            (HeadInput::OnesWidth, self.hp.width),
        ] {
            let ones = vec![1f32; n as usize];
            device
                .write(&inputs, offsets[input as usize], f32_bytes(&ones))
                .map_err(device_err("writing the head's inputs"))?;
        }
        Ok(Prepared {
            exec,
            inputs,
            offsets,
            tick: 0,
        })
    }

    /// The request's shape, once its layout is checked.
    fn check(&self, req: &HeadRequest<'_>) -> Result<HeadShape, DecisionError> {
        let e = self.hp.n_embd as usize;
        let rows = req.tokens.len();
        let bad = |m: String| Err(DecisionError::Layout(m));
        if rows == 0 || req.hidden.len() != rows * e {
            return bad(format!(
                "{} hidden values for {rows} rows of {e}",
                req.hidden.len()
            ));
        }
        if req.questions.is_empty() || req.options.is_empty() {
            return bad("a decision needs a question and an option".into());
        }
        let in_prompt = |s: u32, t: u32| s < t && t as usize <= rows;
        for q in req.questions {
            if !in_prompt(q.start, q.end) || q.kind > 2 {
                return bad(format!("question span {q:?} in a prompt of {rows} rows"));
            }
        }
        let mut has_option = vec![false; req.questions.len()];
        for o in req.options {
            if !in_prompt(o.start, o.end) || o.question as usize >= req.questions.len() {
                return bad(format!("option span {o:?} in a prompt of {rows} rows"));
            }
            has_option[o.question as usize] = true;
        }
        if let Some(q) = has_option.iter().position(|h| !h) {
            return bad(format!("question {q} has no option"));
        }
        let count = |n: usize| u32::try_from(n).map_err(|_| DecisionError::Layout(format!("{n}")));
        Ok(HeadShape {
            n_rows: count(rows)?,
            n_questions: count(req.questions.len())?,
            n_options: count(req.options.len())?,
        })
    }
}

/// Writes the per-run inputs of `reqs` stacked into `p`'s input buffer: each request's rows,
/// questions and options after the previous one's, its spans and owners moved with them. The
/// rows go from each request's slice straight to the buffer (a prompt of Clef-Flash's width
/// holds 16 KiB of them a row: no staging copy).
fn write_inputs(
    device: &Device,
    p: &Prepared,
    reqs: &[HeadRequest<'_>],
    shape: HeadShape,
) -> Result<(), DecisionError> {
    let write = |input: HeadInput, at: u64, bytes: &[u8]| {
        device
            .write(&p.inputs, p.offsets[input as usize] + at, bytes)
            .map_err(device_err("writing the head's inputs"))
    };
    let (nq, no) = (shape.n_questions as usize, shape.n_options as usize);
    let mut mask = vec![f32::NEG_INFINITY; no * nq];
    let (mut q_spans, mut o_spans) = (Vec::new(), Vec::new());
    let (mut types, mut owners, mut last) = (Vec::new(), Vec::new(), Vec::new());
    let (mut row0, mut q0, mut at) = (0i32, 0i32, 0u64);
    for r in reqs {
        let rows = f32_bytes(r.hidden);
        write(HeadInput::Hidden, at, rows)?;
        at += rows.len() as u64;
        let n_rows = r.tokens.len() as i32;
        for q in r.questions {
            q_spans.extend([row0 + q.start as i32, row0 + q.end as i32]);
            types.push(q.kind as i32);
            last.push(row0 + n_rows - 1);
        }
        for o in r.options {
            let (option, question) = (owners.len(), q0 + o.question as i32);
            o_spans.extend([row0 + o.start as i32, row0 + o.end as i32]);
            mask[question as usize * no + option] = 0.0;
            owners.push(question);
        }
        row0 += n_rows;
        q0 += r.questions.len() as i32;
    }
    write(HeadInput::QuestionSpans, 0, i32_bytes(&q_spans))?;
    write(HeadInput::OptionSpans, 0, i32_bytes(&o_spans))?;
    write(HeadInput::QuestionTypes, 0, i32_bytes(&types))?;
    write(HeadInput::OptionOwners, 0, i32_bytes(&owners))?;
    write(HeadInput::OptionMask, 0, f32_bytes(&mask))?;
    write(HeadInput::QuestionLastRows, 0, i32_bytes(&last))
}

/// The three values of an f32 `decision.scales` tensor.
fn read_scales(device: &Device, r: &TensorRef) -> Result<[f32; 3], DecisionError> {
    if r.dtype != DType::F32 || r.elements() != 3 {
        return Err(DecisionError::Load {
            source_name: "decision.scales".into(),
            message: format!("is {} {:?}, expected F32 [3]", r.dtype, r.ne),
        });
    }
    let mut bytes = [0u8; 12];
    device
        .read(r.buffer, r.offset, &mut bytes)
        .map_err(device_err("reading decision.scales"))?;
    let v = |i: usize| f32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    Ok([v(0), v(4), v(8)])
}
