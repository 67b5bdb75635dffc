//! Where the model comes from besides `-m`: a Hugging Face repository (`-hf`, `-hff`, `-hft`,
//! `--offline`) or a URL (`-mu`), with llama.cpp's spellings and environment twins (`serve`,
//! `run` and `bench`). [`crate::hub`] fetches what they name.

use std::path::{Path, PathBuf};

use clap::Args;

/// The model's source flags.
#[derive(Args, Clone, Debug, Default)]
pub struct HubArgs {
    /// A Hugging Face repository to fetch the model from, `<user>/<model>[:quant]` (`-hf`,
    /// `-hfr`): the quant is case-insensitive; without one, Q4_K_M, then Q8_0, then the repo's
    /// first GGUF. Files go to the Hugging Face cache (`HF_HOME`, `LLAMA_CACHE`); the endpoint is
    /// `MODEL_ENDPOINT` or `HF_ENDPOINT` (default https://huggingface.co/).
    #[arg(
        long = "hf-repo",
        value_name = "<user>/<model>[:quant]",
        env = "LLAMA_ARG_HF_REPO"
    )]
    pub hf_repo: Option<String>,
    /// The repository's file to load (`-hff`), instead of the one the quant picks.
    #[arg(long = "hf-file", value_name = "FILE", env = "LLAMA_ARG_HF_FILE")]
    pub hf_file: Option<String>,
    /// A Hugging Face access token (`-hft`; default: `HF_TOKEN`).
    #[arg(
        long = "hf-token",
        value_name = "TOKEN",
        env = "HF_TOKEN",
        hide_env_values = true
    )]
    pub hf_token: Option<String>,
    /// List the models in the Hugging Face cache and exit (`-cl`).
    #[arg(long = "cache-list")]
    pub cache_list: bool,
    /// Use cached downloads only: no network access.
    #[arg(long = "offline", env = "LLAMA_ARG_OFFLINE")]
    pub offline: bool,
    /// A URL to fetch the model from (`-mu`): to `-m`'s path when given, else to the download
    /// folder (`LLAMA_CACHE`, else `~/.cache/llama.cpp`).
    #[arg(
        long = "model-url",
        value_name = "MODEL_URL",
        env = "LLAMA_ARG_MODEL_URL"
    )]
    pub model_url: Option<String>,
}

impl HubArgs {
    /// `-cl`: prints the cached models as llama.cpp does (a count, then `N. user/model:TAG`).
    pub fn print_cache_list(&self) -> anyhow::Result<()> {
        let hub = crate::hub::cache::hub_dir(&|name: &str| std::env::var(name).ok())?;
        let models = crate::hub::cache::cached_models(&hub);
        println!("number of models in cache: {}", models.len());
        for (i, m) in models.iter().enumerate() {
            println!("{:4}. {m}", i + 1);
        }
        Ok(())
    }

    /// The model file to load: fetched (or found in the cache) when `-hf` or `-mu` names one,
    /// else `model` (`-m`), which must then be given.
    pub fn model_file(&self, model: Option<&Path>) -> anyhow::Result<PathBuf> {
        if let (Some(f), None) = (&self.hf_file, &self.hf_repo) {
            anyhow::bail!("-hff {f}: names a file of the -hf repository, and no -hf was given");
        }
        let env = |name: &str| std::env::var(name).ok();
        let fetch = crate::hub::Fetch {
            hf_file: self.hf_file.as_deref(),
            token: self.hf_token.as_deref(),
            offline: self.offline,
        };
        if let Some(spec) = &self.hf_repo {
            return crate::hub::from_repo(&fetch, spec, &env);
        }
        if let Some(url) = &self.model_url {
            return crate::hub::from_url(&fetch, url, model, &env);
        }
        model.map(Path::to_path_buf).ok_or_else(|| {
            anyhow::anyhow!("no model: give -m FILE, -hf <user>/<model>[:quant] or -mu URL")
        })
    }

    /// The name the server lists a model under when it has no alias: the `-hf` value as given
    /// (llama-server's `get_name`), or None to use the model's path.
    pub fn listed_name(&self) -> Option<&str> {
        self.hf_repo.as_deref()
    }
}
