//! Model plugins: an architecture family's hyperparameters, weights by role, state, and graphs.
//!
//! The plugin declares; the host owns. A plugin reads the file's metadata once ([`ModelFileView`]),
//! declares every weight by role and every per-layer state buffer, and builds forward graphs on
//! request. The host maps the weights, allocates and snapshots the state, schedules, and runs.

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RBox, ROption, RResult, RString, RVec};
use abi_stable::{package_version_strings, sabi_trait, StableAbi};

use crate::graph::{BatchShape, Graph};
use crate::meta::{MetaEntry, ModelFileView};
use crate::ngram::NgramSpec;
use crate::{DType, PluginError};

/// What a weight is for; the tiering service moves routed experts, synth picks types by class.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightClass {
    /// Token embedding table.
    Embedding = 0,
    /// Attention projections.
    Attention = 1,
    /// Dense FFN projections.
    Ffn = 2,
    /// Routed expert stacks.
    Experts = 3,
    /// Shared expert projections.
    SharedExpert = 4,
    /// Norm weights and biases.
    Norm = 5,
    /// Router (expert gate) weights and biases.
    Router = 6,
    /// Output head.
    Output = 7,
    /// Linear-attention and other state-space parameters.
    Recurrent = 8,
    /// Anything else (hyper-connection mixers, decision heads).
    Other = 9,
    /// An integer id table (DeepSeek-V4's hash-routing table `ffn_gate_tid2eid`): stored as
    /// I32; in a synthetic file each row of `ne0` values holds distinct ids drawn from the
    /// tensor's `[range lo, range hi)`.
    Index = 10,
    /// A hashed n-gram table (Qwen3.8's PLE `per_layer_token_embd`, DeepSeek-V4.1's
    /// `engram_embd`): never placed on a card. The host gathers a pass's rows from the file
    /// (mapped, or read from disk when host RAM cannot hold it) into
    /// [`crate::graph::BatchInput::NgramEmbd`]; a graph reads that input, never the weight.
    NgramTable = 11,
}

/// Where a weight sits in the model.
#[repr(C, u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightRole {
    /// Outside the layers (embeddings, output norm, head).
    Global,
    /// Belongs to one layer.
    Layer {
        /// Layer index.
        layer: u32,
    },
    /// A stack of routed experts of one layer, `[.., .., n_expert]`: expert `e` is the slice at
    /// index `e` of the last dimension.
    RoutedExperts {
        /// Layer index.
        layer: u32,
        /// Experts in the stack.
        n_expert: u32,
    },
    /// A multi-token-prediction layer.
    Mtp {
        /// Layer index.
        layer: u32,
    },
}

/// A weight the model uses, by its GGUF name.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct WeightDecl {
    /// GGUF tensor name.
    pub name: RString,
    /// Role.
    pub role: WeightRole,
    /// Class.
    pub class: WeightClass,
}

/// A per-layer state buffer the host allocates for every sequence slot.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// Key rows, one per position (`row_elems` = dk·n_head_kv). Type chosen by the host (`-ctk`).
    Keys = 0,
    /// Value rows, one per position (`row_elems` = dv·n_head_kv). Type chosen by the host (`-ctv`).
    Values = 1,
    /// Latent rows serving as both keys and values (MLA, DeepSeek-V4), one per position.
    Latent = 2,
    /// Pooled key rows, one per `block` positions (block-sparse indexers). A row is written
    /// whole, from per-position rows, by the pass that completes its block, and read only once
    /// its block is complete, so the host rewinds it to any position as it does keys: a row
    /// that refused drafted tokens completed is written again when its block completes anew.
    PooledKeys = 3,
    /// Convolution history, `row_elems` f32 per sequence.
    Conv = 4,
    /// Recurrent matrix state, `row_elems` f32 per sequence (not addressable by position: the
    /// prompt cache keeps checkpoints of it).
    Recurrent = 5,
}

/// One state buffer.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct StateDecl {
    /// Name for logs and dumps, e.g. `cache_k_l3`.
    pub name: RString,
    /// Layer.
    pub layer: u32,
    /// Kind.
    pub kind: StateKind,
    /// Elements per row (per position for positional kinds, per sequence otherwise).
    pub row_elems: u64,
    /// Positions kept for positional kinds: 0 = the whole context, else a sliding window.
    pub window: u32,
    /// Positions per pooled row (`PooledKeys` only; else 1).
    pub block: u32,
}

/// The hyperparameters the host shows and plans with (a common summary; the plugin keeps its own
/// typed copy of everything).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Default)]
pub struct HParams {
    /// Layers (without MTP layers).
    pub n_layer: u32,
    /// Hidden width.
    pub n_embd: u32,
    /// Vocabulary rows of the output head.
    pub n_vocab: u32,
    /// Training context.
    pub n_ctx_train: u32,
    /// Attention heads.
    pub n_head: u32,
    /// Key/value heads (of attention layers).
    pub n_head_kv: u32,
    /// Key head dim.
    pub head_dim: u32,
    /// Routed experts per MoE layer (0 for dense models).
    pub n_expert: u32,
    /// Experts per token.
    pub n_expert_used: u32,
    /// Expert FFN width.
    pub n_ff_exp: u32,
    /// Dense FFN width.
    pub n_ff: u32,
}

/// What the host must know before touching a weight.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Default)]
pub struct ModelCaps {
    /// The state holds recurrent parts: the prompt cache restores checkpoints, not any prefix.
    pub recurrent: bool,
    /// MTP draft layers present in the file.
    pub n_mtp_layers: u32,
    /// Longest context the model supports.
    pub max_context: u64,
}

impl ModelCaps {
    /// The capabilities of a model whose state is only K/V rows (any prefix can be restored), no
    /// MTP layers.
    pub fn kv_only(max_context: u64) -> ModelCaps {
        ModelCaps {
            recurrent: false,
            n_mtp_layers: 0,
            max_context,
        }
    }
}

/// Everything the plugin declares about a loaded model.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Default)]
pub struct ModelSpec {
    /// `general.architecture`.
    pub architecture: RString,
    /// Hyperparameter summary.
    pub hparams: HParams,
    /// Every weight, by role.
    pub weights: RVec<WeightDecl>,
    /// Every state buffer.
    pub state: RVec<StateDecl>,
    /// Capabilities.
    pub caps: ModelCaps,
    /// The hashed n-gram table's row-id constants, when a graph reads
    /// [`crate::graph::BatchInput::NgramRows`] (the host fills that input with them).
    pub ngram: ROption<NgramSpec>,
}

/// A loaded model: its spec and a graph builder.
#[sabi_trait]
pub trait ModelInstance: Send + Sync {
    /// The declarations.
    fn spec(&self) -> ModelSpec;

    /// Builds the forward graph for a batch shape.
    #[sabi(last_prefix_field)]
    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError>;
}

/// A boxed [`ModelInstance`] trait object.
pub type ModelInstanceBox = ModelInstance_TO<'static, RBox<()>>;

/// A synthetic-model shape a plugin can describe for `bloomery synth`: metadata and tensors.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct SynthPreset {
    /// Preset name (`tiny`, `30b-a3b`).
    pub name: RString,
    /// One line describing it.
    pub description: RString,
    /// Metadata to write (vocabulary keys are added by the host).
    pub metadata: RVec<MetaEntry>,
    /// Tensors to write: name, class and shape.
    pub tensors: RVec<SynthTensor>,
}

/// One tensor of a [`SynthPreset`].
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct SynthTensor {
    /// GGUF name.
    pub name: RString,
    /// Class (the host chooses the type per class).
    pub class: WeightClass,
    /// Dimensions used.
    pub n_dims: u32,
    /// Extents.
    pub ne: [u64; 4],
    /// Float values are drawn uniformly from `[lo, hi]`; `lo == hi` leaves the range to the
    /// host's default for the class. Quantized types ignore it.
    pub range: [f32; 2],
}

impl SynthTensor {
    /// A tensor of 1 to 4 dimensions (`ne` ne0 first).
    pub fn new(name: String, class: WeightClass, ne: &[u64]) -> SynthTensor {
        let mut full = [1u64; 4];
        let n = ne.len().min(4);
        full[..n].copy_from_slice(&ne[..n]);
        SynthTensor {
            name: name.into(),
            class,
            n_dims: n as u32,
            ne: full,
            range: [0.0, 0.0],
        }
    }

    /// The type a synthetic file stores a tensor of `class` in before the host picks its quant
    /// types: I32 for an id table, else F32.
    pub fn dtype_of(class: WeightClass) -> DType {
        match class {
            WeightClass::Index => DType::I32,
            _ => DType::F32,
        }
    }

    /// The same tensor with float values drawn from `[lo, hi]` (decay rates that must stay
    /// negative, biases of a given sign).
    pub fn with_range(mut self, lo: f32, hi: f32) -> SynthTensor {
        self.range = [lo, hi];
        self
    }
}

/// The root module of a model plugin.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = ModelPluginRef)))]
#[sabi(missing_field(option))]
pub struct ModelPlugin {
    /// [`crate::ABI_VERSION`] as the plugin was built.
    pub abi_version: extern "C" fn() -> u32,
    /// The plugin's name (`qwen3moe`).
    pub name: extern "C" fn() -> RString,
    /// Every `general.architecture` string it serves, aliases included.
    pub architectures: extern "C" fn() -> RVec<RString>,
    /// Synthetic-model presets.
    pub synth_presets: extern "C" fn() -> RVec<SynthPreset>,
    /// Reads a model file's metadata and tensor table; fails with a named error on a missing key
    /// or tensor.
    #[sabi(last_prefix_field)]
    pub load: extern "C" fn(&ModelFileView) -> RResult<ModelInstanceBox, PluginError>,
}

impl RootModule for ModelPluginRef {
    abi_stable::declare_root_module_statics! {ModelPluginRef}
    const BASE_NAME: &'static str = "bloomery_model";
    const NAME: &'static str = "bloomery model plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
