//! Expert placement flags shared by `serve`, `run`, `bench` and `plan`, spelled as llama.cpp
//! spells them (`-cmoe`, `-ncmoe N`, `-ot REGEX=BUFFER`, `--mlock`, the card flags `-dev`,
//! `-ts`, `-mg`, `-sm`), plus budgets that emulate smaller cards or a smaller host.

use clap::Args;

use bloomery_tiering::plan::{parse_size, TierRequest};

use super::cards::{CardFlags, Syntax};

/// Where routed experts go.
#[derive(Args, Debug, Clone, Default)]
pub struct PlacementArgs {
    /// Every placement flag but `-ncmoe`.
    #[command(flatten)]
    pub experts: ExpertFlags,
    /// Keep the MoE experts of the first N layers in host RAM.
    #[arg(long = "n-cpu-moe", env = "LLAMA_ARG_N_CPU_MOE")]
    pub n_cpu_moe: Option<u32>,
}

impl PlacementArgs {
    /// The request these flags make; a malformed size or override is refused by name.
    pub fn request(&self) -> anyhow::Result<TierRequest> {
        self.experts.request(self.n_cpu_moe, Syntax::Common)
    }
}

/// The placement flags but `-ncmoe` (which `bench` takes as a list, as llama-bench does).
#[derive(Args, Debug, Clone, Default)]
pub struct ExpertFlags {
    /// Keep every MoE expert in host RAM (computed there by the CPU).
    #[arg(long = "cpu-moe", env = "LLAMA_ARG_CPU_MOE")]
    pub cpu_moe: bool,
    /// Tensor placement overrides `REGEX=BUFFER,...` (BUFFER: CPU, CUDA0 or GPU); only routed
    /// expert stacks may go to the CPU.
    #[arg(long = "override-tensor", env = "LLAMA_ARG_OVERRIDE_TENSOR")]
    pub override_tensor: Option<String>,
    /// Card memory to plan with instead of its free memory (e.g. `6.3G`; `A,B` for each card in
    /// use, one value for every card): what bloomery
    /// allocates (weights, KV, scratch, staging). The driver's context and the kernel modules
    /// come on top (about 530 MiB on an H200 with driver 580), less the planned scratch a run
    /// leaves unused: nvidia-smi peaked at 2,337 MiB for a plan of 1.86 GiB (30B-A3B, `-cmoe
    /// --gpu-budget 1950M`).
    #[arg(long = "gpu-budget", value_name = "SIZE[,SIZE..]")]
    pub gpu_budget: Option<String>,
    /// Cards to use (`CUDA0,CUDA1`; default: every card found). Routed experts are not run on a
    /// card after the main one yet: naming several is refused at load (`plan` shows that
    /// placement).
    #[arg(long = "device", env = "LLAMA_ARG_DEVICE", value_name = "DEV1,DEV2,..")]
    pub device: Option<String>,
    /// Each card's share of the routed experts placed on cards (`3,1`), in the order of the
    /// cards in use (default: the main card fills first, then the others).
    #[arg(
        long = "tensor-split",
        env = "LLAMA_ARG_TENSOR_SPLIT",
        value_name = "N0,N1,.."
    )]
    pub tensor_split: Option<String>,
    /// The main card, by its position among the cards in use: it holds the dense weights, the
    /// KV cache and the hottest experts [default: 0].
    #[arg(long = "main-gpu", env = "LLAMA_ARG_MAIN_GPU", value_name = "INDEX")]
    pub main_gpu: Option<String>,
    /// `layer` (the default): routed experts across the cards in use (bloomery splits experts,
    /// not layers); `none`: the main card only; `row` and `tensor` are refused.
    #[arg(
        long = "split-mode",
        env = "LLAMA_ARG_SPLIT_MODE",
        value_name = "none|layer"
    )]
    pub split_mode: Option<String>,
    /// Host RAM to plan with instead of MemAvailable (e.g. `8G`).
    #[arg(long = "host-budget", value_name = "SIZE")]
    pub host_budget: Option<String>,
    /// Keep the planned placement: do not move often-called experts onto the card while running
    /// (for repeatable output).
    #[arg(long = "no-residency")]
    pub no_residency: bool,
    /// When host experts are read from disk (host budget below them): while the CPU computes a
    /// layer, read ahead each row's N likeliest experts of the next layer (the card applies the
    /// next layer's router to this layer's input). Pays only when the guesses are nearly all
    /// right or the drive has bandwidth to spare: bench and run report how many were used.
    #[arg(long = "disk-prefetch", value_name = "N", default_value_t = 0)]
    pub disk_prefetch: u32,
    /// Of every k host experts a decode pass routes to in a layer (k: experts per token), how
    /// many the card computes by reading their weights in place over PCIe while the CPU computes
    /// the rest (default: the first one-row decode passes try 2 and 3 of 8 and keep the faster,
    /// logged once; give N for repeatable output across runs; 0: the CPU computes them all).
    #[arg(long = "bus-experts", value_name = "N")]
    pub bus_experts: Option<u32>,
    /// Leave the prompts' staging sets empty between prompts. By default each holds one layer
    /// of host experts whole (the last layers a prompt streams), which decode then computes on
    /// the card: one or two layers fewer for the CPU, at no card memory cost.
    #[arg(long = "no-decode-staging")]
    pub no_decode_staging: bool,
    /// Lock in RAM at load what the host reads of the model (llama.cpp's `--mlock`): the whole
    /// file on the CPU; with a card, the host experts and token tables, never the experts the
    /// disk tier reads. Past `ulimit -l` (without CAP_IPC_LOCK) a warning says how much was
    /// locked.
    #[arg(long = "mlock", env = "LLAMA_ARG_MLOCK")]
    pub mlock: bool,
    /// Check every tensor's data at load as llama.cpp's `--check-tensors` does (no NaN or
    /// infinite value or block scale); a bad tensor is refused by name.
    #[arg(long = "check-tensors")]
    pub check_tensors: bool,
}

/// The most rows a prompt pass evaluates under llama-server's `-b` and `-ub`: the smaller, at
/// least one.
pub fn pass_rows(batch_size: u32, ubatch_size: u32) -> u32 {
    batch_size.min(ubatch_size).max(1)
}

impl ExpertFlags {
    /// The request these flags make with `-ncmoe` `n_cpu_moe`, the card flags read in
    /// `syntax`; a malformed size, override or card flag is refused by name.
    pub fn request(&self, n_cpu_moe: Option<u32>, syntax: Syntax) -> anyhow::Result<TierRequest> {
        let size = |flag: &str, v: &str| parse_size(v).map_err(|e| anyhow::anyhow!("{flag}: {e}"));
        let cards = CardFlags {
            device: self.device.as_deref(),
            tensor_split: self.tensor_split.as_deref(),
            main_gpu: self.main_gpu.as_deref(),
            split_mode: self.split_mode.as_deref(),
        }
        .request(syntax)
        .map_err(|e| anyhow::anyhow!(e))?;
        Ok(TierRequest {
            cpu_moe: self.cpu_moe,
            n_cpu_moe,
            overrides: match &self.override_tensor {
                Some(s) => TierRequest::parse_overrides(s).map_err(|e| anyhow::anyhow!(e))?,
                None => Vec::new(),
            },
            gpu_budgets: match &self.gpu_budget {
                None => Vec::new(),
                Some(v) => v
                    .split(',')
                    .map(|b| size("--gpu-budget", b))
                    .collect::<anyhow::Result<_>>()?,
            },
            cards,
            host_budget: self
                .host_budget
                .as_deref()
                .map(|v| size("--host-budget", v))
                .transpose()?,
            no_residency: self.no_residency,
            disk_prefetch: self.disk_prefetch,
            bus_experts: self.bus_experts,
            no_decode_staging: self.no_decode_staging,
            batch_rows: 0,
        })
    }
}
