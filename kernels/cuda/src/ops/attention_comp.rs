//! DeepSeek-V4's second key source of attention's selection form (`cu/attn_comp.cuh`): the
//! compressed rows beside the window cache (`AttentionParams::comp`), every visible one or, with
//! `comp_selected`, the listed ones. A list launch writes each row's count of compressed rows
//! (and, with a list, its sorted and deduplicated rows) into the scratch; the attention launch
//! reads them after the row's window, in the same softmax.

use bloomery_plugin_api::op::AttentionParams;
use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::LaunchConfig;

use super::{driver_err, f32_only, Addr, Launcher, Src};

/// Threads per block of the list kernel (`SEL_THREADS`).
const LIST_THREADS: u32 = 256;

/// The compressed rows of a call: the f32 cache `[dk · n_head_kv, len, n_slots]`, its ratio and
/// the i32 lists `[n_ids, rows]` when the call has them.
pub(super) struct Comp<'c> {
    cache: &'c TensorRef,
    ids: Option<&'c TensorRef>,
    ratio: u32,
}

/// Where the list launch leaves a call's counts and lists (device addresses; 0 = none).
#[derive(Clone, Copy, Default)]
pub(super) struct CompLists {
    /// The rows' lists, `n_ids` a row (0 without lists).
    pub list: u64,
    /// Each row's count of compressed rows (−1 for a bad row).
    pub count: u64,
}

/// 256-byte multiples, as the scratch's parts are laid out.
fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(256) * 256
}

impl<'c> Comp<'c> {
    /// The compressed rows of a call of `rows` rows with K cache `kc`, from its sources after
    /// the q, caches, slots, positions, sinks and selection; `None` without `comp`.
    pub(super) fn of_call(
        src: Src<'_, 'c>,
        p: &AttentionParams,
        kc: &TensorRef,
        rows: u64,
    ) -> Result<Option<Comp<'c>>, PluginError> {
        if p.comp == 0 {
            if p.comp_selected {
                return Err(PluginError::invalid(
                    "Attention with comp_selected needs compressed rows (comp > 0)",
                ));
            }
            return Ok(None);
        }
        if !p.v_from_k {
            return Err(PluginError::invalid(
                "Attention over compressed rows needs values from the keys (v_from_k)",
            ));
        }
        let at = 5 + usize::from(p.sinks) + usize::from(p.selected);
        let cache = src(at)?;
        f32_only(cache, "Attention compressed rows")?;
        if cache.ne[0] != kc.ne[0] || cache.ne[2] != kc.ne[2] || cache.ne[3] != 1 {
            return Err(PluginError::invalid(format!(
                "Attention compressed rows {:?} beside a cache {:?} (want [width, len, n_slots])",
                cache.ne, kc.ne
            )));
        }
        let ids = if p.comp_selected {
            let t = src(at + 1)?;
            if t.dtype != DType::I32 || t.ne[0] == 0 || t.rows() != rows {
                return Err(PluginError::invalid(format!(
                    "Attention compressed-row lists {:?} of {} for {rows} rows (want i32 \
                     [n_list, rows])",
                    t.ne, t.dtype
                )));
            }
            Some(t)
        } else {
            None
        };
        Ok(Some(Comp {
            cache,
            ids,
            ratio: p.comp,
        }))
    }

    /// The most compressed rows a row may read (the run split's bound).
    pub(super) fn most(&self) -> u64 {
        let len = self.cache.ne[1];
        self.ids.map_or(len, |t| t.ne[0].min(len))
    }

    /// Entries of each row's list (0 without lists).
    fn n_ids(&self) -> u64 {
        self.ids.map_or(0, |t| t.ne[0])
    }

    /// Scratch bytes of the counts and lists of `rows` rows.
    pub(super) fn scratch_bytes(&self, rows: u64) -> u64 {
        aligned(rows * self.n_ids() * 4) + aligned(rows * 4)
    }

    /// Dynamic shared memory of the list kernel: a list padded to a power of two.
    pub(super) fn list_smem(&self) -> u64 {
        self.ids.map_or(0, |t| 4 * t.ne[0].next_power_of_two())
    }

    /// The compressed cache's device address and rows per slot.
    pub(super) fn cache(&self, addr: Addr<'_>) -> Result<(u64, i32), PluginError> {
        Ok((
            addr(self.cache, "compressed rows")?,
            self.cache.ne[1] as i32,
        ))
    }

    /// Entries of each row's list, as the kernels take it.
    pub(super) fn n_list(&self) -> i32 {
        self.n_ids() as i32
    }
}

impl Launcher {
    /// Launches `bl_attn_comp_list` for the `rows` rows of call `c` (slots `ps`, positions
    /// `pp`): their counts and lists into the scratch at `at` ([`Comp::scratch_bytes`]).
    pub(super) fn comp_lists(
        &self,
        addr: Addr<'_>,
        comp: &Comp<'_>,
        (ps, pp): (u64, u64),
        rows: u64,
        n_slots: u64,
        at: u64,
    ) -> Result<CompLists, PluginError> {
        let n_ids = comp.n_ids();
        let ids = comp
            .ids
            .map(|t| addr(t, "compressed-row lists"))
            .transpose()?;
        let lists = CompLists {
            list: if ids.is_some() { at } else { 0 },
            count: at + aligned(rows * n_ids * 4),
        };
        let (n_idsi, ratio, len, ns) = (
            n_ids as i32,
            comp.ratio as i32,
            comp.cache.ne[1] as i32,
            n_slots as i32,
        );
        let ids = ids.unwrap_or(0);
        let smem = comp.list_smem() as u32;
        let f = self.func_smem("bl_attn_comp_list", smem)?;
        let mut l = self.args(&f);
        l.arg(&ps)
            .arg(&pp)
            .arg(&ids)
            .arg(&n_idsi)
            .arg(&ratio)
            .arg(&len)
            .arg(&ns)
            .arg(&lists.list)
            .arg(&lists.count)
            .arg(&self.error_word);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (LIST_THREADS, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the arguments follow bl_attn_comp_list's parameters; the lists hold n_ids
        // entries a row (checked in `of_call`), the scratch at `at` the lists and counts of
        // `rows` rows (`scratch_bytes`); slots and positions are checked on the card; the
        // block's shared memory is the padded list, which the caller checked the card allows.
        unsafe { l.launch(cfg) }.map_err(driver_err("bl_attn_comp_list"))?;
        Ok(lists)
    }
}

/// The selection form's kernel over caches of type `t` with compressed rows.
pub(super) fn comp_kernel(t: DType) -> Option<&'static str> {
    match t {
        DType::F32 => Some("bl_attention_comp_f32"),
        DType::F16 => Some("bl_attention_comp_f16"),
        _ => None,
    }
}
