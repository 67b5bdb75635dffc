//! Decision heads: Clef's joint schema head, which reads a backbone's final-norm rows and scores
//! every option of every question of a request in one pass. Compile-time helpers shared by the
//! model plugin that declares the head's weights in a `clef` file and by the host that runs the
//! head (from that file, or from a `joint_head.safetensors` beside a `qwen35` file): the head's
//! hyperparameters ([`HeadHParams`]), its weights by GGUF name ([`weights`]) and its graph
//! ([`graph`]).
//!
//! Facts from llama.cpp b11434 (`src/models/clef.cpp`, `conversion/clef.py`): keys
//! `{arch}.decision.{type,routing_block_count,block_count,head_count}` and
//! `{arch}.attention.layer_norm_epsilon`; the head's blocks are `dec.blk.N`, routing blocks first.

pub mod graph;
pub mod weights;

use crate::hparams::ArchKeys;
use crate::meta::ModelFileView;
use crate::PluginError;

/// `{arch}.decision.type` of a joint schema head.
pub const DECISION_TYPE_CLEF: &str = "clef";

/// The layer-norm ε torch's `nn.LayerNorm` uses, which the safetensors form does not record.
pub const TORCH_LAYER_NORM_EPS: f32 = 1e-5;

/// The tensor whose extents give the head's width (`[n_embd, width]`).
pub const WIDTH_TENSOR: &str = "decision.proj_memory.weight";

/// The tensor whose extents give the head's FFN width (`[width, n_ff]`).
pub const FFN_TENSOR: &str = "dec.blk.0.ffn_up.weight";

/// A joint schema head's sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadHParams {
    /// The backbone's hidden width (rows the head reads).
    pub n_embd: u32,
    /// The head's width.
    pub width: u32,
    /// Attention heads of every head block (a divisor of `width`).
    pub n_head: u32,
    /// Routing blocks (options reading the prompt), `dec.blk.0..n_routing`.
    pub n_routing: u32,
    /// Decoder blocks (questions reading each other and the prompt), after the routing blocks.
    pub n_joint: u32,
    /// FFN width of every head block.
    pub n_ff: u32,
    /// Layer-norm ε of every head norm.
    pub eps: f32,
}

impl HeadHParams {
    /// Reads the head of a file of architecture `keys`' arch: `None` when the file has no
    /// `decision.type`; a named error for another decision type, a missing or inconsistent key.
    pub fn read(keys: &ArchKeys<'_>, n_embd: u32) -> Result<Option<Self>, PluginError> {
        let Some(kind) = keys.get("decision.type") else {
            return Ok(None);
        };
        let kind = kind.as_str().unwrap_or("");
        if kind != DECISION_TYPE_CLEF {
            return Err(keys.bad(
                "decision.type",
                format!("`{kind}`: this build runs `{DECISION_TYPE_CLEF}` heads only"),
            ));
        }
        let hp = Self::from_counts(
            keys.view(),
            n_embd,
            keys.u32("decision.routing_block_count")?,
            keys.u32("decision.block_count")?,
            keys.positive("decision.head_count")?,
            keys.f32("attention.layer_norm_epsilon")?,
        )
        .map_err(|m| keys.bad("decision.head_count", m))?;
        Ok(Some(hp))
    }

    /// The head with these block and head counts, its widths read from the tensors of `view`
    /// ([`WIDTH_TENSOR`], [`FFN_TENSOR`]); the message says what does not fit.
    pub fn from_counts(
        view: &ModelFileView,
        n_embd: u32,
        n_routing: u32,
        n_joint: u32,
        n_head: u32,
        eps: f32,
    ) -> Result<Self, String> {
        let extent = |name: &str| -> Result<u32, String> {
            let t = view
                .tensor(name)
                .ok_or_else(|| format!("the head has no tensor `{name}`"))?;
            u32::try_from(t.ne[1]).map_err(|_| format!("`{name}` is {:?}", t.ne))
        };
        const MAX_BLOCKS: u32 = 512;
        if n_routing > MAX_BLOCKS || n_joint > MAX_BLOCKS || n_routing + n_joint == 0 {
            return Err(format!(
                "{n_routing} routing and {n_joint} decoder blocks (1 to {MAX_BLOCKS} each)"
            ));
        }
        let width = extent(WIDTH_TENSOR)?;
        if n_head == 0 || width == 0 || !width.is_multiple_of(n_head) {
            return Err(format!(
                "{n_head} heads do not divide the head's width {width}"
            ));
        }
        if !(eps > 0.0 && eps < 1.0) {
            return Err(format!("layer-norm epsilon {eps}"));
        }
        Ok(HeadHParams {
            n_embd,
            width,
            n_head,
            n_routing,
            n_joint,
            n_ff: extent(FFN_TENSOR)?,
            eps,
        })
    }

    /// Blocks in all, routing blocks first.
    pub fn n_blocks(&self) -> u32 {
        self.n_routing + self.n_joint
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> u32 {
        self.width / self.n_head
    }
}

/// The `systemone` chat template of a Clef file (`tokenizer.chat_template.systemone`), as
/// llama.cpp's converter writes it into a `clef` GGUF: it renders the prompt from `state`,
/// `questions` (each `id`, `type`, `instructions` and `options` of `key` and `description`),
/// `images` and the three markers `sep` (between pieces tokenized one at a time),
/// `mark_question` and `mark_option` (where a question's or an option's span opens). Used for
/// synthetic `clef` files and for a `qwen35` file served with a head file, which carries none.
pub const SYSTEMONE_TEMPLATE: &str = concat!(
    "{{ \"<|im_start|>system\\nRead the complete state and schema. Decide every field jointly. ",
    "Each answer must be exactly one of that field's allowed options.<|im_end|>\\n",
    "<|im_start|>user\\nSTATE:\\n\" }}",
    "{% if images %}{{ sep }}{% for image in images %}{{ image }}{% endfor %}{{ \"\\n\" }}{% endif %}",
    "{{ sep }}{{ state if state is string else state | tojson(separators=[',', ':']) }}",
    "{{ sep }}{{ \"\\n\\nSCHEMA FIELDS:\\n\" }}",
    "{% for q in questions %}",
    "{{ sep }}{{ \"\\nFIELD \" }}{{ loop.index }}{{ \"\\nID: \" }}{{ q.id }}",
    "{{ \"\\nTYPE: \" }}{{ q.type }}{{ \"\\nINSTRUCTION: \" }}",
    "{{ sep }}{{ mark_question }}",
    "{{ q.instructions if q.instructions is string else q.instructions | tojson(separators=[',', ':']) }}",
    "{{ sep }}{{ \"\\nALLOWED OPTIONS:\\n\" }}",
    "{% for o in q.options %}",
    "{{ sep }}{{ \"OPTION \" }}{{ loop.index }}{{ \": \" }}",
    "{{ sep }}{{ mark_option }}",
    "{% set d = o.description %}",
    "{% if q.type == 'noul' and d is none %}",
    "{% set d = 'The proposition is true or the answer is yes.' if o.key == 'true' ",
    "else 'The proposition is false or the answer is no.' %}",
    "{% endif %}",
    "{{ ({'option_id': o.key} if d is none else {'description': d, 'option_id': o.key}) ",
    "| tojson(separators=[',', ':']) }}",
    "{{ sep }}{{ \"\\n\" }}",
    "{% endfor %}",
    "{{ sep }}{{ \"END FIELD\\n\" }}",
    "{% endfor %}",
    "{{ sep }}{{ \"\\n<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n",
    "JOINT SCHEMA DECISIONS:\" }}",
);
